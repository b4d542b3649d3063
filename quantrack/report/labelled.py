"""Labelled figures: every number of the decision report with where it came from (measured, derived, imported,
FILL IN, unknown), the metric or formula, and the run id."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from quantrack.report.armrun import (
    ArmRun,
)
from quantrack.report.compare import FILL


class FigureKind(StrEnum):
    """Where a number comes from: every figure of the report is one of these."""

    MEASURED = "measured"
    DERIVED = "derived"
    IMPORTED = "imported"
    FILL_IN = FILL  # not measured
    UNKNOWN = "unknown"  # cannot be formed (a missing input, no price)



@dataclass
class Figure:
    """One number with where it came from."""

    value: float | None
    kind: FigureKind
    source: str = ""  # metric or artifact name, or the formula
    run_id: str | None = None
    text: str | None = None  # the rendered value (FILL IN / unknown text when value is None)

    @property
    def known(self) -> bool:
        return self.value is not None

    def show(self) -> str:
        if self.text is not None:
            return self.text
        return FILL if self.value is None else f"{self.value:,.4g}"

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "kind": self.kind, "source": self.source, "run_id": self.run_id,
                "text": self.show()}


def fill_in(source: str, run_id: str | None, why: str = FILL) -> Figure:
    return Figure(None, FigureKind.FILL_IN, source, run_id, why)


def measured(v: float | None, key: str, r: ArmRun, fmt: str = "{:,.2f}", kind: FigureKind = FigureKind.MEASURED) -> Figure:
    """A run metric as a figure (``key``: its name, for the label); FILL IN when not logged or not finite."""
    if v is None or not math.isfinite(v):
        return fill_in(f"metric {key}", r.run_id)
    return Figure(float(v), kind, f"metric {key}", r.run_id, fmt.format(v))
