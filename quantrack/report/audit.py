"""Fleet audit: which nodes silently fell back to a slower kernel (pure; no mlflow here).

Per node (one tracked run, or one raw startup log): GPU and compute capability, MIG, engine version,
requested quantization, the effective kernel the log names, fallback yes/no with the evidence line,
capacity deviation from the prediction, and batch-1 TPOT against the median of the nodes with the same
GPU and arm. Fallbacks are what the engine adapters' log parsers report (``LogReport.fallbacks``), e.g.
vLLM/SGLang's "Your GPU does not have native support for FP8 computation ... Marlin kernel" warning
(engine-facts.md §2.1). ``quantrack audit`` exits 4 when any node fell back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.tracking import RunRow

FORMATS = ("table", "json")
EXIT_FALLBACK = 4
NA = "n/a"


@dataclass
class AuditRow:
    node: str  # hostname, or the log file's name
    source: str  # run id or log path
    arm: str | None
    gpu: str | None
    compute_capability: str | None
    mig: str | None
    engine: str | None
    engine_version: str | None
    quantization: str | None  # requested
    effective_kernel: str | None  # from the log
    fallback: bool | None  # None: no log was parsed for this node
    fallback_kinds: str | None
    evidence: str | None  # "file:line: text" of the first fallback line
    capacity_error_pct: float | None  # derived: (reported - predicted) / predicted
    tpot_ms: float | None  # measured, batch-1 median
    tpot_vs_median_pct: float | None = None  # derived: against the median of same GPU + arm
    group_size: int | None = None  # nodes in that GPU + arm group

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditReport:
    rows: list[AuditRow]

    @property
    def fell_back(self) -> list[AuditRow]:
        return [r for r in self.rows if r.fallback]

    @property
    def exit_code(self) -> int:
        return EXIT_FALLBACK if self.fell_back else 0


def rows_from_runs(runs: Iterable[RunRow]) -> list[AuditRow]:
    out = []
    for r in runs:
        p, t, m = r.params, r.tags, r.metrics
        fb = t.get("quantrack.fallback")
        out.append(AuditRow(
            node=p.get("hostname") or r.run_name, source=r.run_id, arm=r.arm,
            gpu=p.get("gpu_name") or p.get("gpu_catalog"), compute_capability=p.get("compute_capability"),
            mig=p.get("mig"), engine=p.get("engine"), engine_version=p.get("engine_version"),
            quantization=p.get("quantization"), effective_kernel=t.get("quantrack.effective_kernel"),
            fallback=None if fb is None else fb == "yes", fallback_kinds=t.get("quantrack.fallback_kinds"),
            evidence=t.get("quantrack.fallback_evidence"), capacity_error_pct=m.get("capacity_error_pct"),
            tpot_ms=m.get("tpot_ms_p50"),
        ))
    return out


def rows_from_logs(paths: Iterable[Path]) -> list[AuditRow]:
    """Parse raw startup logs with the engine adapters (engine detected from the text)."""
    from quantrack.engines import parse_log_file

    out = []
    for path in paths:
        rep = parse_log_file(path)
        fbs = list(rep.fallbacks)
        evidence = f"{path.name}:{fbs[0].line_no}: {fbs[0].line.strip()}" if fbs else None
        out.append(AuditRow(
            node=path.name, source=str(path), arm=None, gpu=rep.gpu, compute_capability=None, mig=None,
            engine=rep.engine, engine_version=rep.engine_version, quantization=rep.quantization,
            effective_kernel=rep.linear_kernel, fallback=bool(fbs),
            fallback_kinds=",".join(sorted({e.kind for e in fbs})) or None, evidence=evidence,
            capacity_error_pct=None, tpot_ms=None,
        ))
    return out


def log_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise BadInput(f"--logs {str(directory)!r}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == ".log")
    if not files:
        raise BadInput(f"--logs {str(directory)!r}: no *.log files")
    return files


def add_tpot_deviation(rows: list[AuditRow]) -> None:
    """TPOT of each node against the median TPOT of the nodes with the same GPU and arm (derived)."""
    from quantrack.measure.stats import median

    groups: dict[tuple[str | None, str | None], list[AuditRow]] = defaultdict(list)
    for r in rows:
        if r.tpot_ms is not None:
            groups[(r.gpu, r.arm)].append(r)
    for members in groups.values():
        med = median([r.tpot_ms for r in members if r.tpot_ms is not None])
        for r in members:
            r.group_size = len(members)
            if med and r.tpot_ms is not None:
                r.tpot_vs_median_pct = (r.tpot_ms - med) / med * 100.0


def build_audit(runs: Iterable[RunRow] = (), log_dirs: Iterable[Path] = ()) -> AuditReport:
    rows = rows_from_runs(runs)
    for d in log_dirs:
        rows += rows_from_logs(log_files(d))
    add_tpot_deviation(rows)
    return AuditReport(rows=rows)


def audit(experiments: Iterable[str] = (), log_dirs: Iterable[str | Path] = (), uri: str | None = None) -> AuditReport:
    """Audit tracked runs of the experiments and/or raw log directories."""
    exps, dirs = list(experiments), [Path(d) for d in log_dirs]
    if not exps and not dirs:
        raise BadInput("nothing to audit: pass --experiment NAME and/or --logs DIR")
    runs: list[RunRow] = []
    if exps:
        from quantrack.tracking import load_runs

        for e in exps:
            runs += load_runs(e, uri)
    return build_audit(runs, dirs)


def _cell(v: Any) -> str:
    if v is None:
        return NA
    if isinstance(v, bool):
        return "YES" if v else "no"
    return str(v)


def _pct(v: float | None) -> str:
    return NA if v is None else f"{v:+.1f}%"


def render(report: AuditReport, fmt: str = "table") -> str:
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}; formats: {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps({"nodes": [r.to_dict() for r in report.rows],
                           "fell_back": [r.node for r in report.fell_back],
                           "labels": {"capacity_error_pct": "derived", "tpot_ms": "measured",
                                      "tpot_vs_median_pct": "derived", "fallback": "measured (engine log)"}},
                          indent=2) + "\n"
    from tabulate import tabulate  # type: ignore[import-untyped]

    headers = ["Node", "Arm", "GPU", "CC", "MIG", "Engine", "Quant.", "Effective kernel", "Fallback",
               "Cap. error", "TPOT", "TPOT vs median"]
    body = []
    for r in report.rows:
        fb = _cell(r.fallback)
        if r.fallback and r.fallback_kinds:
            fb = f"YES ({r.fallback_kinds})"
        eng = f"{r.engine or NA} {r.engine_version or ''}".strip()
        body.append([r.node, _cell(r.arm), _cell(r.gpu), _cell(r.compute_capability), _cell(r.mig), eng,
                     _cell(r.quantization), _cell(r.effective_kernel), fb, _pct(r.capacity_error_pct),
                     NA if r.tpot_ms is None else f"{r.tpot_ms:.2f} ms",
                     _pct(r.tpot_vs_median_pct) + (f" (of {r.group_size})" if r.group_size else "")])
    text = tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
    lines = [text, ""]
    for r in report.fell_back:
        lines.append(f"FALLBACK {r.node}: {r.evidence or 'no evidence line recorded'}")
    lines.append(f"{len(report.fell_back)} of {len(report.rows)} node(s) fell back"
                 + (" (exit 4)" if report.fell_back else "")
                 + ". Cap. error and TPOT vs median are derived; TPOT and fallback are measured.")
    return "\n".join(lines) + "\n"


__all__ = ["EXIT_FALLBACK", "AuditReport", "AuditRow", "audit", "build_audit", "render"]
