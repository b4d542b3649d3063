"""Study orchestration: every arm preflighted, served, measured and logged as one MLflow run.

Per arm, as small steps (a missing or failing step fails that arm cleanly, the study goes on):

    preflight verdict (rulebook)  -> a rejected arm is logged as rejected (status KILLED), never started
    predicted capacity            (quantrack.capacity.predict_for_arm; derived)
    serve                         (engine adapter launch argv + ManagedServer, log captured) or --base-url
    parse startup log             (adapter.parse_log_file -> LogReport; measured)
    live query                    (adapter.query)
    latency                       (quantrack.measure.latency.measure_latency; measured)
    sweep                         (quantrack.measure.sweep.run_sweep, when [sweep] concurrency is set)
    eval                          (quantrack.accuracy.gsm8k.run_gsm8k, when [eval] task = "gsm8k")
    speedup plot                  (quantrack.report.plots.plot_speedup: this arm's sweep vs the baseline's)
    kl                            (quantrack.accuracy.kl.run_kl, when [eval] kl_tokens > 0, non-baseline arms)
    -> one run (FINISHED, or FAILED with everything measured up to the failure), then the server stops.

KL needs the baseline served next to the candidate. The baseline's own server is stopped when its arm ends
(an idle server would share the cores with the next arm's latency timing); for each candidate a fresh
baseline server (same file, same KV type, one slot) is started *after* the candidate's latency, sweep and
eval, scored against, and stopped. Arm ``model`` values may be model references (``smollm2:Q8_0``,
quantrack.models_ref), resolved to local files, provisioned on first use, before any arm runs.

The study is a parent run; arms are nested runs in the same experiment. ``record_for_arm`` turns an
``ArmOutcome`` into a ``RunRecord`` (pure) and is shared with ``quantrack log``. After the arms, the study
prints the compare table of this study's runs (quantrack.report.compare) and the speedup plot paths.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.errors import BadInput, QuantrackError
from quantrack.redact import redact_argv, redact_env, secret_values
from quantrack.study import Study
from quantrack.tracking import Logged, RunRecord, Tracker, provenance_tags

Progress = Callable[[str], None]

# Status of an arm the rulebook rejected: it was never started (MLflow has no "rejected" status).
STATUS_REJECTED = "KILLED"


class StepError(QuantrackError):
    """One step of one arm failed; the arm is logged FAILED with what it measured so far."""

    exit_code = 1


@dataclass
class ArmOutcome:
    """Everything one arm produced (any field may be None: not measured)."""

    arm: Arm
    status: str = "RUNNING"
    verdict: str | None = None
    verdicts: list[Any] = field(default_factory=list)
    predicted: Any = None
    launch_argv: list[str] | None = None
    launch_env: dict[str, str] = field(default_factory=dict)
    server_log: Path | None = None
    base_url: str | None = None
    log_report: Any = None
    live: dict[str, Any] | None = None
    latency: Any = None  # LatencyResult
    latency_row: dict[str, Any] | None = None  # an imported latency row (quantrack log)
    sweep: Any = None
    eval: Any = None  # EvalResult
    eval_records: Path | None = None
    kl: Any = None  # KLResult against the baseline arm
    model_ref: str | None = None  # the study's model reference (smollm2:Q8_0) the file was resolved from
    plots: dict[str, Path] = field(default_factory=dict)  # artifact path -> local PNG
    node: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    failed_step: str | None = None
    steps: list[str] = field(default_factory=list)  # steps that completed
    step_s: dict[str, float] = field(default_factory=dict)  # wall seconds per completed step (measured)
    start_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    source: str = "run"  # run | log


@dataclass
class RunOptions:
    arm: str | tuple[str, ...] | None = None  # one arm name or several (`--arm` is repeatable); None: all
    base_url: str | None = None
    server_log: str | None = None
    tracking_uri: str | None = None
    api_key: str | None = None  # for the engine's OpenAI API; never logged
    prices: str | None = None  # --prices FILE for the closing compare table's cost column (None: shipped prices)
    workdir: Path | None = None  # server logs and eval records go here


@dataclass
class StudyResult:
    study: Study
    experiment: str
    outcomes: list[ArmOutcome]
    parent: Logged | None
    logged: dict[str, Logged]
    table: str | None = None  # the compare table of this study's arm runs (rendered)
    plots: list[Path] = field(default_factory=list)
    wall_s: float | None = None

    @property
    def failed(self) -> list[str]:
        return [o.arm.name for o in self.outcomes if o.status == "FAILED"]


# --- node facts --------------------------------------------------------------------------------------------

def node_facts(gpu_index: int = 0) -> dict[str, Any]:
    """This node: hostname, and from NVML (quantrack.nvml) GPU name, compute capability, driver, CUDA, MIG.

    Without a driver the GPU facts stay unknown (absent), never guessed."""
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    from quantrack.nvml import read_gpus

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


# --- steps -------------------------------------------------------------------------------------------------

def _gpu_for(study: Study, node: dict[str, Any]) -> Any:
    from quantrack.catalog import get_gpu

    name = study.gpu.name
    if name == "auto":
        name = node.get("gpu_name") or ""
        if not name:
            raise StepError("[gpu] name = \"auto\" but NVML found no GPU on this node; name the GPU in the study")
    return get_gpu(name)


def step_preflight(study: Study, arm: Arm, node: dict[str, Any]) -> tuple[str, list[Any]]:
    """The rulebook's verdict for this arm on this GPU with this engine: allow | warn | reject."""
    from quantrack import rulebook

    gpu = _gpu_for(study, node)
    verdicts = rulebook.evaluate(gpu, arm, study.engine.kind, study.engine.version, cuda=study.gpu.cuda,
                                 mig=node.get("mig"),
                                 study_context=rulebook.StudyContext(arms=study.arms, engine_env=study.engine.env))
    return rulebook.overall(verdicts), verdicts


def _shape_for(study: Study, arm: Arm) -> Any:
    m = study.model
    if m.name:
        from quantrack.hub import resolve_model

        return resolve_model(m.name)
    if m.config:
        from quantrack.hfconfig import load_hf_config

        return load_hf_config(m.config)
    gguf = arm.model if arm.model and arm.model.endswith(".gguf") else m.gguf
    if gguf:
        from quantrack.ggufmeta import load_gguf

        return load_gguf(gguf)
    raise StepError("[model] needs name, config or gguf for a capacity prediction")


