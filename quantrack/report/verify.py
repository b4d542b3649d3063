"""``quantrack verify``: every arm run's stored figures recomputed from the run's own artifacts.

For each arm run of an experiment the stored metrics (and the per-question outcome tags) are compared with what the
run's artifacts give when recomputed:

* GSM8K counts, accuracy, SE and the Wilson interval from the per-question records (``eval/records.jsonl``), the
  outcome string (``quantrack.gsm8k_correct`` and its continuations) from the same records, and the Δ vs the
  baseline from this run's and the baseline run's records;
* batch-1 latency statistics from the per-request samples in ``latency/latency.json``;
* KL mean, top-1 agreement and the position count from the per-text figures in ``kl/result.json``;
* capacity figures by parsing the engine's own log again (``server/<arm>-server.log``) with today's parser;
* sweep throughput from each level's token count and wall time (``sweep/sweep.json``).

A figure is ``recomputed`` when it is derived again from raw data (records, samples, log lines, counts). Where the
artifact keeps only a summary (a sweep level's percentiles: the per-request samples are not stored), the metric
is compared with that summary and labelled ``artifact`` (a transcription check, never called a recomputation).
Every other stored metric is listed as not recomputed, with the reason. Pure reading: nothing is written.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack.run.schema import (
    LEVEL_FIGURES,
    SWEEP_LEVEL,
    AccuracyNames,
    Artifact,
    Metric,
    Param,
    RunStatus,
    Tag,
    accuracy_names,
    latency_stat,
    sweep_level,
    sweep_output_tps,
    sweep_request_tps,
    sweep_tpot_p50,
    sweep_ttft_p50,
)
from quantrack.store.records import RunRow

REL_TOL = 1e-6  # stored and recomputed agree when |a - b| <= REL_TOL * max(|a|, |b|) (or both below ABS_TOL)
ABS_TOL = 1e-9
RECOMPUTED = "recomputed"  # derived again from raw data
ARTIFACT = "artifact"  # compared with the summary the artifact keeps (the raw data is not stored)
LATENCY_ROW_FORMAT = "quantrack-latency/1"  # quantrack.measure.latency.ROW_FORMAT (not imported: it pulls httpx)


@dataclass(frozen=True)
class Check:
    """One stored figure compared with its recomputation."""

    name: str  # metric or tag name
    stored: float | str | None
    recomputed: float | str | None
    basis: str  # RECOMPUTED | ARTIFACT
    source: str  # what it was recomputed from

    @property
    def agrees(self) -> bool:
        a, b = self.stored, self.recomputed
        if isinstance(a, float) and isinstance(b, float):
            if math.isnan(a) or math.isnan(b):
                return math.isnan(a) and math.isnan(b)
            return abs(a - b) <= max(ABS_TOL, REL_TOL * max(abs(a), abs(b)))
        return a == b

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "stored": self.stored, "recomputed": self.recomputed, "basis": self.basis,
                "source": self.source, "agrees": self.agrees}


@dataclass
class ArmVerification:
    """What verify found for one arm run."""

    arm: str
    run_id: str
    status: str
    checks: list[Check] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)  # stored metric -> why it was not recomputed

    @property
    def disagreements(self) -> list[Check]:
        return [c for c in self.checks if not c.agrees]

    def count(self, basis: str) -> int:
        return sum(1 for c in self.checks if c.basis == basis)

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "run_id": self.run_id, "status": self.status,
                "recomputed": self.count(RECOMPUTED), "artifact": self.count(ARTIFACT),
                "disagree": [c.to_dict() for c in self.disagreements],
                "checks": [c.to_dict() for c in self.checks], "not_recomputed": dict(sorted(self.unchecked.items()))}


@dataclass
class Verification:
    experiment: str
    uri: str
    arms: list[ArmVerification]

    @property
    def disagreements(self) -> list[tuple[ArmVerification, Check]]:
        return [(a, c) for a in self.arms for c in a.disagreements]

    @property
    def ok(self) -> bool:
        return not self.disagreements

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "tracking_uri": self.uri, "ok": self.ok,
                "tolerance": {"relative": REL_TOL, "absolute": ABS_TOL},
                "arms": [a.to_dict() for a in self.arms]}


# --- reading a run's artifacts ---------------------------------------------------------------------------------

class _Artifacts:
    """A run's artifacts, read once each (local store: from disk; a server: through tracking)."""

    def __init__(self, row: RunRow, uri: str) -> None:
        self.row, self.uri = row, uri
        self._cache: dict[str, str | None] = {}

    def text(self, rel: str) -> str | None:
        if rel not in self._cache:
            from quantrack.report.artifacts import read_artifact

            try:
                self._cache[rel] = read_artifact(self.row, rel, self.uri)
            except Exception:  # noqa: BLE001 - an artifact that cannot be read is reported as missing
                self._cache[rel] = None
        return self._cache[rel]

    def json(self, rel: str) -> Any:
        t = self.text(rel)
        if t is None:
            return None
        try:
            return json.loads(t)
        except ValueError:
            return None

    def server_logs(self) -> list[str]:
        """The engine logs stored under ``server/`` (local stores list the folder; a server: ``<arm>-server.log``)."""
        from quantrack.report.artifacts import local_artifact_dirs

        for d in local_artifact_dirs(self.row, self.uri):
            if (d / "server").is_dir():
                return sorted(f"server/{p.name}" for p in (d / "server").iterdir()
                              if p.is_file() and p.suffix == ".log")
        rel = f"server/{self.row.arm}-server.log"
        return [rel] if self.text(rel) is not None else []


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)) else None


