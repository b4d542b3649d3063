"""The library API for notebooks and scripts: the same results the commands print, as DataFrames and typed objects.

    from quantrack import api
    api.compare("llama3-8b-h200")            # one row per arm (per GPU in a fleet study): measured + derived
    api.audit(log_dirs=["logs/"])            # one row per node: effective kernel, fallback, evidence
    api.plan("Llama-3-8B", gpu="H100")       # derived capacity per arm
    api.runs("llama3-8b-h200")               # every arm run: params.*, metrics.*, tags.* columns
    api.load_study("study.toml")             # the validated Study object
    api.preflight("study.toml")              # the PreflightReport (verdicts per GPU x arm)

Each function calls the library code behind its command (``report.compare``, ``report.audit``, ``capacity``,
``tracking``, ``preflight``); nothing is recomputed here. DataFrames carry their provenance in ``df.attrs``
(``notes``, ``columns``: what each column is and whether it is measured or derived; ``baseline``). Errors are
the commands' ``QuantrackError`` subclasses (``BadInput``, ``NotFound`` ...), with the same one-line messages.

pandas is imported inside the functions, so ``import quantrack.api`` is cheap and the command line never
pays for it (``tests/unit/test_cold_start_imports.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.engines import GPU_ENGINE_KINDS
from quantrack.errors import BadInput

if TYPE_CHECKING:
    import pandas as pd

    from quantrack.hardware.catalog import ModelShape
    from quantrack.hardware.preflight import PreflightReport
    from quantrack.report.audit import AuditReport
    from quantrack.study import Study


def load_study(path: str | Path) -> Study:
    """The study file, validated completely (``quantrack.study.load_study``)."""
    from quantrack.study import load_study as _load

    return _load(path)


def compare(experiment: str, *, baseline: str | None = None, tracking_uri: str | None = None,
            prices: str | Path | None = None, gpu: str | None = None) -> pd.DataFrame:
    """``quantrack compare`` as a DataFrame: one row per arm (and per GPU for a fleet experiment), the numbers
    behind the printed table (metrics by their MLflow names, ``cost.*``, ``paired_test.*``, ``delta_vs_baseline``).
    A metric that was not measured is NaN (the table prints FILL IN). ``df.attrs``: ``baseline`` per table,
    ``notes``, ``columns`` (printed column -> its source)."""
    import pandas as pd

    from quantrack.report.compare import COLUMNS, compare_by_gpu

    tables = compare_by_gpu(experiment, baseline, tracking_uri, prices, gpu)
    records = []
    for table in tables:
        for raw in table.raw:
            records.append({"table": table.experiment, "baseline": table.baseline, **raw})
    df = pd.json_normalize(records, sep=".") if records else pd.DataFrame()
    for col in [c for c in df.columns if c.startswith("metrics.")]:
        df[col] = pd.to_numeric(df[col])  # a metric never logged is NaN (FILL IN in the printed table)
    df.attrs["baseline"] = {t.experiment: t.baseline for t in tables}
    df.attrs["notes"] = [n for t in tables for n in t.notes]
    df.attrs["columns"] = {key: source for key, _header, source in COLUMNS}
    return df


def audit_report(experiments: Iterable[str] = (), log_dirs: Iterable[str | Path] = (),
                 tracking_uri: str | None = None) -> AuditReport:
    """The typed ``AuditReport`` (rows, warnings, FP8 probes per node, ``exit_code``)."""
    from quantrack.report.audit import audit as _audit

    experiments, log_dirs = list(experiments), list(log_dirs)
    if not experiments and not log_dirs:
        raise BadInput("audit needs experiments=[...] or log_dirs=[...]")
    return _audit(experiments, log_dirs, tracking_uri)


def audit(experiments: Iterable[str] = (), log_dirs: Iterable[str | Path] = (),
          tracking_uri: str | None = None) -> pd.DataFrame:
    """``quantrack audit`` as a DataFrame: one row per node (run or log file) with the requested quantization,
    the effective kernel, ``fallback`` and its evidence line, capacity and TPOT deviations. ``df.attrs``:
    ``warnings``, ``probes``, ``fell_back`` (the nodes that fell back), ``exit_code`` (4 if any)."""
    import pandas as pd

    report = audit_report(experiments, log_dirs, tracking_uri)
    df = pd.DataFrame([r.to_dict() for r in report.rows])
    df.attrs.update(warnings=list(report.warnings), probes=dict(report.probes),
                    fell_back=[r.node for r in report.fell_back], exit_code=report.exit_code)
    return df


def plan(model: str | ModelShape, *, gpu: str | None = None, vram: str | float | None = None,
         arms: Sequence[str] | None = None, engine: str | None = None, util: float | None = None,
         context_len: int = 4096, tp: int = 1, overhead: str | None = None) -> pd.DataFrame:
    """``quantrack plan`` as a DataFrame (derived, not measured): one row per arm with weights, KV budget, token
    capacity and concurrency; with ``engine`` the engine-aware prediction beside each. ``model``: a catalog name,
    a config.json / .gguf path, or a ``ModelShape``; memory from ``gpu`` (catalog) or ``vram`` ("24GiB", 24 = GiB).
    ``arms``: presets or ``weights=…,kv=…`` (default: the seeds' five). ``df.attrs["title"]`` says the basis."""
    import pandas as pd

    from quantrack.hardware.capacity import run_plan

    req = plan_request(model, gpu=gpu, vram=vram, arms=arms, engine=engine, util=util, context_len=context_len,
                       tp=tp, overhead=overhead)
    df = pd.DataFrame([r.to_dict() for r in run_plan(req)])
    df.attrs["title"] = req.title()
    return df


def plan_request(model: str | ModelShape, *, gpu: str | None = None, vram: str | float | None = None,
                 arms: Sequence[str] | None = None, engine: str | None = None, util: float | None = None,
                 context_len: int = 4096, tp: int = 1, overhead: str | None = None) -> Any:
    """The validated ``capacity.PlanRequest`` behind :func:`plan` (ranges as the study's settings)."""
    from quantrack.arms import default_arms, parse_arm_spec, with_baseline
    from quantrack.hardware import capacity, catalog, units
    from quantrack.settings import convert
    from quantrack.study import GpuSpec, Study

    shape = _shape(model)
    if (gpu is None) == (vram is None):
        raise BadInput("give gpu= (a catalog GPU) or vram= (memory per GPU), one of them")
    gpu_name = None
    if gpu is not None:
        g = catalog.get_gpu(gpu)
        if g.vendor == "cpu" or g.total_bytes <= 0:
            raise BadInput(f"gpu {g.name} has no fixed memory; give vram= with the RAM to use instead")
        memory, decimal, label, gpu_name = float(g.total_bytes), False, g.memory_basis, g.name
    else:
        text = str(vram)
        memory = float(units.parse_memory(text, what="vram"))
        decimal, label = units.is_decimal(units.unit_of(text)), f"{text} (vram)"
    if engine is not None and engine not in GPU_ENGINE_KINDS:
        raise BadInput(f"engine: expected vllm or sglang (the engine-aware column), got {engine!r}")
    if util is not None:
        util = convert(GpuSpec, "util", util, "util")
    tp = convert(GpuSpec, "count", tp, "tp")
    context_len = convert(Study, "context_len", context_len, "context_len")
    chosen = with_baseline([parse_arm_spec(a) for a in arms]) if arms else default_arms()
    return capacity.PlanRequest(
        shape=shape, memory_bytes=memory, memory_label=label, arms=tuple(chosen), util=util,
        overhead_bytes=float(units.parse_memory(overhead, what="overhead")) if overhead else 0.0, tp=tp,
        context_len=context_len, engine=engine, gpu_name=gpu_name, decimal=decimal)


def _shape(model: str | ModelShape) -> ModelShape:
    from quantrack.hardware import catalog

    if isinstance(model, catalog.ModelShape):
        return model
    if model.endswith(".gguf"):
        from quantrack.models.ggufmeta import load_gguf

        return load_gguf(model)
    if model.endswith(".json"):
        from quantrack.models.hfconfig import load_hf_config

        return load_hf_config(model)
    return catalog.get_model(model)


def runs(experiment: str, *, tracking_uri: str | None = None, role: str | None = "arm") -> pd.DataFrame:
    """Every run of an experiment (newest first): ``run_id``, ``arm``, ``status``, times, then ``params.*``,
    ``metrics.*`` and ``tags.*`` columns, as MLflow names them. ``role=None``: probes and parents too."""
    import pandas as pd

    from quantrack.store.tracking import load_runs

    rows = load_runs(experiment, tracking_uri, role=role)
    records = [{"run_id": r.run_id, "arm": r.arm, "run_name": r.run_name, "status": r.status,
                "start_time": pd.to_datetime(r.start_time, unit="ms", utc=True),
                "end_time": pd.to_datetime(r.end_time, unit="ms", utc=True) if r.end_time else pd.NaT,
                "params": r.params, "metrics": r.metrics, "tags": r.tags} for r in rows]
    return pd.json_normalize(records, sep=".") if records else pd.DataFrame()


def preflight(study: str | Path, *, gpu: str | None = None) -> PreflightReport:
    """``quantrack preflight --study FILE`` as the typed ``PreflightReport`` (``.verdict``, ``.results`` per
    GPU x arm with rule verdicts, derived capacity and the launch command; ``.to_dict()``)."""
    from quantrack.hardware.preflight import request_from_study, run_preflight

    return run_preflight(request_from_study(str(study), gpu=gpu))


__all__ = ["audit", "audit_report", "compare", "load_study", "plan", "plan_request", "preflight", "runs"]