def step_predict(study: Study, arm: Arm, node: dict[str, Any]) -> dict[str, Any]:
    """Derived capacity for this arm (quantrack.capacity.predict_for_arm).

    llama.cpp: the KV cache is pure arithmetic (every cell allocated up front), predicted with the study's
    slots (-np) so cells per stream and streams match what the server prints."""
    from quantrack.capacity import MiB, predict_engine, predict_for_arm

    gpu = _gpu_for(study, node)
    shape = _shape_for(study, arm)
    pred = predict_for_arm(shape, gpu, arm, study.engine.kind, util=study.gpu.util,
                           context_len=study.context_len, tp=study.gpu.count)
    if study.engine.kind == "llamacpp" and study.parallel > 1:
        eng = predict_engine(shape, float(gpu.total_bytes) or 1.0, arm, "llamacpp", context_len=study.context_len,
                             n_parallel=study.parallel)
        pred.update({"engine_tokens": eng.engine_tokens, "engine_kv_bytes": eng.kv_bytes,
                     "engine_kv_mib": round(eng.kv_bytes / MiB, 2), "prediction": eng.to_dict()})
    return pred


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    outcome.launch_argv, outcome.launch_env = adapter.launch_argv(spec), adapter.launch_env(spec)
    log_path = workdir / f"{arm.name}-server.log"
    outcome.server_log = log_path
    shown = " ".join(redact_argv(outcome.launch_argv, secret_values(outcome.launch_env)))
    progress(f"[{arm.name}] starting {study.engine.kind}: {shown}")
    server = ManagedServer.for_spec(adapter, spec, log_path=log_path, startup_timeout=study.engine.ready_timeout_s,
                                    name=f"{study.engine.kind}-{arm.name}")
    with server:
        progress(f"[{arm.name}] server ready at {server.base_url} (pid {server.pid})")
        yield server.base_url
    progress(f"[{arm.name}] server stopped")


def step_parse_log(study: Study, log_path: Path) -> Any:
    from quantrack.engines import get_adapter

    return get_adapter(study.engine.kind).parse_log_file(log_path)


def step_query(study: Study, base_url: str) -> dict[str, Any]:
    from quantrack.engines import get_adapter

    return dict(get_adapter(study.engine.kind).query(base_url, timeout=_request_timeout(study, 10.0)))


def _request_timeout(study: Study, default: float) -> float:
    """``[engine] request_timeout_s`` when set (every request of every step), else the step's own default."""
    return study.engine.request_timeout_s or default


def step_latency(study: Study, arm: Arm, base_url: str, api_key: str | None, progress: Progress) -> Any:
    from quantrack.measure.latency import measure_latency

    lat = study.latency
    return measure_latency(base_url, study.engine.kind, input_tokens=lat.input_tokens,
                           output_tokens=lat.output_tokens, warmup=lat.warmup, iterations=lat.iterations,
                           chat=lat.chat, api_key=api_key, model=study.model.served_name, label=arm.name,
                           timeout=_request_timeout(study, 60.0))


def step_sweep(study: Study, arm: Arm, base_url: str, api_key: str | None) -> Any:
    from quantrack.measure.sweep import run_sweep  # type: ignore[import-not-found]

    sw = study.sweep
    return run_sweep(base_url, study.engine.kind, concurrency=list(sw.concurrency),
                     requests_per_level=sw.requests_per_level or None,
                     input_tokens=sw.input_tokens or study.latency.input_tokens,
                     output_tokens=sw.output_tokens or study.latency.output_tokens, api_key=api_key,
                     model=study.model.served_name, timeout=_request_timeout(study, 300.0))


def step_eval(study: Study, arm: Arm, base_url: str, api_key: str | None, workdir: Path) -> tuple[Any, Path]:
    from quantrack.accuracy.gsm8k import run_gsm8k

    ev = study.eval
    records = workdir / f"{arm.name}-gsm8k.jsonl"
    result = run_gsm8k(base_url, num_questions=ev.num_questions, num_shots=ev.num_shots, max_tokens=ev.max_tokens,
                       concurrency=ev.concurrency, seed=ev.seed, style=ev.style, records_path=records,
                       overwrite=True, api_key=api_key, model=study.model.served_name, engine=study.engine.kind,
                       timeout_s=_request_timeout(study, 600.0))
    return result, records


def step_kl(study: Study, arm: Arm, base_url: str, baseline: Arm, workdir: Path, progress: Progress) -> Any:
    """KL / top-1 agreement of this arm against a freshly started baseline server (stopped afterwards).

    Runs after latency and sweep, so the second server never shares the cores with the timed requests."""
    from quantrack.accuracy.kl import run_kl
    from quantrack.engines.lifecycle import server_for_arm

    ev = study.eval
    model = baseline.model or study.model.path or study.model.gguf
    if not model:
        raise StepError(f"the baseline arm {baseline.name!r} has no model file to serve")
    # one slot (KL requests are sequential per server) and one thread: the candidate keeps its own threads
    util = ev.kl_baseline_util if ev.kl_baseline_util is not None else study.gpu.util
    srv = server_for_arm(study.engine.kind, model, baseline, host=study.engine.host, context_len=study.context_len,
                         util=None if study.engine.kind == "llamacpp" else util, parallel=1, extra_args=(*study.engine.args, "-t", "1") if study.engine.kind == "llamacpp"
                         else tuple(study.engine.args), env=dict(study.engine.env), binary=study.engine.binary,
                         log_path=workdir / f"{arm.name}-kl-baseline-server.log",
                         startup_timeout=study.engine.ready_timeout_s)
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
                      progress=say, timeout_s=_request_timeout(study, 300.0))


def sweep_rows(sweep: Any) -> list[dict[str, Any]]:
    rows = getattr(sweep, "rows", None) or (sweep.get("rows") if isinstance(sweep, dict) else None) or []
    return [r for r in rows if isinstance(r, dict)]


def step_plot(arm: Arm, sweep: Any, baseline: ArmOutcome, workdir: Path) -> Path:
    """This arm's measured speedup over the baseline against concurrency (both sweeps), as a PNG."""
    from quantrack.report.plots import plot_speedup

    return plot_speedup(sweep_rows(baseline.sweep), sweep_rows(sweep),
                        workdir / f"speedup-{arm.name}-vs-{baseline.arm.name}.png",
                        label_a=baseline.arm.name, label_b=arm.name)