class _Arm:
    """Builds one ArmVerification: ``check`` compares a stored metric, ``skip`` records why one was not."""

    def __init__(self, row: RunRow, uri: str) -> None:
        self.row, self.art = row, _Artifacts(row, uri)
        self.out = ArmVerification(arm=row.arm, run_id=row.run_id, status=row.status)

    def check(self, name: str, recomputed: float | None, source: str, basis: str = RECOMPUTED) -> None:
        stored = self.row.metrics.get(name)
        if stored is None:
            return
        if recomputed is None:
            self.skip(name, f"{source} does not give it")
            return
        self.out.checks.append(Check(name, float(stored), float(recomputed), basis, source))

    def skip(self, name: str, why: str) -> None:
        if name in self.row.metrics and not any(c.name == name for c in self.out.checks):
            self.out.unchecked.setdefault(name, why)

    def skip_all(self, names: list[str], why: str) -> None:
        for n in names:
            self.skip(n, why)


# --- GSM8K ----------------------------------------------------------------------------------------------------

def _names(row: RunRow) -> AccuracyNames:
    """The run's accuracy metric names: gsm8k_*, or its task file's (``quantrack.eval_metrics``)."""
    return accuracy_names(row.tags.get(Tag.EVAL_METRICS))


def _task_metrics(n: AccuracyNames) -> tuple[str, ...]:
    return (n.n, n.correct, n.accuracy, n.se, n.ci_low, n.ci_high, n.invalid, n.errors)


@dataclass(frozen=True)
class _Gsm8k:
    figures: dict[str, float | None]
    outcomes: str | None  # the outcome string the records give (None: a position past the pool, or string ids)
    string_ids: bool = False  # a task file's records: positions follow the task file's order, not the records


def gsm8k_from_records(text: str, names: AccuracyNames | None = None) -> _Gsm8k:
    """Counts, accuracy, SE and Wilson interval of every record in a records artifact, and its outcome string."""
    from quantrack.accuracy.gsm8k import MAX_POOL, outcome_position
    from quantrack.accuracy.records import load_records
    from quantrack.accuracy.stats import proportion

    with tempfile.TemporaryDirectory(prefix="quantrack-verify-") as tmp:
        path = Path(tmp) / "records.jsonl"
        path.write_text(text, encoding="utf-8")
        recs = load_records(path)
    answered = [r for r in recs.values() if r.answered]
    prop = proportion(sum(1 for r in answered if r.correct), len(answered))
    n = names or accuracy_names()
    figures: dict[str, float | None] = {
        n.n: float(prop.n), n.correct: float(prop.k), n.accuracy: prop.p,
        n.se: prop.se, n.ci_low: prop.ci_low, n.ci_high: prop.ci_high,
        n.invalid: float(sum(1 for r in answered if r.invalid)),
        n.errors: float(sum(1 for r in recs.values() if not r.answered)),
    }
    if any(not isinstance(q, int) for q in recs):
        return _Gsm8k(figures, None, string_ids=True)
    pos = {qid: outcome_position(qid) for qid in recs}
    outcomes = None
    if recs and max(pos.values()) < MAX_POOL:
        chars = ["."] * (max(pos.values()) + 1)
        for qid, r in recs.items():
            if r.answered:
                chars[pos[qid]] = "1" if r.correct else "0"
        outcomes = "".join(chars)
    return _Gsm8k(figures, outcomes)


