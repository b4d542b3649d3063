"""Which weights an arm ran: the SHA-256 of every weight file the engine loaded, hashed once per file version.

A 15 GB export is never re-hashed per arm: each digest is cached under ``$QUANTRACK_CACHE`` (else
``~/.cache/quantrack``) in ``sha256-cache.json``, keyed by the file's absolute path, size and modification time;
a file whose size or mtime changed is hashed again.

``model_sha256`` is the file's digest for one file, and for a folder (an HF export, safetensors shards) the
SHA-256 of its manifest (one ``<relative path> <sha256>`` line per weight file, sorted). ``source_sha256`` is the
model the arm's weights were made from: for a known-model reference (``smollm2:Q8_0``, requantized here) the pinned
digest of the file every type of it is derived from; for any other file it is not known (a GGUF's origin is not in
the file), and None. Two arms whose source digests are both known and differ are different models, and ``compare``
will not pair them unless told to.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
CACHE_NAME = "sha256-cache.json"


@dataclass(frozen=True)
class WeightsProvenance:
    model_sha256: str | None  # None: unknown (``reason`` says why)
    source_sha256: str | None
    source: str  # how source_sha256 was found
    files: list[dict[str, Any]] = field(default_factory=list)  # {"path", "bytes", "sha256"}
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cache_file() -> Path:
    from quantrack.models.gguf import default_cache_dir

    return default_cache_dir() / CACHE_NAME


def _read_cache(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def file_sha256(path: str | Path, *, cache: Path | None = None) -> str:
    """The file's SHA-256, from the cache when its size and mtime are unchanged."""
    from quantrack.models.gguf import sha256_file
    from quantrack.store.files import atomic_write_text

    p = Path(path).resolve()
    st = p.stat()
    cache = cache or _cache_file()
    data = _read_cache(cache)
    key = str(p)
    hit = data.get(key)
    if isinstance(hit, dict) and hit.get("bytes") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns \
            and isinstance(hit.get("sha256"), str):
        return str(hit["sha256"])
    digest = sha256_file(p)
    data = _read_cache(cache)  # re-read: another arm may have written meanwhile
    data[key] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache, json.dumps(data, indent=0, sort_keys=True))
    except OSError:
        pass  # a read-only cache costs a re-hash next time, never a wrong digest
    return digest


def weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


def weights_provenance(model: str | None, model_ref: str | None = None, *,
                       cache: Path | None = None) -> WeightsProvenance:
    """The digests of what ``model`` (a local GGUF file or a folder) holds; ``unknown`` with the reason when it is not
    a local file (a hub id the engine downloads itself, a server quantrack did not start)."""
    source_sha, source = _pinned_source(model_ref)
    if not model:
        return WeightsProvenance(None, source_sha, source, reason="no model path in the study")
    path = Path(os.path.expanduser(model))
    if not path.exists():
        return WeightsProvenance(None, source_sha, source,
                                 reason=f"{model} is not a local file or folder here (a hub id or a path on another "
                                        "machine): its weights were not hashed")
    files = weight_files(path)
    if not files:
        return WeightsProvenance(None, source_sha, source, reason=f"{model}: no weight file "
                                 f"({', '.join(WEIGHT_SUFFIXES)}) in it")
    rows: list[dict[str, Any]] = []
    try:
        for f in files:
            rows.append({"path": f.name if f == path else str(f.relative_to(path)), "bytes": f.stat().st_size,
                         "sha256": file_sha256(f, cache=cache)})
    except OSError as exc:
        return WeightsProvenance(None, source_sha, source, reason=f"{model}: could not be read ({exc.strerror})")
    if path.is_file():
        digest = str(rows[0]["sha256"])
    else:
        manifest = "".join(f"{r['path']} {r['sha256']}\n" for r in rows)
        digest = hashlib.sha256(manifest.encode()).hexdigest()
    return WeightsProvenance(digest, source_sha, source, rows)


_NO_SOURCE = "unknown: not a known-model reference, and a weight file does not record what it was made from"


def _pinned_source(model_ref: str | None) -> tuple[str | None, str]:
    if not model_ref:
        return None, _NO_SOURCE
    from quantrack.models.ref import parse_ref
    from quantrack.models.table import known_models

    parsed = parse_ref(model_ref)
    if parsed is None:
        return None, _NO_SOURCE
    entry = known_models().get(parsed[0])
    sha = getattr(entry, "sha256", None)
    if not sha:
        return None, _NO_SOURCE
    return str(sha), f"the pinned file of known model {parsed[0]!r} that {model_ref} is made from"