def _run_step(outcome: ArmOutcome, name: str, fn: Callable[[], Any]) -> Any:
    """Run one step; any failure becomes a one-line StepError naming the step."""
    t0 = time.perf_counter()
    try:
        value = fn()
    except StepError as exc:
        raise StepError(f"{name}: {exc}") from None
    except ImportError as exc:
        raise StepError(f"{name}: not available in this quantrack ({exc})") from None
    except QuantrackError as exc:
        raise StepError(f"{name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - an engine or network failure fails the arm, not the study
        raise StepError(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    outcome.steps.append(name)
    outcome.step_s[name] = round(time.perf_counter() - t0, 2)
    return value


def run_arm(study: Study, arm: Arm, opts: RunOptions, workdir: Path, node: dict[str, Any],
            progress: Progress, baseline: ArmOutcome | None = None) -> ArmOutcome:
    """All steps of one arm; never raises for a step failure (the outcome says FAILED and where).

    ``baseline``: the baseline arm's finished outcome (its sweep for the speedup plot; KL is measured
    against its model when [eval] kl_tokens is set)."""
    out = ArmOutcome(arm=arm, node=dict(node))
    say = progress
    t_arm = time.perf_counter()
    try:
        verdict, verdicts = _run_step(out, "preflight", lambda: step_preflight(study, arm, node))
        out.verdict, out.verdicts = verdict, list(verdicts)
        say(f"[{arm.name}] preflight: {verdict}")
        if verdict == "reject":
            out.status = STATUS_REJECTED
            return out
        with contextlib.suppress(StepError):  # a prediction is a comparison aid, not a reason to fail
            out.predicted = _run_step(out, "predict", lambda: step_predict(study, arm, node))
        with contextlib.ExitStack() as stack:
            if opts.base_url:
                out.base_url = opts.base_url
                out.server_log = Path(opts.server_log) if opts.server_log else None
            else:
                out.base_url = _run_step(out, "serve", lambda: stack.enter_context(
                    step_serve(study, arm, out, workdir, say)))
            base_url = out.base_url
            assert base_url is not None
            if out.server_log is not None:
                log = out.server_log
                out.log_report = _run_step(out, "parse_log", lambda: step_parse_log(study, log))
                _say_log(say, arm, out.log_report)
            with contextlib.suppress(StepError):  # live facts are optional (not every engine exposes all)
                out.live = _run_step(out, "query", lambda: step_query(study, base_url))
            _say_capacity(say, arm, out)
            lat = study.latency
            say(f"[{arm.name}] latency: batch 1, {lat.input_tokens} in / {lat.output_tokens} out, "
                f"{lat.warmup} warmup + {lat.iterations} iterations")
            out.latency = _run_step(out, "latency", lambda: step_latency(study, arm, base_url, opts.api_key, say))
            _say_latency(say, arm, out.latency, out.step_s.get("latency"))
            if study.sweep.concurrency:
                say(f"[{arm.name}] sweep: concurrency {list(study.sweep.concurrency)}")
                out.sweep = _run_step(out, "sweep", lambda: step_sweep(study, arm, base_url, opts.api_key))
                _say_sweep(say, arm, out.sweep, out.step_s.get("sweep"))
                if baseline is not None and baseline.sweep is not None and not arm.baseline:
                    with contextlib.suppress(StepError):  # a plot is a view of measured rows, not a measurement
                        png = _run_step(out, "plot", lambda: step_plot(arm, out.sweep, baseline, workdir))
                        out.plots[f"plots/{png.name}"] = png
                        say(f"[{arm.name}] speedup plot vs {baseline.arm.name}: {png}")
            if study.eval.task:
                ev = study.eval
                say(f"[{arm.name}] eval: {ev.task}, {ev.num_questions} questions, {ev.num_shots}-shot, "
                    f"max_tokens {ev.max_tokens}")
                out.eval, out.eval_records = _run_step(
                    out, "eval", lambda: step_eval(study, arm, base_url, opts.api_key, workdir))
                _say_eval(say, arm, out.eval, out.step_s.get("eval"))
            if study.kl_wanted(arm):
                if opts.base_url:
                    out.steps.append("kl: not run (--base-url: quantrack serves no baseline next to it)")
                else:
                    base_arm = baseline.arm if baseline is not None else study.baseline
                    say(f"[{arm.name}] kl: {study.eval.kl_tokens} positions, top-{study.eval.kl_top_k}, "
                        f"against {base_arm.name}")
                    out.kl = _run_step(out, "kl", lambda: step_kl(study, arm, base_url, base_arm, workdir, say))
                    say(f"[{arm.name}] kl: top-1 agreement {out.kl.top1_agree * 100:.1f}%, "
                        f"mean KL {out.kl.kl_mean:.4f} nats over {out.kl.n_positions} positions (measured)"
                        f"{_took(out.step_s.get('kl'))}")
        out.status = "FINISHED"
        say(f"[{arm.name}] done in {time.perf_counter() - t_arm:.0f} s")
    except StepError as exc:
        out.status, out.error = "FAILED", str(exc)
        out.failed_step = str(exc).split(":", 1)[0]
        say(f"[{arm.name}] FAILED at {exc}")
    except KeyboardInterrupt:
        out.status, out.error, out.failed_step = "KILLED", "interrupted", "interrupted"
        raise
    return out


def kv_figures(out: ArmOutcome) -> dict[str, float]:
    """KV cache predicted (derived) vs reported (the engine log), in MiB and cells, when both exist."""
    rep, pred = out.log_report, out.predicted
    extra = getattr(rep, "extra", None) or {}
    figs: dict[str, float] = {}
    rep_mib = extra.get("kv_mib")
    pred_mib = _num(pred, "engine_kv_mib") if pred is not None else None
    if isinstance(rep_mib, (int, float)):
        figs["kv_mib_reported"] = float(rep_mib)
    if pred_mib is not None:
        figs["kv_mib_predicted"] = pred_mib
    if "kv_mib_reported" in figs and pred_mib:
        figs["kv_mib_error_pct"] = (figs["kv_mib_reported"] - pred_mib) / pred_mib * 100.0
    if isinstance(extra.get("kv_cells"), int):
        figs["kv_cells_per_stream"] = float(extra["kv_cells"])
        figs["kv_streams"] = float(extra.get("kv_streams") or 1)
    return figs


def _say_capacity(say: Progress, arm: Arm, out: ArmOutcome) -> None:
    rep, figs = out.log_report, kv_figures(out)
    reported = getattr(rep, "kv_cache_tokens", None)
    predicted = _num(out.predicted, "engine_tokens") if out.predicted is not None else None
    parts = []
    if predicted is not None or reported is not None:
        parts.append(f"KV tokens predicted {_fmt_int(predicted)} (derived) vs reported {_fmt_int(reported)} (log)")
    if "kv_mib_predicted" in figs or "kv_mib_reported" in figs:
        parts.append(f"KV MiB predicted {figs.get('kv_mib_predicted', 'n/a')} vs reported "
                     f"{figs.get('kv_mib_reported', 'n/a')}")
    if predicted and reported is not None:
        parts.append(f"capacity error {(reported - predicted) / predicted * 100:+.2f}%")
    if parts:
        say(f"[{arm.name}] capacity: {'; '.join(parts)}")


def _fmt_int(x: float | None) -> str:
    return "n/a" if x is None else f"{round(x):,}"


def _took(seconds: float | None) -> str:
    return "" if seconds is None else f" [{seconds:.0f} s]"


def _say_latency(say: Progress, arm: Arm, lat: Any, seconds: float | None = None) -> None:
    st = lat.stats() if hasattr(lat, "stats") else {}
    tpot, srv, ttft = st.get("tpot_ms"), st.get("server_tpot_ms"), st.get("ttft_ms")
    if tpot is None:
        say(f"[{arm.name}] latency: no successful sample")
        return
    line = f"[{arm.name}] latency: TPOT median {tpot.median:.2f} ms (client)"
    if srv is not None:
        diff = lat.tpot_vs_server_median_pct()
        line += f", server {srv.median:.2f} ms (llama.cpp timings)" if lat.engine == "llamacpp" else \
            f", server {srv.median:.2f} ms"
        if diff is not None:
            line += f", difference {diff:+.2f}%"
    if ttft is not None:
        line += f"; TTFT median {ttft.median:.1f} ms"
    say(line + f" (n={len(lat.ok_samples)}){_took(seconds)}")


def _say_sweep(say: Progress, arm: Arm, sweep: Any, seconds: float | None = None) -> None:
    cells = []
    for r in sweep_rows(sweep):
        tps = r.get("output_tok_s")
        cells.append(f"c{r.get('concurrency')}: {tps:.1f} tok/s" if isinstance(tps, (int, float)) else
                     f"c{r.get('concurrency')}: n/a")
    if cells:
        say(f"[{arm.name}] sweep: output throughput {', '.join(cells)} (measured){_took(seconds)}")


def _say_eval(say: Progress, arm: Arm, ev: Any, seconds: float | None = None) -> None:
    acc, n = _num(ev, "accuracy"), _num(ev, "n")
    lo, hi = _num(ev, "ci_low"), _num(ev, "ci_high")
    if acc is None:
        say(f"[{arm.name}] eval: no question answered")
        return
    ci = f", 95% interval {lo * 100:.0f}-{hi * 100:.0f}%" if lo is not None and hi is not None else ""
    say(f"[{arm.name}] eval: GSM8K {acc * 100:.0f}% of {int(n or 0)} questions{ci} (measured; a small "
        f"sample: the interval, not the point, is the result){_took(seconds)}")


def _say_log(say: Progress, arm: Arm, rep: Any) -> None:
    if rep is None:
        return
    parts = []
    if getattr(rep, "weights_gib", None) is not None:
        parts.append(f"weights {rep.weights_gib} GiB")
    extra = getattr(rep, "extra", None) or {}
    if extra.get("file_type"):
        parts.insert(0, f"file type {extra['file_type']}")
    if getattr(rep, "kv_cache_tokens", None) is not None:
        parts.append(f"KV {rep.kv_cache_tokens:,} tokens")
    if extra.get("kv_mib") is not None:
        parts.append(f"KV {extra['kv_mib']} MiB (K {extra.get('k_type')} {extra.get('k_mib')} MiB, "
                     f"V {extra.get('v_type')} {extra.get('v_mib')} MiB)")
    if getattr(rep, "attention_backend", None):
        parts.append(f"attention {rep.attention_backend}")
    if getattr(rep, "fallbacks", None):
        parts.append("FALLBACK: " + ", ".join(e.kind for e in rep.fallbacks))
    say(f"[{arm.name}] log: {'; '.join(parts) or 'no figures found'}")


# --- records -----------------------------------------------------------------------------------------------

def _num(obj: Any, *names: str) -> float | None:
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            return float(v)
    return None


def outcomes_bitmap(records_path: Path | None) -> tuple[str | None, str | None]:
    """Per-question outcomes as a compact tag ('1' right, '0' wrong, '.' unanswered) + the data hash."""
    if records_path is None or not Path(records_path).is_file():
        return None, None
    from quantrack.accuracy.records import load_records, read_meta

    recs = load_records(Path(records_path))
    if not recs or max(recs) >= 8000:
        return None, None
    chars = ["."] * (max(recs) + 1)
    for qid, r in recs.items():
        if r.answered:
            chars[qid] = "1" if r.correct else "0"
    meta = read_meta(Path(records_path)) or {}
    return "".join(chars), meta.get("data_sha256")


def record_for_arm(study: Study, out: ArmOutcome, *, experiment: str, parent_uuid: str | None = None,
                   baseline_accuracy: float | None = None, extra_secrets: tuple[str, ...] = ()) -> RunRecord:
    """The run for one arm: fixed param/metric/tag names (docs/tracking.md)."""
    arm = out.arm
    rec = RunRecord(experiment=experiment, run_name=arm.name, parent_uuid=parent_uuid, start_ms=out.start_ms)
    rec.secrets = secret_values({**dict(study.engine.env), **out.launch_env, **arm.env_dict}, extra_secrets)
    rep, live, node = out.log_report, out.live or {}, out.node
    # params: what was run, where
    rec.param("study", study.name)
    rec.param("arm", arm.name)
    rec.param("engine", study.engine.kind)
    rec.param("engine_version", getattr(rep, "engine_version", None) or live.get("engine_version")
              or study.engine.version)
    rec.param("model", arm.model or study.model.path or study.model.gguf or study.model.name)
    rec.param("model_name", study.model.name)
    rec.param("model_ref", out.model_ref)
    rec.param("model_revision", study.model.revision)
    rec.param("weights", arm.weights)
    rec.param("quantization", arm.quantization or "none")
    rec.param("kv_cache_dtype", arm.kv)
    rec.param("kv_cache_dtype_effective", _effective_kv(arm, rep))
    rec.param("dtype", arm.dtype)
    rec.param("dtype_effective", getattr(rep, "dtype", None))
    rec.param("engine_args", list(redact_argv(arm.engine_args)) or None)
    rec.param("gpu_name", node.get("gpu_name") or (study.gpu.name if study.gpu.name != "auto" else None))
    rec.param("gpu_catalog", study.gpu.name)
    rec.param("compute_capability", node.get("compute_capability"))
    rec.param("driver", node.get("driver"))
    rec.param("cuda_driver", node.get("cuda_driver"))
    rec.param("cuda", study.gpu.cuda)
    rec.param("mig", node.get("mig"))
    rec.param("hostname", node.get("hostname"))
    rec.param("gpu_util", study.gpu.util)
    rec.param("max_model_len", study.context_len)
    rec.param("tp", study.gpu.count)
    rec.param("parallel", study.parallel if study.engine.kind == "llamacpp" else None)
    rec.param("input_tokens", study.latency.input_tokens)
    rec.param("output_tokens", study.latency.output_tokens)
    rec.param("latency_warmup", study.latency.warmup)
    rec.param("latency_iterations", study.latency.iterations)
    rec.param("latency_endpoint", "chat" if study.latency.chat else "completions")
    if study.sweep.concurrency:
        rec.param("sweep_concurrency", ",".join(str(c) for c in study.sweep.concurrency))
    if study.eval.task:
        rec.param("eval_task", study.eval.task)
        rec.param("eval_num_questions", study.eval.num_questions)
        rec.param("eval_num_shots", study.eval.num_shots)
        rec.param("eval_max_tokens", study.eval.max_tokens)
        rec.param("eval_seed", study.eval.seed)
        rec.param("eval_style", study.eval.style)
    if study.kl_wanted(arm):
        rec.param("kl_tokens", study.eval.kl_tokens)
        rec.param("kl_top_k", study.eval.kl_top_k)
        rec.param("kl_baseline", study.baseline.name)
    # tags
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag("quantrack.role", "arm")
    rec.tag("quantrack.study", study.name)
    rec.tag("quantrack.arm", arm.name)
    rec.tag("quantrack.source", out.source)
    rec.tag("quantrack.baseline", "true" if arm.baseline else "false")
    rec.tag("quantrack.verdict", out.verdict)
    rec.tag("quantrack.rule_ids", ",".join(sorted({getattr(v, "rule_id", "") for v in out.verdicts
                                                    if getattr(v, "verdict", "allow") != "allow"} - {""})) or None)
    if out.error:
        rec.tag("quantrack.error", out.error)
        rec.tag("quantrack.failed_step", out.failed_step)
    if rep is not None:
        fbs = list(getattr(rep, "fallbacks", []) or [])
        rec.tag("quantrack.fallback", "yes" if fbs else "no")
        if fbs:
            rec.tag("quantrack.fallback_kinds", ",".join(sorted({e.kind for e in fbs})))
            rec.tag("quantrack.fallback_evidence", f"{Path(str(rep.source or 'log')).name}:{fbs[0].line_no}: "
                                                    f"{fbs[0].line.strip()}")
        rec.tag("quantrack.effective_kernel", getattr(rep, "linear_kernel", None))
        rec.tag("quantrack.attention_backend", getattr(rep, "attention_backend", None))
        rec.tag("quantrack.log_quantization", getattr(rep, "quantization", None))
        rec.tag("quantrack.log_not_found", ",".join(getattr(rep, "not_found", []) or []) or None)
    # metrics: capacity (measured from the log; predicted is derived)
    if rep is not None:
        rec.metric("weights_gib", rep.weights_gib)
        rec.metric("kv_tokens_reported", rep.kv_cache_tokens)
        rec.metric("available_kv_gib", rep.available_kv_gib)
        rec.metric("max_concurrency", rep.max_concurrency)
        rec.metric("cuda_graph_gib", rep.cuda_graph_gib)
    predicted_tokens = _num(out.predicted, "engine_tokens")
    rec.metric("kv_tokens_predicted", predicted_tokens)
    reported = getattr(rep, "kv_cache_tokens", None)
    if predicted_tokens and reported is not None:
        rec.metric("capacity_error_pct", (reported - predicted_tokens) / predicted_tokens * 100.0)
    for key, value in kv_figures(out).items():
        rec.metric(key, value)
    for step, seconds in out.step_s.items():
        rec.metric(f"step_{step}_s", seconds)
    _latency_metrics(rec, out)
    _sweep_metrics(rec, out.sweep)
    _eval_metrics(rec, out, baseline_accuracy)
    if out.kl is not None and hasattr(out.kl, "metrics"):
        for k, v in out.kl.metrics().items():
            rec.metric(k, v)
    rec.tag("quantrack.derived_metrics", "kv_tokens_predicted,capacity_error_pct,kv_mib_predicted,kv_mib_error_pct,"
                                         "tpot_vs_server_pct,gsm8k_delta_vs_baseline")
    # artifacts
    if out.launch_argv:
        rec.artifacts["launch/command.txt"] = " ".join(redact_argv(out.launch_argv, rec.secrets)) + "\n"
        rec.artifacts["launch/env.json"] = json.dumps(redact_env(out.launch_env), indent=1, sort_keys=True)
    if out.server_log is not None and Path(out.server_log).is_file():
        rec.artifact_files[f"server/{Path(out.server_log).name}"] = str(out.server_log)
    if rep is not None:
        rec.artifacts["server/log_report.json"] = json.dumps(rep.to_dict(), indent=1, default=str)
    if out.live:
        rec.artifacts["server/live.json"] = json.dumps(out.live, indent=1, default=str)
    if out.latency is not None and hasattr(out.latency, "to_row"):
        rec.artifacts["latency/latency.json"] = json.dumps(out.latency.to_row(), indent=1, default=str)
    elif out.latency_row is not None:
        rec.artifacts["latency/latency.json"] = json.dumps(out.latency_row, indent=1, default=str)
    if out.sweep is not None:
        data = out.sweep.to_dict() if hasattr(out.sweep, "to_dict") else out.sweep
        rec.artifacts["sweep/sweep.json"] = json.dumps(data, indent=1, default=str)
    if out.eval is not None:
        data = out.eval.to_dict() if hasattr(out.eval, "to_dict") else out.eval
        rec.artifacts["eval/result.json"] = json.dumps(data, indent=1, default=str)
    if out.eval_records is not None and Path(out.eval_records).is_file():
        rec.artifact_files["eval/records.jsonl"] = str(out.eval_records)
    if out.kl is not None and hasattr(out.kl, "to_dict"):
        rec.artifacts["kl/result.json"] = json.dumps(out.kl.to_dict(), indent=1, default=str)
    for rel, png in out.plots.items():
        if Path(png).is_file():
            rec.artifact_files[rel] = str(png)
    if out.verdicts:
        rec.artifacts["preflight/verdicts.json"] = json.dumps(
            [v.to_dict() if hasattr(v, "to_dict") else v for v in out.verdicts], indent=1, default=str)
    rec.status = out.status if out.status != "RUNNING" else "FAILED"
    rec.end_ms = int(time.time() * 1000)
    return rec


def _effective_kv(arm: Arm, rep: Any) -> str | None:
    """The KV dtype the engine stored, from its log: 'auto' resolves to the log's activation dtype."""
    if rep is None:
        return None
    kv, dtype = getattr(rep, "kv_cache_dtype", None), getattr(rep, "dtype", None)
    if kv and kv != "auto":
        return str(kv)
    return str(dtype) if kv == "auto" and dtype else None


def _latency_metrics(rec: RunRecord, out: ArmOutcome) -> None:
    lat = out.latency
    if lat is not None and hasattr(lat, "stats"):
        st = lat.stats()
        for key, s in st.items():
            if s is None:
                continue
            if key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_tpot_ms"):
                rec.metric(f"{key}_p50", s.median)
                rec.metric(f"{key}_mean", s.mean)
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(f"{key}_p90", s.p90)
                rec.metric(f"{key}_p99", s.p99)
            if key in ("tpot_ms", "ttft_ms") and s.ci95_low is not None:
                rec.metric(f"{key}_ci_low", s.ci95_low)
                rec.metric(f"{key}_ci_high", s.ci95_high)
            if key == "decode_tok_s":
                rec.metric("decode_tok_s_p50", s.median)
        ok = lat.ok_samples
        rec.metric("latency_n_ok", len(ok))
        rec.metric("latency_n_failed", lat.n_failed)
        rec.metric("server_tpot_ms", st["server_tpot_ms"].median if st.get("server_tpot_ms") else None)
        rec.metric("tpot_vs_server_pct", lat.tpot_vs_server_median_pct())
        rec.series("sample_tpot_ms", [s.tpot * 1000 for s in ok if s.tpot is not None])
        rec.series("sample_ttft_ms", [s.ttft * 1000 for s in ok if s.ttft is not None])
        return
    row = out.latency_row
    if row is None:
        return
    for key, name in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms"), ("e2e_ms", "e2e_ms"),
                      ("server_tpot_ms", "server_tpot_ms")):
        s = row.get(key)
        if isinstance(s, dict):
            rec.metric(f"{name}_p50", s.get("median"))
            rec.metric(f"{name}_mean", s.get("mean"))
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(f"{name}_p90", s.get("p90"))
                rec.metric(f"{name}_p99", s.get("p99"))
            if key in ("tpot_ms", "ttft_ms"):
                rec.metric(f"{name}_ci_low", s.get("ci95_low"))
                rec.metric(f"{name}_ci_high", s.get("ci95_high"))
    if isinstance(row.get("server_tpot_ms"), dict):
        rec.metric("server_tpot_ms", row["server_tpot_ms"].get("median"))
    rec.metric("latency_n_ok", row.get("n_ok"))
    rec.metric("latency_n_failed", row.get("n_failed"))
    samples = row.get("samples") or []
    rec.series("sample_tpot_ms", [s["tpot_ms"] for s in samples if isinstance(s, dict) and s.get("ok", True)
                                  and isinstance(s.get("tpot_ms"), (int, float))])
    # the lab's reference client (the lab reference client latency.py): medians over its measured batch-1 requests,
    # and per concurrency level the median TPOT/TTFT and the output tokens/s of the level
    b1 = row.get("batch1")
    if isinstance(b1, dict):
        rec.metric("ttft_ms_p50", b1.get("ttft_ms"))
        rec.metric("tpot_ms_p50", b1.get("tpot_ms"))
        rec.metric("e2e_ms_p50", b1.get("e2e_ms"))
        if isinstance(b1.get("tokens"), list):
            rec.metric("latency_n_ok", len(b1["tokens"]))
    for key, val in row.items():
        if key.startswith("conc") and key[4:].isdigit() and isinstance(val, dict):
            c = int(key[4:])
            rec.metric(f"sweep_output_tps_c{c}", val.get("out_tok_per_s"))
            rec.metric(f"sweep_tpot_ms_p50_c{c}", val.get("tpot_ms"))
            rec.metric(f"sweep_ttft_ms_p50_c{c}", val.get("ttft_ms"))


def _sweep_metrics(rec: RunRecord, sweep: Any) -> None:
    if sweep is None:
        return
    # quantrack.measure.sweep.SweepResult.rows: one dict per level (concurrency, output_tok_s, request_s, ...)
    levels = getattr(sweep, "rows", None) or (sweep.get("rows") if isinstance(sweep, dict) else None) or []
    for lv in levels:
        c = _num(lv, "concurrency")
        if c is None:
            continue
        ci = int(c)
        rec.metric(f"sweep_output_tps_c{ci}", _num(lv, "output_tok_s"))
        rec.metric(f"sweep_tpot_ms_p50_c{ci}", _num(lv, "tpot_p50_ms"))
        rec.metric(f"sweep_ttft_ms_p50_c{ci}", _num(lv, "ttft_p50_ms"))
        rec.metric(f"sweep_request_tps_c{ci}", _num(lv, "request_s"))


def _eval_metrics(rec: RunRecord, out: ArmOutcome, baseline_accuracy: float | None) -> None:
    ev = out.eval
    if ev is None:
        return
    acc = _num(ev, "accuracy")
    rec.metric("gsm8k_accuracy", acc)
    rec.metric("gsm8k_se", _num(ev, "se"))
    rec.metric("gsm8k_ci_low", _num(ev, "ci_low"))
    rec.metric("gsm8k_ci_high", _num(ev, "ci_high"))
    rec.metric("gsm8k_n", _num(ev, "n"))
    rec.metric("gsm8k_correct", _num(ev, "correct"))
    rec.metric("gsm8k_invalid", _num(ev, "invalid"))
    rec.metric("gsm8k_errors", _num(ev, "errors"))
    source = ev.get("source") if isinstance(ev, dict) else getattr(ev, "source", None)
    rec.tag("quantrack.gsm8k_source", source)
    if acc is not None and baseline_accuracy is not None and not out.arm.baseline:
        rec.metric("gsm8k_delta_vs_baseline", acc - baseline_accuracy)
    bitmap, sha = outcomes_bitmap(out.eval_records)
    rec.tag("quantrack.gsm8k_correct", bitmap)
    settings = ev.get("settings") if isinstance(ev, dict) else getattr(ev, "settings", None)
    rec.tag("quantrack.gsm8k_data_sha256", sha or (settings or {}).get("data_sha256"))


def study_record(study: Study, experiment: str, node: dict[str, Any]) -> RunRecord:
    rec = RunRecord(experiment=experiment, run_name=f"study:{study.name}", status="RUNNING")
    rec.secrets = secret_values(dict(study.engine.env))
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag("quantrack.role", "study")
    rec.tag("quantrack.study", study.name)
    rec.param("study", study.name)
    rec.param("engine", study.engine.kind)
    rec.param("engine_version", study.engine.version)
    rec.param("model", study.model.path or study.model.gguf or study.model.name)
    rec.param("gpu_catalog", study.gpu.name)
    rec.param("gpu_name", node.get("gpu_name"))
    rec.param("hostname", node.get("hostname"))
    rec.param("arms", ",".join(a.name for a in study.arms))
    rec.param("baseline", study.baseline.name)
    rec.param("max_model_len", study.context_len)
    if study.source and Path(study.source).is_file():
        rec.artifact_files["study/study.toml"] = study.source
    return rec


# --- the study ---------------------------------------------------------------------------------------------

def _workdir(study: Study, opts: RunOptions) -> Path:
    if opts.workdir is not None:
        d = Path(opts.workdir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = Path(".quantrack-cache") / "runs" / study.name / stamp
    d.mkdir(parents=True, exist_ok=True)
    return d


def run_study(study: Study, opts: RunOptions | None = None, progress: Progress | None = None,
              tracker: Tracker | None = None) -> StudyResult:
    """Run (or measure, with --base-url) every arm of a study and log each as a nested MLflow run."""
    opts = opts or RunOptions()
    say = progress or (lambda _m: None)
    t_study = time.perf_counter()
    names = tuple(dict.fromkeys((opts.arm,) if isinstance(opts.arm, str) else (opts.arm or ())))
    if opts.base_url and (len(names) > 1 or (not names and len(study.arms) > 1)):
        raise BadInput("--base-url measures one running server: name its arm with --arm "
                       f"(arms: {', '.join(a.name for a in study.arms)})")
    if opts.server_log and not opts.base_url:
        raise BadInput("--server-log goes with --base-url (a server quantrack did not start)")
    if opts.server_log and not Path(opts.server_log).is_file():
        raise BadInput(f"--server-log {opts.server_log!r}: no such file")
    prices = _load_prices(opts.prices)
    refs = {a.name: a.model for a in study.arms if a.model}
    study, resolved = _resolve_models(study, say)
    arms = [study.arm(n) for n in names] if names else list(study.arms)
    # the baseline first: every candidate's speedup plot and KL are measured against it
    arms.sort(key=lambda a: not a.baseline)
    experiment = study.tracking.experiment or study.name
    tracker = tracker or Tracker(opts.tracking_uri or study.tracking.uri, experiment, progress=say)
    workdir = _workdir(study, opts)
    node = node_facts()
    api_key = opts.api_key or os.environ.get("QUANTRACK_API_KEY")
    secrets = tuple(s for s in (api_key,) if s)
    say(f"study {study.name!r}: {len(arms)} arm(s), engine {study.engine.kind}, tracking {tracker.uri} "
        f"(experiment {experiment!r})")
    for note in sorted({r.note for r in resolved.values() if r.note}):
        say(note)
    say(f"baseline: {study.baseline.name} ({study.baseline.label()}); work files in {workdir}")
    parent = tracker.log(study_record(study, experiment, node))
    outcomes: list[ArmOutcome] = []
    logged: dict[str, Logged] = {}
    baseline_acc = _stored_baseline_accuracy(study, tracker) if names else None
    baseline_out: ArmOutcome | None = None
    parent_status = "FAILED"
    try:
        for arm in arms:
            say(f"[{arm.name}] {arm.label()}" + (f", model {refs[arm.name]}" if arm.name in refs else ""))
            out = ArmOutcome(arm=arm, node=dict(node))
            try:
                out = run_arm(study, arm, RunOptions(**{**opts.__dict__, "api_key": api_key}), workdir, node, say,
                              baseline=baseline_out)
            finally:
                if refs.get(arm.name) and arm.model != refs[arm.name]:
                    out.model_ref = refs[arm.name]
                rec = record_for_arm(study, out, experiment=experiment, parent_uuid=parent.uuid,
                                     baseline_accuracy=None if arm.baseline else baseline_acc,
                                     extra_secrets=secrets)
                logged[arm.name] = tracker.log(rec)
                outcomes.append(out)
                where = logged[arm.name].run_id or f"spool {logged[arm.name].spooled}"
                say(f"[{arm.name}] logged {rec.status} -> {where}")
            if arm.baseline and out.eval is not None:
                baseline_acc = _num(out.eval, "accuracy")
            if arm.baseline and out.status == "FINISHED":
                baseline_out = out
        parent_status = "FAILED" if any(o.status == "FAILED" for o in outcomes) else "FINISHED"
    finally:
        tracker.finish(parent, parent_status)
    result = StudyResult(study=study, experiment=experiment, outcomes=outcomes, parent=parent, logged=logged,
                         plots=[p for o in outcomes for p in o.plots.values()])
    result.table = study_table(result, tracker.uri, say, prices)
    from quantrack.report.page import publish_study_report

    publish_study_report(result, tracker.uri, workdir, say, prices)  # quantrack report's page, on the parent run
    result.wall_s = round(time.perf_counter() - t_study, 1)
    for png in result.plots:
        say(f"speedup plot: {png} (also an artifact of its arm's run)")
    say(f"study {study.name!r} done in {result.wall_s:.0f} s ({len(outcomes)} arm(s); parent run "
        f"{parent.run_id or parent.spooled})")
    return result


def _resolve_models(study: Study, say: Progress) -> tuple[Study, dict[str, Any]]:
    """Model references (smollm2:Q8_0) -> local files, provisioned on first use."""
    from quantrack.models_ref import resolve_study

    return resolve_study(study, progress=say)


def _load_prices(path: str | None) -> Any:
    """--prices FILE for the closing compare table, read before any arm runs (a bad file is exit 2 now)."""
    from quantrack.pricing import load_prices

    return load_prices(path)


def study_table(result: StudyResult, uri: str, say: Progress, prices: Any = None) -> str | None:
    """The compare table of this study's arm runs only (read back from the store); the CLI prints it to stdout."""
    parent = result.parent
    if parent is None or parent.run_id is None:
        say("compare: the runs were spooled; after `quantrack sync`, run "
            f"`quantrack compare --experiment {result.experiment}`")
        return None
    from quantrack.report.compare import build_table, render
    from quantrack.tracking import load_runs

    try:
        runs = [r for r in load_runs(result.experiment, uri) if r.tags.get("mlflow.parentRunId") == parent.run_id]
        if not runs:
            return None
        text = render(build_table(result.experiment, runs, result.study.baseline.name, prices), "table")
    except Exception as exc:  # noqa: BLE001 - the runs are logged already; the table is only a view of them
        say(f"compare: could not build the table ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            f"run `quantrack compare --experiment {result.experiment}`")
        return None
    say(f"compare: the table of this study's runs is the result (same as `quantrack compare --experiment "
        f"{result.experiment}` while they are the newest)")
    return text


def _stored_baseline_accuracy(study: Study, tracker: Tracker) -> float | None:
    """The baseline's accuracy from its newest finished run in the store (for a single --arm run)."""
    from quantrack.tracking import load_runs

    try:
        runs = load_runs(tracker.experiment, tracker.uri)
    except QuantrackError:
        return None
    for r in runs:
        if r.arm == study.baseline.name and r.status == "FINISHED" and "gsm8k_accuracy" in r.metrics:
            return r.metrics["gsm8k_accuracy"]
    return None


# --- quantrack log: results measured elsewhere ---------------------------------------------------------------

@dataclass
class LogInputs:
    study: Study
    arm: str
    latency: Path | None = None
    eval: Path | None = None
    server_log: Path | None = None
    engine: str | None = None
    tracking_uri: str | None = None


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{what} {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} {str(path)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def load_latency_row(path: Path) -> dict[str, Any]:
    """A saved latency row: quantrack's own (format quantrack-latency/1) or the lab's reference client output
    (label/input/output/batch1/concN, medians; the lab reference client latency.py)."""
    data = _read_json(path, "--latency")
    if not isinstance(data, dict):
        raise BadInput(f"--latency {str(path)!r}: expected a JSON object")
    if data.get("format", "").startswith("quantrack-latency/") or "batch1" in data:
        return data
    raise BadInput(f"--latency {str(path)!r}: not a latency row (expected quantrack's `latency --output` JSON, "
                   "or the reference client's batch1/concN JSON)")


def load_eval(path: Path) -> tuple[Any, Path | None]:
    """--eval: per-question records (.jsonl) or a result JSON (quantrack's EvalResult dict, or vLLM's
    gsm8k_eval --save-results with accuracy + num_questions)."""
    if path.suffix == ".jsonl":
        from quantrack.accuracy.gsm8k import result_from_records
        from quantrack.accuracy.records import load_records, read_meta

        recs = load_records(path)
        if not recs:
            raise BadInput(f"--eval {str(path)!r}: no records")
        meta = read_meta(path) or {}
        n_q = int(meta.get("num_questions") or (max(recs) + 1))
        return result_from_records(recs, num_questions=n_q, style=meta.get("style"), records_path=str(path),
                                   source="imported:records", settings=meta), path
    data = _read_json(path, "--eval")
    if not isinstance(data, dict):
        raise BadInput(f"--eval {str(path)!r}: expected a JSON object")
    acc = data.get("accuracy")
    if not isinstance(acc, (int, float)) or isinstance(acc, bool):
        raise BadInput(f"--eval {str(path)!r}: no numeric 'accuracy' (pass records .jsonl or a result JSON)")
    if "n" in data and "correct" in data:
        return dict(data), None
    n = data.get("num_questions")
    if not isinstance(n, int) or n < 1:
        raise BadInput(f"--eval {str(path)!r}: has 'accuracy' but no 'num_questions': the standard error "
                       "cannot be derived")
    se = math.sqrt(acc * (1 - acc) / n)
    return {"task": "gsm8k", "accuracy": float(acc), "n": n, "se": se, "source": "imported:vllm-gsm8k_eval",
            "settings": {k: data.get(k) for k in ("num_shots", "max_tokens") if k in data}}, None


def log_results(inputs: LogInputs, progress: Progress | None = None) -> tuple[RunRecord, Logged]:
    """Record results measured elsewhere as one arm run (no parent)."""
    study = inputs.study
    arm = study.arm(inputs.arm)
    if inputs.engine and inputs.engine != study.engine.kind:
        from dataclasses import replace

        from quantrack.study import ENGINES

        if inputs.engine not in ENGINES:
            from quantrack.errors import unknown

            raise unknown("engine", inputs.engine, ENGINES)
        study = replace(study, engine=replace(study.engine, kind=inputs.engine))
    if not (inputs.latency or inputs.eval or inputs.server_log):
        raise BadInput("nothing to log: pass --latency, --eval and/or --server-log")
    out = ArmOutcome(arm=arm, node={"hostname": None}, source="log", status="FINISHED")
    out.node = {}
    if inputs.latency:
        out.latency_row = load_latency_row(inputs.latency)
    if inputs.eval:
        out.eval, out.eval_records = load_eval(inputs.eval)
    if inputs.server_log:
        if not inputs.server_log.is_file():
            raise BadInput(f"--server-log {str(inputs.server_log)!r}: no such file")
        from quantrack.engines import get_adapter

        out.log_report = get_adapter(study.engine.kind).parse_log_file(inputs.server_log)
        out.server_log = inputs.server_log
    with contextlib.suppress(Exception):
        out.predicted = step_predict(study, arm, {})
    experiment = study.tracking.experiment or study.name
    tracker = Tracker(inputs.tracking_uri or study.tracking.uri, experiment, progress=progress)
    baseline_acc = None if arm.baseline else _stored_baseline_accuracy(study, tracker)
    rec = record_for_arm(study, out, experiment=experiment, baseline_accuracy=baseline_acc)
    return rec, tracker.log(rec)


__all__ = [
    "ArmOutcome",
    "LogInputs",
    "RunOptions",
    "StudyResult",
    "load_eval",
    "load_latency_row",
    "log_results",
    "node_facts",
    "record_for_arm",
    "run_arm",
    "run_study",
]