def stored_outcomes(tags: dict[str, str]) -> str | None:
    """The outcome string as stored: ``quantrack.gsm8k_correct`` (a task file's: ``quantrack.<task>_correct``) joined
    with its ``.1``, ``.2`` ... continuations."""
    key = accuracy_names(tags.get(Tag.EVAL_METRICS)).outcomes_tag
    s = tags.get(key)
    i = 1
    while s is not None and f"{key}.{i}" in tags:
        s += tags[f"{key}.{i}"]
        i += 1
    return s


def describe_outcomes(s: str | float | None) -> str:
    if not isinstance(s, str):
        return "none"
    return f"{len(s)} positions, {s.count('1')} right, {s.count('0')} wrong"


def _verify_gsm8k(a: _Arm, gsm: _Gsm8k | None) -> None:
    names = _names(a.row)
    if gsm is None:
        why = "no per-question records artifact (eval/records.jsonl)"
        a.skip_all([*_task_metrics(names), names.delta_vs_baseline], why)
        return
    src = Artifact.EVAL_RECORDS
    for name in _task_metrics(names):
        a.check(name, gsm.figures.get(name), src)
    stored = stored_outcomes(a.row.tags)
    if stored is not None:
        if gsm.string_ids:
            a.out.unchecked.setdefault(names.outcomes_tag, f"{src}: a task file's outcome positions follow the task "
                                       "file's item order, which the records do not hold")
        elif gsm.outcomes is None:
            a.out.unchecked.setdefault(names.outcomes_tag, f"{src}: a question id past the outcome string's pool")
        else:
            a.out.checks.append(Check(names.outcomes_tag, stored, gsm.outcomes, RECOMPUTED, src))


def _baseline_for(row: RunRow, runs: list[RunRow]) -> tuple[RunRow | None, str]:
    """The baseline run a stored Δ was taken against: the baseline arm of the same parent study run, else (a run
    logged alone) the newest finished baseline run that started before it (what ``run --arm`` / ``log`` read)."""
    bases = [r for r in runs if r.tags.get(Tag.BASELINE) == "true" and r.run_id != row.run_id]
    parent = row.tags.get(Tag.MLFLOW_PARENT_RUN_ID)
    if parent:
        same = [r for r in bases if r.tags.get(Tag.MLFLOW_PARENT_RUN_ID) == parent]
        if same:
            return max(same, key=lambda r: r.start_time), "the baseline arm of the same study run"
    before = [r for r in bases if r.status == RunStatus.FINISHED and r.start_time < row.start_time
              and _names(r).accuracy in r.metrics]
    if before:
        return max(before, key=lambda r: r.start_time), "the newest finished baseline run before it"
    return None, ""


def _verify_delta(a: _Arm, gsm: _Gsm8k | None, runs: list[RunRow], records_of: Callable[[RunRow], _Gsm8k | None]
                  ) -> None:
    names = _names(a.row)
    name = names.delta_vs_baseline
    if name not in a.row.metrics or gsm is None:
        return
    base, how = _baseline_for(a.row, runs)
    if base is None:
        a.skip(name, "no baseline run that the stored Δ could have been taken against is in the experiment")
        return
    bg = records_of(base)
    acc, base_acc = gsm.figures.get(names.accuracy), bg.figures.get(_names(base).accuracy) if bg else None
    if acc is None or base_acc is None:
        a.skip(name, f"the baseline run {base.run_id[:8]} ({how}) has no per-question records")
        return
    a.check(name, acc - base_acc, f"{Artifact.EVAL_RECORDS} of this run and of {base.run_id[:8]} ({how})")


