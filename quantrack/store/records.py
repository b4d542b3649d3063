"""A run as quantrack builds it (``RunRecord``: params, metrics, tags, artifacts, status, built whole before it is
sent or spooled), what logging it gave back (``Logged``) and a run as read back (``RunRow``)."""

from __future__ import annotations

import math
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantrack.errors import QuantrackError
from quantrack.redact import redact_mapping, redact_text
from quantrack.run.schema import Tag

_PARAM_MAX = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH (3.x)
_TAG_MAX = 8000  # MAX_TAG_VAL_LENGTH


class TrackingError(QuantrackError):
    """The tracking store refused or failed an operation (not a connectivity problem: those spool)."""

    exit_code = 1


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class MetricPoint:
    key: str
    value: float
    step: int = 0
    timestamp: int = 0


@dataclass
class RunRecord:
    """One run, complete: what ``Tracker.log`` sends and what the spool stores."""

    experiment: str
    run_name: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[MetricPoint] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    # artifact path (relative, '/'-separated) -> text content
    artifacts: dict[str, str] = field(default_factory=dict)
    # artifact path -> local file to copy (plots, large files)
    artifact_files: dict[str, str] = field(default_factory=dict)
    status: str = "FINISHED"
    start_ms: int = field(default_factory=now_ms)
    end_ms: int | None = None
    uuid: str = field(default_factory=lambda: uuidlib.uuid4().hex)
    parent_uuid: str | None = None
    secrets: list[str] = field(default_factory=list, repr=False)  # literal values to scrub; never stored

    # --- building ---------------------------------------------------------------------------------------
    def param(self, key: str, value: Any) -> None:
        """Record a param; ``None`` means "not known" and is left out (never logged as 'None')."""
        if value is None or value == "":
            return
        if isinstance(value, (list, tuple)):
            value = " ".join(str(v) for v in value)
        self.params[key] = str(value)

    def metric(self, key: str, value: float | None, step: int = 0) -> None:
        """Record a metric value; ``None`` (not measured) is left out: compare prints FILL IN for it."""
        if value is None:
            return
        v = float(value)
        if math.isnan(v):  # not a measurement
            return
        self.metrics.append(MetricPoint(key, v, step, now_ms()))

    def series(self, key: str, values: list[float]) -> None:
        """A metric history (one value per step: latency samples, per-level sweep points)."""
        ts = now_ms()
        for i, v in enumerate(values):
            if v is not None and not math.isnan(float(v)):
                self.metrics.append(MetricPoint(key, float(v), i, ts))

    def tag(self, key: str, value: Any) -> None:
        if value is None or value == "":
            return
        self.tags[key] = str(value)

    def latest_metrics(self) -> dict[str, float]:
        """The value per key that MLflow shows as the metric (highest step, then latest timestamp)."""
        out: dict[str, tuple[int, int, float]] = {}
        for m in self.metrics:
            cur = out.get(m.key)
            if cur is None or (m.step, m.timestamp) >= (cur[0], cur[1]):
                out[m.key] = (m.step, m.timestamp, m.value)
        return {k: v[2] for k, v in out.items()}

    def redacted(self) -> RunRecord:
        """A copy with secrets scrubbed from params, tags and text artifacts (files are scrubbed on upload)."""
        secrets = list(self.secrets)
        params = {k: _clip(v, _PARAM_MAX) for k, v in redact_mapping(self.params, secrets).items()}
        tags = {k: _clip(v, _TAG_MAX) for k, v in redact_mapping(self.tags, secrets).items()}
        arts = {k: redact_text(v, secrets) for k, v in self.artifacts.items()}
        return RunRecord(
            experiment=self.experiment, run_name=self.run_name, params=params, metrics=list(self.metrics),
            tags=tags, artifacts=arts, artifact_files=dict(self.artifact_files), status=self.status,
            start_ms=self.start_ms, end_ms=self.end_ms, uuid=self.uuid, parent_uuid=self.parent_uuid,
            secrets=secrets,
        )

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("secrets")
        d.pop("artifacts")
        d.pop("artifact_files")
        return d


def _clip(value: Any, limit: int) -> str:
    s = str(value)
    return s if len(s) <= limit else s[: limit - 14] + "…[truncated]"


@dataclass
class Logged:
    """Where a record went: a run id on the store, or a spool directory."""

    uuid: str
    run_id: str | None = None
    spooled: Path | None = None
    reason: str | None = None


@dataclass
class RunRow:
    """One run as read back from the store (plain data for compare/audit)."""

    run_id: str
    experiment_id: str
    run_name: str
    status: str
    start_time: int
    end_time: int | None
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    artifact_uri: str | None = None  # where the run's artifacts are (file:// for a local store)

    @property
    def arm(self) -> str:
        return self.tags.get(Tag.ARM) or self.run_name
