"""Reading a run's artifacts without mlflow (a local store), else through tracking; the sweep artifact's
per-level statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from quantrack.constraints import (
    SLO_METRICS,
    SLO_STATS,
)

if TYPE_CHECKING:
    from quantrack.store.records import RunRow


def local_artifact_dirs(r: RunRow, uri: str | None) -> list[Path]:
    """Where a run's artifacts may be on this machine: its artifact URI, then quantrack's default layout beside
    the SQLite database (``<db dir>/artifacts/<run id>/artifacts``: a store moved or unpacked elsewhere)."""
    out: list[Path] = []
    if r.artifact_uri:
        u = urlparse(r.artifact_uri)
        if u.scheme in ("file", ""):
            out.append(Path(unquote(u.path)))
    if uri and uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        out.append(db.parent / "artifacts" / r.run_id / "artifacts")
    return out


def read_artifact(r: RunRow, rel: str, uri: str | None) -> str | None:
    for d in local_artifact_dirs(r, uri):
        p = d / rel
        if p.is_file():
            try:
                return p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
    if r.artifact_uri and urlparse(r.artifact_uri).scheme not in ("file", ""):
        from quantrack.store.tracking import read_artifact_text

        return read_artifact_text(r.run_id, rel, uri)
    return None


def sweep_levels_from_artifact(text: str | None) -> dict[int, dict[str, dict[str, float]]]:
    """``sweep/sweep.json`` rows -> {concurrency: {ttft|tpot|e2e: {p50, p90, p99, mean}}}."""
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    out: dict[int, dict[str, dict[str, float]]] = {}
    for row in obj.get("rows", []) if isinstance(obj, dict) else []:
        if not isinstance(row, dict) or not isinstance(row.get("concurrency"), int):
            continue
        stats: dict[str, dict[str, float]] = {}
        for metric in SLO_METRICS:
            d = row.get(f"{metric}_ms")
            if isinstance(d, dict):
                stats[metric] = {k: float(v) for k, v in d.items()
                                 if k in SLO_STATS and isinstance(v, (int, float)) and math.isfinite(v)}
        out[row["concurrency"]] = stats
    return out