# --- latency --------------------------------------------------------------------------------------------------

def _verify_latency(a: _Arm) -> None:
    from quantrack.measure.stats import pct_diff, summarize

    row = a.art.json(Artifact.LATENCY_LATENCY)
    lat_names = [k for k in a.row.metrics if k.split("_ms_")[0] in ("ttft", "tpot", "itl", "e2e", "server_tpot")
                 and "_ms_" in k] + [Metric.DECODE_TOK_S_P50, Metric.LATENCY_N_OK, Metric.LATENCY_N_FAILED,
                                     Metric.SERVER_TPOT_MS, Metric.TPOT_VS_SERVER_PCT, Metric.TPOT_CV,
                                     Metric.SAMPLE_TPOT_MS, Metric.SAMPLE_TTFT_MS]
    if not isinstance(row, dict):
        a.skip_all(lat_names, f"no readable {Artifact.LATENCY_LATENCY}")
        return
    if row.get("format") != LATENCY_ROW_FORMAT or not isinstance(row.get("samples"), list):
        a.skip_all(lat_names, f"{Artifact.LATENCY_LATENCY} is an imported row without quantrack's per-request "
                              "samples")
        return
    src = f"{Artifact.LATENCY_LATENCY} samples"
    samples = [s for s in row["samples"] if isinstance(s, dict)]
    ok = [s for s in samples if s.get("ok", True)]
    a.check(Metric.LATENCY_N_OK, float(len(ok)), src)
    a.check(Metric.LATENCY_N_FAILED, float(len(samples) - len(ok)), src)

    def values(key: str) -> list[float]:
        return [v for v in (_num(s.get(key)) for s in ok) if v is not None]

    stats = {key: summarize(values(key)) for key in ("ttft_ms", "tpot_ms", "e2e_ms", "server_tpot_ms")}
    for key, s in stats.items():
        for stat, attr in (("p50", "median"), ("mean", "mean"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"),
                           ("ci_low", "ci95_low"), ("ci_high", "ci95_high")):
            a.check(latency_stat(key, stat), _num(getattr(s, attr)) if s is not None else None, src)
    tpots = values("tpot_ms")
    decode = summarize([1000.0 / t for t in tpots if t])
    a.check(Metric.DECODE_TOK_S_P50, decode.median if decode else None, src)
    server = stats["server_tpot_ms"]
    a.check(Metric.SERVER_TPOT_MS, server.median if server else None, src)
    client = stats["tpot_ms"]
    a.check(Metric.TPOT_VS_SERVER_PCT, pct_diff(client.median, server.median) if client and server and server.median
            else None, src)
    if tpots and len(tpots) >= 2:
        from quantrack.measure.hygiene import cv

        a.check(Metric.TPOT_CV, cv([t / 1000.0 for t in tpots]), src)
    # a series: its latest value (the one the store keeps beside the history) is the last ok sample's
    a.check(Metric.SAMPLE_TPOT_MS, tpots[-1] if tpots else None, f"{src} (the series' last point)")
    ttfts = values("ttft_ms")
    a.check(Metric.SAMPLE_TTFT_MS, ttfts[-1] if ttfts else None, f"{src} (the series' last point)")
    a.skip_all([k for k in a.row.metrics if k.startswith("itl_ms_")],
               f"the per-chunk gaps are not stored in {Artifact.LATENCY_LATENCY}")


# --- KL -------------------------------------------------------------------------------------------------------

def _verify_kl(a: _Arm) -> None:
    kl = a.art.json(Artifact.KL_RESULT)
    names = [Metric.KL_MEAN, Metric.KL_TOP1_AGREE, Metric.KL_POSITIONS, Metric.KL_MEDIAN, Metric.KL_P99]
    texts = kl.get("per_text") if isinstance(kl, dict) else None
    if not isinstance(texts, list) or not texts:
        a.skip_all(names, f"no per-text figures in {Artifact.KL_RESULT}")
        return
    pos = [_num(t.get("positions")) for t in texts if isinstance(t, dict)]
    kls = [_num(t.get("kl_mean")) for t in texts if isinstance(t, dict)]
    agree = [_num(t.get("top1_agree")) for t in texts if isinstance(t, dict)]
    src = f"{Artifact.KL_RESULT} per-text figures (position-weighted)"
    if any(v is None for v in (*pos, *kls, *agree)) or not sum(p or 0 for p in pos):
        a.skip_all(names, f"{Artifact.KL_RESULT}: a per-text figure is missing")
        return
    n = sum(p or 0.0 for p in pos)
    a.check(Metric.KL_POSITIONS, n, src)
    a.check(Metric.KL_MEAN, math.fsum((p or 0) * (k or 0) for p, k in zip(pos, kls, strict=True)) / n, src)
    a.check(Metric.KL_TOP1_AGREE, math.fsum((p or 0) * (g or 0) for p, g in zip(pos, agree, strict=True)) / n, src)
    a.skip_all([Metric.KL_MEDIAN, Metric.KL_P99], f"needs the per-position KL values; {Artifact.KL_RESULT} keeps "
                                                  "per-text means")


# --- the engine log -------------------------------------------------------------------------------------------

LOG_METRICS = (Metric.WEIGHTS_GIB, Metric.KV_TOKENS_REPORTED, Metric.AVAILABLE_KV_GIB, Metric.MAX_CONCURRENCY,
               Metric.CUDA_GRAPH_GIB, Metric.KV_MIB_REPORTED, Metric.KV_CELLS_PER_STREAM, Metric.KV_STREAMS,
               Metric.CAPACITY_ERROR_PCT, Metric.KV_MIB_ERROR_PCT)


def _verify_log(a: _Arm) -> None:
    logs = a.art.server_logs()
    own = [p for p in logs if Path(p).name == f"{a.row.arm}-server.log"]
    pick = own or logs
    engine = a.row.params.get(Param.ENGINE)
    if len(pick) != 1 or not engine:
        why = ("no engine log stored under server/" if not pick else
               f"{len(pick)} engine logs stored under server/, none named {a.row.arm}-server.log" if len(pick) > 1
               else "the run does not name its engine (param engine)")
        a.skip_all(list(LOG_METRICS), why)
        return
    text = a.art.text(pick[0])
    if text is None:
        a.skip_all(list(LOG_METRICS), f"{pick[0]} could not be read")
        return
    from quantrack.engines import get_adapter
    from quantrack.errors import QuantrackError

    try:
        rep = get_adapter(engine).parse_log(text, source=pick[0])
    except QuantrackError as exc:
        a.skip_all(list(LOG_METRICS), f"{pick[0]}: {exc}")
        return
    src = f"{pick[0]} parsed again"
    for name, value in ((Metric.WEIGHTS_GIB, rep.weights_gib), (Metric.KV_TOKENS_REPORTED, rep.kv_cache_tokens),
                        (Metric.AVAILABLE_KV_GIB, rep.available_kv_gib), (Metric.MAX_CONCURRENCY, rep.max_concurrency),
                        (Metric.CUDA_GRAPH_GIB, rep.cuda_graph_gib)):
        if value is None and name in a.row.metrics:
            stored = a.row.metrics[name]
            a.skip(name, f"the stored figure {stored:g} is negative, not a size; today's parser of {pick[0]} "
                         "refuses it (unknown)" if stored < 0 else
                         f"{src}: today's parser does not give it")
            continue
        a.check(name, _num(value), src)
    extra = rep.extra
    a.check(Metric.KV_MIB_REPORTED, _num(extra.get("kv_mib")), src)
    if isinstance(extra.get("kv_cells"), int):
        a.check(Metric.KV_CELLS_PER_STREAM, float(extra["kv_cells"]), src)
        a.check(Metric.KV_STREAMS, float(extra.get("kv_streams") or 1), src)
    # the derived errors: the log's figure again against the stored prediction (the prediction is not re-derived)
    m = a.row.metrics
    pred, rep_tokens = m.get(Metric.KV_TOKENS_PREDICTED), _num(rep.kv_cache_tokens)
    a.check(Metric.CAPACITY_ERROR_PCT, (rep_tokens - pred) / pred * 100.0 if pred and rep_tokens is not None else None,
            f"{src} against the stored {Metric.KV_TOKENS_PREDICTED}")
    pmib, rmib = m.get(Metric.KV_MIB_PREDICTED), _num(extra.get("kv_mib"))
    a.check(Metric.KV_MIB_ERROR_PCT, (rmib - pmib) / pmib * 100.0 if pmib and rmib is not None else None,
            f"{src} against the stored {Metric.KV_MIB_PREDICTED}")


# --- the sweep ------------------------------------------------------------------------------------------------

# per level: (metric figure, where in the artifact row); compared with the artifact (summaries of unstored samples)
_SWEEP_ARTIFACT = (("tpot_ms_p50", ("tpot_p50_ms",)), ("ttft_ms_p50", ("ttft_p50_ms",)),
                   *LEVEL_FIGURES, ("achieved_rate", ("achieved_rate",)))  # the writer's table, one spelling


def _dig(row: Any, path: tuple[str, ...]) -> float | None:
    for k in path:
        row = row.get(k) if isinstance(row, dict) else None
    return _num(row)


def _verify_sweep(a: _Arm) -> None:
    sweep = a.art.json(Artifact.SWEEP_SWEEP)
    names = [k for k in a.row.metrics if SWEEP_LEVEL.match(k)]
    rows = sweep.get("rows") if isinstance(sweep, dict) else None
    if not isinstance(rows, list):
        a.skip_all(names, f"no readable {Artifact.SWEEP_SWEEP}")
        return
    src = Artifact.SWEEP_SWEEP
    for lv in rows:
        if not isinstance(lv, dict):
            continue
        rate = lv.get("mode") == "rate" and _num(lv.get("rate")) is not None
        label = f"r{lv['rate']:g}" if rate else f"c{lv.get('concurrency')}"
        c = lv.get("concurrency")
        tps_name = sweep_level("output_tps", label) if rate or not isinstance(c, int) else sweep_output_tps(c)
        rps_name = sweep_level("request_tps", label) if rate or not isinstance(c, int) else sweep_request_tps(c)
        wall, tokens, n_ok = _num(lv.get("wall_s")), _num(lv.get("output_tokens")), _num(lv.get("n_ok"))
        if "runs" in lv:  # a level measured several times: the figure is the repeats' merge, kept as is
            a.check(tps_name, _num(lv.get("output_tok_s")), f"{src} {label} (merged repeats)", ARTIFACT)
            a.check(rps_name, _num(lv.get("request_s")), f"{src} {label} (merged repeats)", ARTIFACT)
        else:
            a.check(tps_name, tokens / wall if wall and tokens is not None and n_ok else None,
                    f"{src} {label}: output tokens / wall s")
            a.check(rps_name, n_ok / wall if wall and n_ok else None, f"{src} {label}: ok requests / wall s")
        for figure, path in _SWEEP_ARTIFACT:
            if not rate and isinstance(c, int) and figure in ("tpot_ms_p50", "ttft_ms_p50"):
                name = sweep_tpot_p50(c) if figure == "tpot_ms_p50" else sweep_ttft_p50(c)
            else:
                name = sweep_level(figure, label)
            a.check(name, _dig(lv, path), f"{src} {label} (per-request samples not stored)", ARTIFACT)
    a.skip_all(names, f"{src} has no level that gives it")


# --- the rest -------------------------------------------------------------------------------------------------

def _reason_for(name: str) -> str:
    if name.startswith("step_") and name.endswith("_s"):
        return "a step's wall time: no artifact keeps the timer"
    if name in (Metric.KV_TOKENS_PREDICTED, Metric.KV_MIB_PREDICTED):
        return "derived from the study and the model's config, not from the run's artifacts"
    if name.startswith("budget_"):
        return "the budget procedure's verdict: not recomputed by verify"
    if name.startswith(("latency_", "sweep_")) and ("_host_" in name or name.endswith("_gpu_other_processes")):
        return "measurement hygiene (contention samples): not recomputed by verify"
    return "verify has no recomputation for this figure"


def verify_run(row: RunRow, uri: str, runs: list[RunRow],
               records_of: Callable[[RunRow], _Gsm8k | None]) -> ArmVerification:
    a = _Arm(row, uri)
    gsm = records_of(row)
    _verify_gsm8k(a, gsm)
    _verify_delta(a, gsm, runs, records_of)
    _verify_latency(a)
    _verify_kl(a)
    _verify_log(a)
    _verify_sweep(a)
    checked = {c.name for c in a.out.checks}
    for name in a.row.metrics:
        if name not in checked:
            a.out.unchecked.setdefault(name, _reason_for(name))
    return a.out


def verify_experiment(experiment: str, tracking_uri: str | None = None) -> Verification:
    """Every arm run of ``experiment``: its stored figures against their recomputation from its artifacts."""
    from quantrack.errors import BadInput, QuantrackError
    from quantrack.store.tracking import load_runs, resolve_uri

    uri = resolve_uri(tracking_uri, create=False)
    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs in {uri}")
    cache: dict[str, _Gsm8k | None] = {}

    def records_of(r: RunRow) -> _Gsm8k | None:
        if r.run_id not in cache:
            text = _Artifacts(r, uri).text(Artifact.EVAL_RECORDS)
            try:
                cache[r.run_id] = gsm8k_from_records(text, _names(r)) if text else None
            except QuantrackError:
                cache[r.run_id] = None
        return cache[r.run_id]

    arms = [verify_run(r, uri, runs, records_of) for r in sorted(runs, key=lambda r: (r.start_time, r.run_id))]
    return Verification(experiment=experiment, uri=uri, arms=arms)


# --- rendering ------------------------------------------------------------------------------------------------

def _fmt(v: float | str | None, name: str) -> str:
    if name.startswith("quantrack.") and name.endswith("_correct"):
        return describe_outcomes(v)
    if isinstance(v, float):
        return f"{v:.10g}"
    return "none" if v is None else str(v)


def _first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"; first difference at position {i}: stored {x!r}, records {y!r}"
    return f"; lengths differ ({len(a)} vs {len(b)})" if len(a) != len(b) else ""


def render(v: Verification) -> str:
    head = (f"verify: experiment {v.experiment!r}, {len(v.arms)} arm run(s); agreement within a relative "
            f"{REL_TOL:g} (absolute {ABS_TOL:g})")
    lines = [head]
    for a in v.arms:
        lines.append(f"{a.arm} (run {a.run_id[:8]}, {a.status}): {a.count(RECOMPUTED)} recomputed from raw data, "
                     f"{a.count(ARTIFACT)} compared with their artifact's summary, {len(a.disagreements)} disagree; "
                     f"{len(a.unchecked)} stored metric(s) not recomputed")
        for c in a.disagreements:
            extra = (_first_difference(c.stored, c.recomputed)
                     if isinstance(c.stored, str) and isinstance(c.recomputed, str) else "")
            lines.append(f"  DISAGREES {c.name}: stored {_fmt(c.stored, c.name)}, recomputed "
                         f"{_fmt(c.recomputed, c.name)} ({c.basis}: {c.source}){extra}")
        by_reason: dict[str, list[str]] = {}
        for name, why in sorted(a.unchecked.items()):
            by_reason.setdefault(why, []).append(name)
        for why, names in by_reason.items():
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            lines.append(f"  not recomputed ({why}): {shown}")
    n_rec = sum(a.count(RECOMPUTED) for a in v.arms)
    n_art = sum(a.count(ARTIFACT) for a in v.arms)
    n_un = sum(len(a.unchecked) for a in v.arms)
    bad = v.disagreements
    verdict = (f"{len(bad)} figure(s) disagree with their recomputation" if bad else
               "every figure checked agrees")
    lines.append(f"verify: {verdict} ({n_rec} recomputed, {n_art} compared with an artifact's summary; "
                 f"{n_un} stored metric(s) not recomputed, listed above)")
    return "\n".join(lines) + "\n"


__all__ = ["ARTIFACT", "RECOMPUTED", "ArmVerification", "Check", "Verification", "gsm8k_from_records", "render",
           "stored_outcomes", "verify_experiment", "verify_run"]
