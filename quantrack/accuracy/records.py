"""Per-question records: the artifact of an accuracy run (one JSON object per line).

A record is written the moment its question is answered, so an interrupted run loses at most
the questions in flight; ``--resume`` reads the file back and skips the finished ones. A
sidecar ``<records>.meta.json`` holds the settings the records were produced with, so a resume
with different settings (shots, max tokens, style ...) is refused instead of mixing runs.

The API key is never part of a record or of the sidecar.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Self

from quantrack.errors import BadInput

# Keys of the settings that must match for --resume to continue a file.
RESUME_KEYS = ("task", "order", "style", "num_shots", "max_tokens", "temperature", "seed", "data_sha256", "fewshot_sampler",
               "fewshot_seed")
# What a sidecar written before a key existed meant by its absence (exemplars were always train rows 0..k-1).
LEGACY_META = {"fewshot_sampler": "first_n", "fewshot_seed": None, "order": "natural"}


@dataclass
class QuestionRecord:
    """One GSM8K question as asked and scored. ``error`` set means the server failed:
    then ``response``/``extracted``/``correct`` are ``None`` (not wrong, not dropped)."""

    id: Any  # GSM8K: index in the split (int); a task file: the item's own id (str); checked in from_dict
    prompt_sha256: str | None  # sha256 of the UTF-8 prompt (lm-eval's prompt_hash is the same hash)
    response: str | None
    extracted: Any  # vllm style: int; lm-eval style: the strict-match string; None = invalid/none
    gold: Any
    correct: bool | None
    error: str | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    style: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. lm-eval flexible-extract
    fewshot_ids: list[int] | None = None  # train-split indices of the exemplars, in prompt order (None: unknown)

    @property
    def answered(self) -> bool:
        return self.error is None and self.correct is not None

    @property
    def invalid(self) -> bool:
        return self.answered and self.extracted is None

    def to_json(self) -> str:
        data = asdict(self)
        if not data["extra"]:
            del data["extra"]
        if data["fewshot_ids"] is None:
            del data["fewshot_ids"]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> QuestionRecord:
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("id", "correct") if k not in data]
        if missing:
            raise BadInput(f"{where}: not a quantrack question record (missing {', '.join(missing)})")
        kwargs = {k: v for k, v in data.items() if k in known}
        rec = cls(**{"prompt_sha256": None, "response": None, "extracted": None, "gold": None, **kwargs})
        if not (isinstance(rec.id, (int, str)) and not isinstance(rec.id, bool)) or rec.id == "":
            raise BadInput(f"{where}: record id must be an integer or a non-empty string, got {rec.id!r}")
        if rec.correct is not None and not isinstance(rec.correct, bool):
            raise BadInput(f"{where}: 'correct' must be true, false or null, got {rec.correct!r}")
        ids = rec.fewshot_ids
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                   for i in ids)):
            raise BadInput(f"{where}: 'fewshot_ids' must be a list of integers, got {ids!r}")
        return rec


def meta_path(records_path: Path) -> Path:
    return records_path.with_name(records_path.name + ".meta.json")


def load_records(path: Path) -> dict[Any, QuestionRecord]:
    """Read a records file; the last record for an id wins (a resumed retry replaces an error).

    A torn last line (the run was killed mid-write) is ignored; a bad line elsewhere is an error.
    """
    if not path.is_file():
        raise BadInput(f"records file not found: {path}")
    out: dict[Any, QuestionRecord] = {}
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise BadInput(f"records file {path}: not a text file (not UTF-8): expected JSON lines") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines):  # torn tail: no newline after it
                break
            raise BadInput(f"{path}:{no}: not valid JSON") from None
        if not isinstance(data, dict):
            raise BadInput(f"{path}:{no}: expected a JSON object per line")
        rec = QuestionRecord.from_dict(data, f"{path}:{no}")
        if out and type(rec.id) is not type(next(iter(out))):
            raise BadInput(f"{path}:{no}: record id {rec.id!r} mixes integer (GSM8K) and string (task file) ids")
        out[rec.id] = rec
    return out


def read_meta(records_path: Path) -> dict[str, Any] | None:
    mp = meta_path(records_path)
    if not mp.is_file():
        return None
    try:
        data = json.loads(mp.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise BadInput(f"{mp}: not valid JSON") from None
    return data if isinstance(data, dict) else None


def check_resume_meta(records_path: Path, settings: dict[str, Any]) -> None:
    """Refuse to resume a file written with different settings (one line naming the first difference)."""
    old = read_meta(records_path)
    if old is None:
        raise BadInput(f"--resume: {meta_path(records_path)} is missing, so the settings of {records_path} "
                       "are unknown; start a new --output")
    for key in RESUME_KEYS:
        was = old.get(key, LEGACY_META.get(key))
        if was != settings.get(key):
            raise BadInput(f"--resume: {records_path} was written with {key}={was!r}, this run has "
                           f"{key}={settings.get(key)!r}; use the same settings or a new --output")


def write_meta(records_path: Path, settings: dict[str, Any]) -> None:
    from quantrack.store.files import write_atomic

    write_atomic(meta_path(records_path), json.dumps(settings, indent=2, sort_keys=True) + "\n", flag="--output")


class RecordWriter:
    """Appends records as they arrive, flushed line by line (the run's artifact)."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        from quantrack.store.files import open_new, refuse_link

        self.path = refuse_link(path, "--output")  # never written through a link (eval --output LINK --overwrite)
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists():
            _drop_torn_tail(path)
            self._fh: IO[str] = open_new(path, append=True, flag="--output")
        else:
            self._fh = open_new(path, flag="--output")

    def write(self, rec: QuestionRecord) -> None:
        self._fh.write(rec.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line so the next append starts on a fresh line."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    with path.open("r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
