"""The steps of one arm, each a small function: node facts, preflight, predicted capacity, serve, parse
the startup log, live facts, latency, sweep, eval, KL, the speedup plot. Each returns its result; the
orchestration (``quantrack.run.orchestrate``) stores it in the arm's outcome."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.accuracy.gsm8k import TASKS
from quantrack.arms import Arm
from quantrack.errors import BadInput, QuantrackError
from quantrack.interrupts import Interrupted
from quantrack.redact import redact_argv, secret_values
from quantrack.run.outcome import ArmOutcome, Progress, StepError
from quantrack.study import Study

if TYPE_CHECKING:
    from quantrack.accuracy.gsm8k import EvalResult
    from quantrack.accuracy.kl import KLResult
    from quantrack.engines.base import LiveFacts, LogReport
    from quantrack.hardware.capacity import ArmPrediction
    from quantrack.measure.latency import LatencyResult
    from quantrack.measure.sweep import SweepResult

# --- node facts --------------------------------------------------------------------------------------------

def local_node(gpu_index: int = 0) -> dict[str, Any]:
    """This node: hostname, and from NVML (quantrack.hardware.nvml) GPU name, compute capability, driver, CUDA, MIG.

    Without a driver the GPU facts stay unknown (absent), never guessed."""
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    from quantrack.hardware.nvml import read_gpus

    try:
        gpus = read_gpus()
    except QuantrackError:
        return facts
    if len(gpus) > gpu_index:
        g = gpus[gpu_index]
        facts.update({"gpu_name": g.name, "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                      "driver": g.driver_version, "cuda_driver": g.cuda_driver_version, "mig": g.mig,
                      "gpu_memory_mib": g.memory_bytes // (1024 * 1024), "gpu_catalog_match": g.gpu.name})
    return facts


# --- a startup log given with the run (run --server-log, quantrack log) ---------------------------------------

def check_server_log(path: Path, engine: str, what: str = "--server-log") -> None:
    """A startup log of ``engine``, or one line (exit 2): a binary file, a file with no engine's lines, or
    another engine's log is refused, never parsed into a run that reads "no fallback"."""
    from quantrack.engines import DETECT_BYTES, detect_engine

    if not path.is_file():
        raise BadInput(f"{what} {str(path)!r}: no such file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(DETECT_BYTES)
    except OSError as exc:
        raise BadInput(f"{what} {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    if b"\x00" in head:
        raise BadInput(f"{what} {str(path)!r}: a binary file, not an engine's startup log")
    found = detect_engine(head.decode("utf-8", errors="replace"))
    if found is None:
        raise BadInput(f"{what} {str(path)!r}: no {engine} startup-log lines found (not a server log?)")
    if found != engine:
        raise BadInput(f"{what} {str(path)!r}: this is a {found} log, the study's engine is {engine} "
                       f"(pass --engine {found} if that is right)")



# --- steps -------------------------------------------------------------------------------------------------

def _gpu_for(study: Study, node: dict[str, Any]) -> Any:
    from quantrack.hardware.catalog import get_gpu

    name = study.gpu.name
    if name == "auto":
        name = node.get("gpu_name") or ""
        if not name:
            raise StepError("[gpu] name = \"auto\" but NVML found no GPU on this node; name the GPU in the study")
    return get_gpu(name)


def step_preflight(study: Study, arm: Arm, node: dict[str, Any]) -> tuple[str, list[Any]]:
    """The rulebook's verdict for this arm on this GPU with this engine, and the context check of
    `quantrack preflight` (preflight.context_verdicts: the model's maximum, the KV capacity or the memory):
    allow | warn | reject. A model whose shape cannot be read gets no context verdict, as in preflight."""
    from quantrack.hardware import rulebook
    from quantrack.hardware.preflight import PreflightRequest, arm_context_verdicts

    gpu = _gpu_for(study, node)
    verdicts = rulebook.evaluate(gpu, arm, study.engine.kind, study.engine.version, cuda=study.gpu.cuda,
                                 mig=node.get("mig"),
                                 study_context=rulebook.StudyContext(arms=study.arms, engine_env=study.engine.env))
    try:
        shape = _shape_for(study, arm)
    except QuantrackError:  # StepError included: no shape, no capacity (the predict step says why)
        shape = None
    if shape is not None and study.context_len:
        req = PreflightRequest(gpus=[gpu], arms=[arm], engine=study.engine.kind,
                               engine_version=study.engine.version, cuda=study.gpu.cuda, model=shape,
                               util=study.gpu.util, context_len=study.context_len, tp=study.gpu.count, study=study)
        verdicts = [*verdicts, *arm_context_verdicts(req, gpu, arm)]
    return rulebook.overall(verdicts), verdicts


def _shape_for(study: Study, arm: Arm) -> Any:
    m = study.model
    if m.name:
        from quantrack.models.hub import resolve_model

        return resolve_model(m.name)
    if m.config:
        from quantrack.models.hfconfig import load_hf_config

        return load_hf_config(m.config)
    gguf = arm.model if arm.model and arm.model.endswith(".gguf") else m.gguf
    if gguf:
        from quantrack.models.ggufmeta import load_gguf

        return load_gguf(gguf)
    raise StepError("[model] needs name, config or gguf for a capacity prediction")


def step_predict(study: Study, arm: Arm, node: dict[str, Any]) -> ArmPrediction:
    """Derived capacity for this arm (quantrack.hardware.capacity.predict_for_arm).

    llama.cpp: the KV cache is pure arithmetic (every cell allocated up front), predicted with the study's
    slots (-np) so cells per stream and streams match what the server prints."""
    from quantrack.engines import get_adapter
    from quantrack.hardware.capacity import (
        kv_cache_memory_bytes_in,
        predict_engine,
        predict_for_arm,
        whole_cache_prediction,
    )

    gpu = _gpu_for(study, node)
    shape = _shape_for(study, arm)
    # the argv order of the launch (arm args, then [engine] args): the last --kv-cache-memory-bytes wins
    kv_fixed = kv_cache_memory_bytes_in([*arm.engine_args, *study.engine.args])
    pred = predict_for_arm(shape, gpu, arm, study.engine.kind, util=study.gpu.util,
                           context_len=study.context_len, tp=study.gpu.count, kv_cache_memory_bytes=kv_fixed)
    if get_adapter(study.engine.kind).memory.slots and study.parallel > 1:
        eng = predict_engine(shape, float(gpu.total_bytes) or 1.0, arm, study.engine.kind,
                             context_len=study.context_len, n_parallel=study.parallel)
        pred = whole_cache_prediction(arm, study.engine.kind, eng)
    return pred


def check_model_folder(adapter: Any, served: str) -> None:
    """vLLM / SGLang read a missing local path as a Hub repository id and fail with a traceback (seen on the
    H200 when a calibrated checkpoint was not written): the arm fails first, naming the folder."""
    if not adapter.serving.local_file and served.startswith(("/", "./", "../")) and not Path(served).exists():
        raise StepError(f"model folder not found: {served} (a path is served from disk; it does not exist on "
                        "this machine)")


@contextlib.contextmanager
def step_serve(study: Study, arm: Arm, outcome: ArmOutcome, workdir: Path,
               progress: Progress) -> Iterator[str]:
    """Start the arm's server through its adapter and ManagedServer; yields the base URL; always stops it."""
    from quantrack.engines import get_adapter
    from quantrack.engines.lifecycle import ManagedServer, free_port
    from quantrack.engines.lifecycle import launch_spec_for_study as spec_for

    adapter = get_adapter(study.engine.kind)
    host = study.engine.host
    port = study.engine.port or free_port(host)
    model = arm.model or study.model.path or study.model.gguf or study.model.name
    if not model:
        raise StepError("[model] path (what the engine serves) is required to start a server")
    spec = spec_for(study, arm, port=port)  # the same spec `quantrack preflight` prints
    check_model_folder(adapter, spec.model)
    outcome.launch_argv, outcome.launch_env = adapter.launch_argv(spec), adapter.launch_env(spec)
    log_path = workdir / f"{arm.name}-server.log"
    outcome.server_log = log_path
    shown = " ".join(redact_argv(outcome.launch_argv, secret_values(outcome.launch_env)))
    progress(f"[{arm.name}] starting {study.engine.kind}: {shown}")
    server = ManagedServer.for_spec(adapter, spec, log_path=log_path, startup_timeout=study.engine.ready_timeout_s,
                                    name=f"{study.engine.kind}-{arm.name}")
    with server:
        outcome.engine_pid = server.pid
        progress(f"[{arm.name}] server ready at {server.base_url} (pid {server.pid})")
        outcome.engine_exit = lambda: None if server.proc is None else server.proc.poll()
        try:
            yield server.base_url
        finally:
            outcome.engine_exit = None
    progress(f"[{arm.name}] server stopped")


def step_parse_log(study: Study, log_path: Path) -> LogReport:
    from quantrack.engines import get_adapter

    return get_adapter(study.engine.kind).parse_log_file(log_path)


def step_query(study: Study, base_url: str) -> LiveFacts:
    from quantrack.engines import get_adapter

    return get_adapter(study.engine.kind).query(base_url, timeout=_request_timeout(study, 10.0))


def _request_timeout(study: Study, default: float) -> float:
    """``[engine] request_timeout_s`` when set (every request of every step), else the step's own default."""
    return study.engine.request_timeout_s or default


def step_latency(study: Study, arm: Arm, base_url: str, api_key: str | None, progress: Progress) -> LatencyResult:
    from quantrack.measure.latency import measure_latency
    from quantrack.progress import StepProgress

    lat = study.latency
    bar = StepProgress(progress, f"[{arm.name}] latency")
    try:
        return measure_latency(base_url, study.engine.kind, input_tokens=lat.input_tokens,
                               output_tokens=lat.output_tokens, warmup=lat.warmup, iterations=lat.iterations,
                               chat=lat.chat, api_key=api_key, model=study.model.served_name, label=arm.name,
                               timeout=_request_timeout(study, 60.0), progress=bar)
    finally:
        bar.close()


def step_sweep(study: Study, arm: Arm, base_url: str, api_key: str | None,
               progress: Progress | None = None,
               on_level: Callable[[SweepResult], None] | None = None) -> SweepResult:
    """The study's sweep; ``on_level`` gets the result as each level finishes (the arm's outcome holds every
    finished level whatever ends the step: a signal, a forced exit, the engine gone)."""
    from quantrack.measure.sweep import load_options, run_sweep  # type: ignore[import-not-found]
    from quantrack.progress import StepProgress

    sw = study.sweep
    bar = StepProgress(progress or (lambda _m: None), f"[{arm.name}] sweep")
    try:
        return run_sweep(base_url, study.engine.kind, concurrency=list(sw.concurrency), rates=list(sw.rates),
                         load=load_options(sw), requests_per_level=sw.requests_per_level or None,
                         input_tokens=sw.input_tokens or study.latency.input_tokens,
                         output_tokens=sw.output_tokens or study.latency.output_tokens, api_key=api_key,
                         model=study.model.served_name, timeout=_request_timeout(study, 300.0), progress=bar,
                         on_level=on_level)
    finally:
        bar.close()


def step_eval(study: Study, arm: Arm, base_url: str, api_key: str | None, workdir: Path,
              progress: Progress | None = None) -> tuple[EvalResult, Path]:
    from quantrack.accuracy.gsm8k import run_gsm8k
    from quantrack.progress import StepProgress

    ev = study.eval
    if ev.task not in TASKS:  # a task file or humaneval ([eval] task, checked when the study was read)
        return _step_task(study, arm, base_url, api_key, workdir, progress)
    records = eval_records_path(study, arm, workdir)
    bar = StepProgress(progress or (lambda _m: None), f"[{arm.name}] eval")
    budget = _budget_plan(study, arm, workdir)
    try:
        result = run_gsm8k(base_url, num_questions=ev.num_questions, num_shots=ev.num_shots,
                           max_tokens=ev.max_tokens, concurrency=ev.concurrency, seed=ev.seed, style=ev.style,
                           records_path=records, overwrite=True, api_key=api_key, model=study.model.served_name,
                           engine=study.engine.kind, timeout_s=_request_timeout(study, 600.0), progress=bar.gsm8k,
                           task=ev.task or "gsm8k", order=ev.order,
                           stop_rule=budget.stop_rule if budget is not None else None)
    except KeyboardInterrupt as exc:  # the questions answered so far are on disk: their result goes with it
        raise Interrupted.of(exc, partial=_partial_eval(records, ev.num_questions)) from None
    finally:
        bar.close()
    if budget is not None:
        _say_budget(result, budget, records, arm, progress)
    return result, records


def _say_budget(result: EvalResult, budget: _BudgetPlan, records: Path, arm: Arm, progress: Progress | None) -> None:
    """The arm's sequential budget verdict in its result (``extra["budget"]``) and on the console."""
    result.extra["budget"] = budget.verdict(records)
    if progress is not None:
        from quantrack.accuracy.budget import BudgetVerdict

        b = {k: v for k, v in result.extra["budget"].items() if k != "baseline"}
        progress(f"[{arm.name}] budget vs {budget.baseline}: {BudgetVerdict(**b).sentence()}")


def eval_records_path(study: Study, arm: Arm, workdir: Path) -> Path:
    """The arm's per-question records in the work folder: ``<arm>-gsm8k.jsonl``, or ``<arm>-<task>.jsonl``."""
    from quantrack.run.schema import task_prefix

    return workdir / f"{arm.name}-{task_prefix(study.eval.task)}.jsonl"


def _step_task(study: Study, arm: Arm, base_url: str, api_key: str | None, workdir: Path,
               progress: Progress | None) -> tuple[EvalResult, Path]:
    """A task file or humaneval, asked and scored like GSM8K: one record per item, and the outcome string in the
    task file's item order (so two arms' outcomes pair position by position)."""
    from quantrack.accuracy.gsm8k import result_from_records
    from quantrack.accuracy.records import load_records
    from quantrack.accuracy.tasks import resolve_task, run_task
    from quantrack.progress import StepProgress

    ev = study.eval
    assert ev.task is not None
    task = resolve_task(ev.task)
    records = eval_records_path(study, arm, workdir)
    bar = StepProgress(progress or (lambda _m: None), f"[{arm.name}] eval")
    budget = _budget_plan(study, arm, workdir)
    try:
        result = run_task(base_url, task, scorer=ev.scorer, num_questions=ev.num_questions, max_tokens=ev.max_tokens,
                          concurrency=ev.concurrency, seed=ev.seed, chat=ev.chat, records_path=records,
                          overwrite=True, api_key=api_key, model=study.model.served_name, engine=study.engine.kind,
                          progress=bar.gsm8k, timeout_s=_request_timeout(study, 600.0), order=ev.order,
                          stop_rule=budget.stop_rule if budget is not None else None)
    except KeyboardInterrupt as exc:  # the items answered so far are on disk: their result goes with it
        partial = None
        try:
            recs = load_records(records) if records.is_file() else {}
        except QuantrackError:
            recs = {}
        if recs:
            partial = (result_from_records(recs, num_questions=ev.num_questions, style=f"scorer:{ev.scorer}",
                                           records_path=str(records), settings={"interrupted": True,
                                                                                "task_sha256": task.sha256},
                                           task=task.name), records)
        raise Interrupted.of(exc, partial=partial) from None
    finally:
        bar.close()
    result.extra["outcomes"] = task_outcomes(task, load_records(records))
    if budget is not None:
        _say_budget(result, budget, records, arm, progress)
    return result, records


def task_outcomes(task: Any, recs: dict[Any, Any]) -> str:
    """'1' right, '0' wrong, '.' not answered, one per item of the task file in its order."""
    chars = []
    for item in task.items:
        r = recs.get(item["id"])
        chars.append("." if r is None or not r.answered else ("1" if r.correct else "0"))
    return "".join(chars)


class _BudgetPlan:
    """An arm's sequential budget test against the baseline's records of the same study (its work file)."""

    def __init__(self, fraction: float, baseline: str, base_records: dict[int, Any]) -> None:
        from quantrack.accuracy.budget import SequentialMonitor

        self.fraction = fraction
        self.baseline = baseline
        self.base = base_records
        self.monitor = SequentialMonitor(fraction)

    def stop_rule(self, rec: Any) -> bool:
        b = self.base.get(rec.id)
        if b is None or not b.answered or not rec.answered:
            return False
        return self.monitor.add(int(bool(rec.correct)) - int(bool(b.correct))) is not None

    def verdict(self, records: Path) -> dict[str, Any]:
        from quantrack.accuracy.paired import budget_verdict
        from quantrack.accuracy.records import load_records

        arm_recs = load_records(records)
        d = budget_verdict(self.base, arm_recs, None, self.fraction, sequential=True).to_dict()
        d["baseline"] = self.baseline
        return d


def _budget_plan(study: Study, arm: Arm, workdir: Path) -> _BudgetPlan | None:
    """With [eval] budget, a non-baseline arm stops when its verdict settles; the baseline asks every question."""
    if study.eval.budget is None or arm.baseline:
        return None
    from quantrack.accuracy.records import load_records
    from quantrack.constraints import parse_accuracy_drop

    base = study.baseline
    path = eval_records_path(study, base, workdir)
    if not path.is_file():
        return None  # no baseline records in this work directory: the arm asks every question (said in the run)
    recs = {q: r for q, r in load_records(path).items()}
    return _BudgetPlan(parse_accuracy_drop(study.eval.budget, "[eval] budget"), base.name, recs)


def _partial_eval(records: Path, num_questions: int) -> tuple[EvalResult, Path] | None:
    """The result of the questions answered before an interrupt (the records file is written per answer)."""
    from quantrack.accuracy.gsm8k import result_from_records
    from quantrack.accuracy.records import load_records, read_meta

    try:
        recs = load_records(records) if records.is_file() else {}
    except QuantrackError:  # a torn last line is dropped by load_records; anything worse: no partial result
        return None
    if not recs:
        return None
    meta = read_meta(records) or {}
    return result_from_records(recs, num_questions=num_questions, style=meta.get("style"),
                               records_path=str(records), settings={**meta, "interrupted": True}), records


def step_kl(study: Study, arm: Arm, base_url: str, baseline: Arm, workdir: Path, progress: Progress) -> KLResult:
    """KL / top-1 agreement of this arm against a freshly started baseline server (stopped afterwards).

    Runs after latency and sweep, so the second server never shares the cores with the timed requests."""
    from quantrack.accuracy.kl import run_kl
    from quantrack.engines.lifecycle import kl_baseline_server

    ev = study.eval
    if not (baseline.model or study.model.path or study.model.gguf):
        raise StepError(f"the baseline arm {baseline.name!r} has no model file to serve")
    srv = kl_baseline_server(study, baseline, log_path=workdir / f"{arm.name}-kl-baseline-server.log")
    step = max(1, ev.kl_tokens // 4)
    last = [0]

    def say(msg: str) -> None:  # "N/T positions (...)": one line per quarter
        done = int(msg.split("/", 1)[0]) if msg.split("/", 1)[0].isdigit() else 0
        if done - last[0] >= step or done >= ev.kl_tokens:
            last[0] = done
            progress(f"[{arm.name}] kl: {msg}")

    with srv:
        progress(f"[{arm.name}] kl: baseline {baseline.name!r} served at {srv.base_url} (pid {srv.pid}) "
                 "for the KL run only")
        return run_kl(srv.base_url, base_url, study.engine.kind, tokens=ev.kl_tokens, top_k=ev.kl_top_k,
                      progress=say, timeout_s=_request_timeout(study, 300.0), method=ev.kl_method)


def step_engine_plot(arm: Arm, sweep: SweepResult, workdir: Path) -> Path | None:
    """The engine's scraped KV usage, running/waiting requests and prefix-cache hits per level, as a PNG."""
    from quantrack.report.plots import plot_engine_metrics

    return plot_engine_metrics(sweep.rows, workdir / f"engine-{arm.name}.png", label=arm.name)


def step_plot(arm: Arm, sweep: SweepResult, baseline: ArmOutcome, workdir: Path,
              contended: bool | None = None) -> Path:
    """This arm's measured speedup over the baseline against concurrency (both sweeps), as a PNG; its title
    carries the contention either sweep was measured under (``contended``: this arm's sweep)."""
    from quantrack.report.plots import contention_note, plot_speedup

    base_h = baseline.hygiene.get("sweep")
    note = contention_note({baseline.arm.name: base_h.contended if base_h is not None else None,
                            arm.name: contended})
    return plot_speedup(baseline.sweep.rows if baseline.sweep else [], sweep.rows,
                        workdir / f"speedup-{arm.name}-vs-{baseline.arm.name}.png",
                        label_a=baseline.arm.name, label_b=arm.name, contention=note)
