"""Study orchestration: every arm preflighted, served, measured and logged as one MLflow run.

Per arm, as small steps (a missing or failing step fails that arm cleanly, the study goes on):

    preflight verdict (rulebook)  -> a rejected arm is logged as rejected (status KILLED), never started
    predicted capacity            (quantrack.hardware.capacity.predict_for_arm; derived)
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
quantrack.models.ref), resolved to local files, provisioned on first use, before any arm runs.

The study is a parent run; arms are nested runs in the same experiment. ``record_for_arm`` turns an
``ArmOutcome`` into a ``RunRecord`` (pure) and is shared with ``quantrack log``. After the arms, the study
prints the compare table of this study's runs (quantrack.report.compare) and the speedup plot paths.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.arms import Arm
from quantrack.errors import BadInput, QuantrackError
from quantrack.interrupts import as_interrupted, signal_name, signals_raise
from quantrack.run.narrate import (
    say_capacity,
    say_eval,
    say_latency,
    say_log,
    say_sweep,
    took,
)
from quantrack.run.outcome import (
    ArmOutcome,
    Progress,
    RunOptions,
    StepError,
    StudyResult,
)
from quantrack.run.record import record_for_arm, study_record
from quantrack.run.schema import (
    STATUS_FAILED,
    STATUS_FINISHED,
    STATUS_KILLED,
    STATUS_REJECTED,
    RunStatus,
    Tag,
)
from quantrack.run.steps import (
    check_server_log,
    local_node,
    step_engine_plot,
    step_eval,
    step_kl,
    step_latency,
    step_parse_log,
    step_plot,
    step_predict,
    step_preflight,
    step_query,
    step_serve,
    step_sweep,
)
from quantrack.store.records import Logged, RunRecord
from quantrack.store.tracking import Tracker
from quantrack.study import Study

if TYPE_CHECKING:
    from quantrack.accuracy.gsm8k import EvalResult


def _run_step(outcome: ArmOutcome, name: str, fn: Callable[[], Any],
              keep: Callable[[Any], None] | None = None) -> Any:
    """Run one step; any failure becomes a one-line StepError naming the step. ``outcome.step`` names the
    step while it runs (and stays set when it fails or is interrupted). An interrupt (Ctrl-C, a signal)
    goes on up; what the interrupted measurement had (``Interrupted.partial``) is handed to ``keep`` first."""
    if outcome.on_step is not None and outcome.steps:
        # the checkpoint of every step finished so far (the caller has stored their results by now): written as
        # the next step starts; it says its own failures and never fails the arm
        outcome.on_step()
    t0 = time.perf_counter()
    outcome.step = name
    try:
        value = fn()
    except KeyboardInterrupt as exc:
        intr = as_interrupted(exc)
        if keep is not None and intr.partial is not None:
            keep(intr.partial)
        raise intr from None
    except Exception as exc:  # noqa: BLE001 - an engine or network failure fails the arm, not the study
        outcome.step = None  # the StepError names the step; an optional step's failure leaves no step open
        raise _step_error(name, exc) from None
    outcome.step = None
    outcome.steps.append(name)
    outcome.step_s[name] = round(time.perf_counter() - t0, 2)
    return value


def _local_engine_pid(base_url: str | None) -> int | None:
    """The pid listening on a loopback base URL's port (an engine started outside quantrack, --base-url), so its
    CPU counts as the engine's and not as contention; None when remote or not visible to this user."""
    from urllib.parse import urlsplit

    import psutil  # type: ignore[import-untyped]

    parts = urlsplit(base_url or "")
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == parts.port and c.pid:
            return int(c.pid)
    return None


def _sampled(study: Study, out: ArmOutcome, step: str, fn: Callable[[], Any]) -> Any:
    """Run a timed step while quantrack.measure.hygiene samples the host (and the GPU, for GPU engines); the
    summary lands in ``out.hygiene[step]`` whatever ends the step."""
    from quantrack.engines import GPU_ENGINE_KINDS
    from quantrack.measure.hygiene import Sampler

    pid = out.engine_pid or _local_engine_pid(out.base_url)
    sampler = Sampler(step, engine_pid=pid, gpu_index=0 if study.engine.kind in GPU_ENGINE_KINDS else None).start()
    try:
        return fn()
    finally:
        out.hygiene[step] = sampler.stop()


def _contended(out: ArmOutcome, step: str) -> bool | None:
    h = out.hygiene.get(step)
    return h.contended if h is not None else None


def _say_contention(say: Progress, arm: Arm, out: ArmOutcome, step: str) -> None:
    h = out.hygiene.get(step)
    if h is not None and h.contended:
        say(f"[{arm.name}] ⚠ {step} measured under contention: {'; '.join(h.reasons)} "
            "(the figure is flagged in the run and in compare)")


def _step_error(name: str, exc: Exception) -> StepError:
    if isinstance(exc, (StepError, QuantrackError)):
        return StepError(f"{name}: {exc}")
    if isinstance(exc, ImportError):
        return StepError(f"{name}: not available in this quantrack ({exc})")
    return StepError(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def run_arm(study: Study, arm: Arm, opts: RunOptions, workdir: Path, node: dict[str, Any],
            progress: Progress, baseline: ArmOutcome | None = None, out: ArmOutcome | None = None) -> ArmOutcome:
    """All steps of one arm; never raises for a step failure (the outcome says FAILED and where).

    Each step's result goes into ``out`` as soon as the step ends, so the caller holds every figure
    whatever ends the arm: an interrupt or a signal marks it KILLED and is re-raised (``Interrupted``),
    an unexpected exception marks it FAILED and is re-raised; in both cases the server is stopped first.

    ``baseline``: the baseline arm's finished outcome (its sweep for the speedup plot; KL is measured
    against its model when [eval] kl_tokens is set)."""
    out = out if out is not None else ArmOutcome(arm=arm, node=dict(node))
    say = progress
    t_arm = time.perf_counter()
    try:
        verdict, verdicts = _run_step(out, "preflight", lambda: step_preflight(study, arm, node))
        out.verdict, out.verdicts = verdict, list(verdicts)
        say(f"[{arm.name}] preflight: {verdict}" + "".join(
            f"; {v.rule_id}: {v.message}" for v in out.verdicts if verdict == "reject" and v.verdict == "reject"))
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
                say_log(say, arm, out.log_report)
            with contextlib.suppress(StepError):  # live facts are optional (not every engine exposes all)
                out.live = _run_step(out, "query", lambda: step_query(study, base_url))
            say_capacity(say, arm, out)
            lat = study.latency
            say(f"[{arm.name}] latency: batch 1, {lat.input_tokens} in / {lat.output_tokens} out, "
                f"{lat.warmup} warmup + {lat.iterations} iterations")
            out.latency = _run_step(out, "latency", lambda: _sampled(study, out, "latency", lambda: step_latency(
                study, arm, base_url, opts.api_key, say)), keep=lambda partial: setattr(out, "latency", partial))
            _say_contention(say, arm, out, "latency")
            say_latency(say, arm, out.latency, out.step_s.get("latency"))
            _check_measured(out, "latency", out.latency.n_failed, len(out.latency.samples), "latency samples")
            probing = study.sweep.search_mode != "measured"
            if study.sweep.concurrency or study.sweep.rates or probing:
                say(f"[{arm.name}] sweep: " + "; ".join(
                    [f"concurrency {list(study.sweep.concurrency)}"] * bool(study.sweep.concurrency)
                    + [f"rates {list(study.sweep.rates)}/s ({study.sweep.arrival})"] * bool(study.sweep.rates)
                    + [(f"SLO search {study.sweep.slo_search}: probing {study.sweep.search_mode} over "
                       f"{study.sweep.search_range}")] * probing))
                out.sweep = _run_step(out, "sweep", lambda: _sampled(study, out, "sweep", lambda: step_sweep(
                    study, arm, base_url, opts.api_key, say, on_level=lambda so_far: setattr(out, "sweep", so_far))),
                    keep=lambda partial: setattr(out, "sweep", partial))
                _say_contention(say, arm, out, "sweep")
                say_sweep(say, arm, out.sweep, out.step_s.get("sweep"))
                _check_measured(out, "sweep", out.sweep.n_failed,
                                sum(int(r.get("requests", 0)) for r in out.sweep.rows), "sweep requests")
                sweep = out.sweep
                with contextlib.suppress(StepError):  # a view of the scraped figures, not a measurement
                    eng = _run_step(out, "engine_plot", lambda: step_engine_plot(arm, sweep, workdir))
                    if eng is not None:
                        out.plots[f"plots/{eng.name}"] = eng
                if baseline is not None and baseline.sweep is not None and not arm.baseline:
                    with contextlib.suppress(StepError):  # a plot is a view of measured rows, not a measurement
                        png = _run_step(out, "plot", lambda: step_plot(
                            arm, sweep, baseline, workdir, _contended(out, "sweep")))
                        out.plots[f"plots/{png.name}"] = png
                        say(f"[{arm.name}] speedup plot vs {baseline.arm.name}: {png}")
            if study.eval.task:
                ev = study.eval
                say(f"[{arm.name}] eval: {ev.task}, {ev.num_questions} questions, {ev.num_shots}-shot, "
                    f"max_tokens {ev.max_tokens}")
                out.eval, out.eval_records = _run_step(
                    out, "eval", lambda: step_eval(study, arm, base_url, opts.api_key, workdir, say),
                    keep=lambda partial: _keep_eval(out, partial))
                say_eval(say, arm, out.eval, out.step_s.get("eval"))
                _check_measured(out, "eval", out.eval.errors, out.eval.num_questions, "questions (server errors)")
            if study.kl_wanted(arm):
                if opts.base_url:
                    out.steps.append("kl: not run (--base-url: quantrack serves no baseline next to it)")
                else:
                    base_arm = baseline.arm if baseline is not None else study.baseline
                    say(f"[{arm.name}] kl: {study.eval.kl_tokens} positions, top-{study.eval.kl_top_k}, "
                        f"{study.eval.kl_method}, against {base_arm.name}")
                    out.kl = _run_step(out, "kl", lambda: step_kl(study, arm, base_url, base_arm, workdir, say))
                    say(f"[{arm.name}] kl: top-1 agreement {out.kl.top1_agree * 100:.1f}%, "
                        f"mean KL {out.kl.kl_mean:.4f} nats over {out.kl.n_positions} positions (measured)"
                        f"{took(out.step_s.get('kl'))}")
                    _check_measured(out, "kl", 0, 0, "")
        out.status = STATUS_FINISHED
        say(f"[{arm.name}] done in {time.perf_counter() - t_arm:.0f} s")
    except StepError as exc:
        out.status, out.error = STATUS_FAILED, str(exc)
        out.failed_step = str(exc).split(":", 1)[0]
        say(f"[{arm.name}] FAILED at {exc}")
    except KeyboardInterrupt as exc:
        intr = as_interrupted(exc)
        out.status, out.failed_step = STATUS_KILLED, out.step or "between steps"
        out.error = f"{intr.reason} in step {out.failed_step}"
        say(f"[{arm.name}] KILLED: {out.error}; logging what it measured ({', '.join(out.steps) or 'nothing'})")
        raise intr from None
    except Exception as exc:
        out.status, out.failed_step = STATUS_FAILED, out.step or "between steps"
        out.error = f"{out.failed_step}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise
    return out


def _check_measured(out: ArmOutcome, step: str, failed: int, total: int, what: str) -> None:
    """The rule (docs/tracking.md, "Run status"): a measured step fails when more than half of its samples
    failed (so also when all did), and the arm fails when the engine process quantrack started exited during
    it. What the step measured is already in the outcome; the StepError makes the arm FAILED."""
    rc = out.engine_exit() if out.engine_exit is not None else None
    if rc is not None:
        raise StepError(f"{step}: the engine process exited during the arm (exit status {rc}); "
                        f"{failed} of {total} {what} failed" if total else
                        f"{step}: the engine process exited during the arm (exit status {rc})")
    if total and failed * 2 > total:
        raise StepError(f"{step}: {failed} of {total} {what} failed (more than half: the figures are not "
                        "a measurement of this arm)")


def _keep_eval(out: ArmOutcome, partial: tuple[EvalResult, Path]) -> None:
    out.eval, out.eval_records = partial


# --- the study ---------------------------------------------------------------------------------------------

def _check_engine_logs(workdir: Path, study: Study) -> None:
    """Before any engine starts: an engine log path of the work dir (``ARM-server.log``,
    ``ARM-kl-baseline-server.log``) that is a link or not a regular file is refused, one line, exit 2; one planted
    later is refused when it is opened (``O_NOFOLLOW``) and fails that arm (issue #43)."""
    from quantrack.store.files import check_regular_target

    for arm in study.arms:
        for name in (f"{arm.name}-server.log", f"{arm.name}-kl-baseline-server.log"):
            check_regular_target(workdir / name, None, "the engine's log is parsed")


def _workdir(study: Study, opts: RunOptions) -> Path:
    if opts.workdir is not None:
        d = Path(opts.workdir)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = Path(".quantrack-cache") / "runs" / study.name / stamp
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class _Held:
    """What the study holds and has not logged yet: the parent run and the arm in progress. A forced exit
    (a second Ctrl-C or signal) spools it instead of losing it."""

    tracker: Tracker
    experiment: str
    say: Progress
    parent: Logged | None = None
    arm: ArmOutcome | None = None
    record: Callable[[ArmOutcome], RunRecord] | None = None

    def force(self, signum: int) -> list[str]:
        """The second signal: spool what is held first (each write atomic, each on its own so one failure
        does not skip the other), then kill the engines; returns the lines that say what was done."""
        from quantrack.engines.lifecycle import kill_all
        from quantrack.store.records import now_ms
        from quantrack.store.tracking import spool_record, spool_terminate

        sig = signal_name(signum)
        reason = f"forced exit ({sig} while stopping)"
        lines: list[str] = []
        out, record = self.arm, self.record
        if out is not None and record is not None:
            name = out.arm.name
            try:
                if out.status in ("RUNNING", STATUS_FINISHED):
                    out.status, out.failed_step = STATUS_KILLED, out.step or "between steps"
                out.error = out.error or reason
                where = spool_record(record(out), self.tracker.uri, reason)
                self.arm = None
                from quantrack.store.tracking import drop_checkpoint

                drop_checkpoint(out.run_uuid)  # the spooled record is the later word
                lines.append(f"arm {name!r} spooled {out.status} to {where}")
            except BaseException as exc:  # noqa: BLE001 - said, never hidden
                lines.append(f"arm {name!r} could NOT be spooled: {type(exc).__name__}: {str(exc)[:300]}")
        if self.parent is not None:
            try:
                op = spool_terminate(self.tracker.uri, self.experiment, self.parent.uuid, STATUS_KILLED, now_ms())
                self.parent = None
                lines.append(f"the study's parent run: KILLED status spooled to {op}")
            except BaseException as exc:  # noqa: BLE001
                lines.append(f"the study's parent run's KILLED status could NOT be spooled: "
                             f"{type(exc).__name__}: {str(exc)[:300]}")
        try:
            killed = kill_all()
            lines.append(f"engines killed ({killed})" if killed else "no engine was running")
        except BaseException as exc:  # noqa: BLE001
            lines.append(f"engines could NOT all be killed: {type(exc).__name__}: {str(exc)[:200]}")
        spooled = any(" spooled " in ln for ln in lines)
        head = f"{sig} again: forced exit"
        tail = "; `quantrack sync` uploads what was spooled" if spooled else ""
        from quantrack.redact import redact_text

        return [redact_text(f"{head}: " + "; ".join(lines) + tail)]


def run_study(study: Study, opts: RunOptions | None = None, progress: Progress | None = None,
              tracker: Tracker | None = None) -> StudyResult:
    """Run (or measure, with --base-url) every arm of a study and log each as a nested MLflow run.

    Ctrl-C, SIGTERM or SIGHUP (in the main thread) stop the study: the arm in progress is logged KILLED
    with every figure and artifact it had and the step it was in, its engine stopped, the parent run
    ended KILLED, and ``Interrupted`` (exit status 128 + signal) is raised. A second one forces the exit
    and spools what is held. An exception ends the arm and the parent FAILED and is re-raised."""
    opts = opts or RunOptions()
    say = progress or (lambda _m: None)
    held: list[_Held] = []
    # the record of an arm may need scipy (t-intervals over repeats, paired tests): import it before any signal can
    # arrive, so the forced exit never builds a record while the main thread is half-way through importing it
    # ("partially initialized module 'scipy.stats'" lost an arm on a second Ctrl-C)
    import scipy.stats  # type: ignore[import-untyped]  # noqa: F401

    with signals_raise(lambda signum: held[0].force(signum) if held else None):
        return _run_study(study, opts, say, tracker, held)


def _run_study(study: Study, opts: RunOptions, say: Progress, tracker: Tracker | None,
               held_slot: list[_Held]) -> StudyResult:
    t_study = time.perf_counter()
    names = tuple(dict.fromkeys((opts.arm,) if isinstance(opts.arm, str) else (opts.arm or ())))
    if opts.base_url and (len(names) > 1 or (not names and len(study.arms) > 1)):
        raise BadInput("--base-url measures one running server: name its arm with --arm "
                       f"(arms: {', '.join(a.name for a in study.arms)})")
    if opts.server_log and not opts.base_url:
        raise BadInput("--server-log goes with --base-url (a server quantrack did not start)")
    if opts.server_log:

        check_server_log(Path(opts.server_log), study.engine.kind)
    prices = _load_prices(opts.prices)
    experiment = study.tracking.experiment or study.name
    # the store is checked (a bad --tracking-uri is exit 2) before any model is fetched or requantized
    tracker = tracker or Tracker(opts.tracking_uri or study.tracking.uri, experiment, progress=say)
    for n in names:  # an unknown --arm is exit 2 before any model is fetched or verified
        study.arm(n)
    workdir = _workdir(study, opts)  # likewise a work dir that cannot be made
    _check_engine_logs(workdir, study)
    refs = arm_refs(study)
    study, resolved = _resolve_models(study, say)
    arms = [study.arm(n) for n in names] if names else list(study.arms)
    if names and not opts.base_url and not any(a.baseline for a in arms):
        # `run --arm X` runs the baseline too (its help says so): X's Δ, KL, speedup plot and the closing table
        # are measured against it. With --base-url only the named server is measured.
        arms.insert(0, study.baseline)
        say(f"--arm {', '.join(names)}: the baseline {study.baseline.name!r} runs first (every Δ, KL and speedup "
            "is measured against it)")
    # the baseline first: every candidate's speedup plot and KL are measured against it
    arms.sort(key=lambda a: not a.baseline)
    node = local_node()
    api_key = opts.api_key or os.environ.get("QUANTRACK_API_KEY")
    secrets = tuple(s for s in (api_key,) if s)
    arm_opts = RunOptions(**{**opts.__dict__, "api_key": api_key})
    say(f"study {study.name!r}: {len(arms)} arm(s), engine {study.engine.kind}, tracking {tracker.uri} "
        f"(experiment {experiment!r})")
    for note in sorted({r.note for r in resolved.values() if r.note}):
        say(note)
    say(f"baseline: {study.baseline.name} ({study.baseline.label()}); work files in {workdir}")
    held = _Held(tracker=tracker, experiment=experiment, say=say)
    held_slot.append(held)
    parent = held.parent = tracker.log(study_record(study, experiment, node))
    outcomes: list[ArmOutcome] = []
    logged: dict[str, Logged] = {}
    baseline_acc = stored_baseline_accuracy(study, tracker) if names else None
    baseline_out: ArmOutcome | None = None

    def arm_record(out: ArmOutcome) -> RunRecord:
        if refs.get(out.arm.name) and out.arm.model != refs[out.arm.name]:
            out.model_ref = refs[out.arm.name]
        return record_for_arm(study, out, experiment=experiment, parent_uuid=parent.uuid,
                              baseline_accuracy=None if out.arm.baseline else baseline_acc, extra_secrets=secrets)

    held.record = arm_record
    parent_status = STATUS_FAILED
    try:
        for arm in arms:
            say(f"[{arm.name}] {arm.label()}" + (f", model {refs[arm.name]}" if arm.name in refs else ""))
            out = held.arm = ArmOutcome(arm=arm, node=dict(node))
            out.on_step = _checkpointer(tracker, arm_record, out, say)
            try:
                out.weights = _weights(study, arm, refs.get(arm.name), say)
                run_arm(study, arm, arm_opts, workdir, node, say, baseline=baseline_out, out=out)
            finally:  # whatever ended the arm: it is logged with everything it measured, in the state it ended
                logged[arm.name] = _log_arm(tracker, lambda: arm_record(out))  # noqa: B023 - called now
                held.arm = None
                _drop_checkpoint(out)
                outcomes.append(out)
                where = logged[arm.name].run_id or f"spool {logged[arm.name].spooled}"
                say(f"[{arm.name}] logged {out.status if out.status != 'RUNNING' else STATUS_FAILED} -> {where}")
            if arm.baseline and out.eval is not None:
                baseline_acc = out.eval.accuracy
            if arm.baseline and out.status == STATUS_FINISHED:
                baseline_out = out
        parent_status = STATUS_FAILED if any(o.status == STATUS_FAILED for o in outcomes) else STATUS_FINISHED
    except KeyboardInterrupt:
        parent_status = STATUS_KILLED
        raise
    finally:
        tracker.finish(parent, parent_status)
        held.parent = None
        if parent_status != STATUS_FINISHED:
            say(f"study {study.name!r}: parent run ended {parent_status}")
    result = StudyResult(study=study, experiment=experiment, outcomes=outcomes, parent=parent, logged=logged,
                         plots=[p for o in outcomes for p in o.plots.values()])
    result.table = study_table(result, tracker.uri, say, prices)
    from quantrack.report.page import publish_study_report

    page = publish_study_report(result, tracker.uri, workdir, say, prices)  # quantrack report's page, on the parent
    result.decision = list(page.decision) if page is not None else []
    result.wall_s = round(time.perf_counter() - t_study, 1)
    for png in result.plots:
        say(f"speedup plot: {png} (also an artifact of its arm's run)")
    say(f"study {study.name!r} done in {result.wall_s:.0f} s ({len(outcomes)} arm(s); parent run "
        f"{parent.run_id or parent.spooled})")
    return result


def _checkpointer(tracker: Tracker, build: Callable[[ArmOutcome], RunRecord], out: ArmOutcome,
                  say: Progress) -> Callable[[], None]:
    """As each step starts (so after each finished one): the arm as it stands, spooled as a checkpoint (KILLED, the step it ended after), so
    a `kill -9` of quantrack loses no finished step (`quantrack sync` uploads it once this process is gone)."""
    from dataclasses import replace

    from quantrack.store.tracking import checkpoint_record

    warned: list[bool] = []

    def write() -> None:
        after = out.steps[-1] if out.steps else "start"
        copy = replace(out, status=STATUS_KILLED, failed_step=f"after {after}",
                       error=out.error or f"quantrack ended before the arm was logged (checkpoint after step {after}; "
                                          "uploaded by `quantrack sync` once its process was gone)")
        try:
            checkpoint_record(build(copy), tracker.uri, after)
        except Exception as exc:  # noqa: BLE001 - said once; the arm goes on (it is logged whole when it ends)
            if not warned:
                warned.append(True)
                say(f"[{out.arm.name}] could not write the step checkpoint ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200]}): a kill -9 now would lose the arm's figures")

    return write


def _drop_checkpoint(out: ArmOutcome) -> None:
    from quantrack.store.tracking import drop_checkpoint

    drop_checkpoint(out.run_uuid)


def _log_arm(tracker: Tracker, build: Callable[[], RunRecord]) -> Logged:
    """Build and log the arm's record; an interrupt that lands while it is built or sent spools it, then
    goes on."""
    rec: RunRecord | None = None
    try:
        rec = build()
        return tracker.log(rec)
    except KeyboardInterrupt:
        from quantrack.store.tracking import spool_record

        spool_record(rec if rec is not None else build(), tracker.uri, "interrupted while logging")
        raise


def arm_refs(study: Study) -> dict[str, str]:
    """Each arm's model as written before references are resolved: its own ``model``, else the study's [model]
    path / gguf when that is a known-model reference (``qwen2.5-coder-1.5b:hf-bf16``), so the source digest of the
    model it was made from is recorded with every arm that serves it (those arms recorded none before)."""
    from quantrack.models.ref import parse_ref

    study_ref = next((r for r in (study.model.path, study.model.gguf) if r and parse_ref(r) is not None), None)
    refs: dict[str, str] = {}
    for a in study.arms:
        ref = a.model or study_ref
        if ref:
            refs[a.name] = ref
    return refs


def _weights(study: Study, arm: Any, ref: str | None, say: Progress) -> Any:
    """The SHA-256 of the weight files this arm loads (cached per file version); unknown, with why, never a failure."""
    from quantrack.models.weights import WeightsProvenance, weights_provenance

    model = arm.model or study.model.path or study.model.gguf or None
    try:
        return weights_provenance(str(model) if model else None, ref)
    except Exception as exc:  # noqa: BLE001 - provenance must not cost the measurement
        say(f"[{arm.name}] weights not hashed: {type(exc).__name__}: {str(exc)[:200]}")
        return WeightsProvenance(None, None, "unknown", reason=f"{type(exc).__name__}: {str(exc)[:200]}")


def _resolve_models(study: Study, say: Progress) -> tuple[Study, dict[str, Any]]:
    """Model references (smollm2:Q8_0) -> local files, provisioned on first use."""
    from quantrack.models.ref import resolve_study

    return resolve_study(study, progress=say)


def _load_prices(path: str | None) -> Any:
    """--prices FILE for the closing compare table, read before any arm runs (a bad file is exit 2 now)."""
    from quantrack.hardware.pricing import load_prices

    return load_prices(path)


def study_table(result: StudyResult, uri: str, say: Progress, prices: Any = None) -> str | None:
    """The compare table of this study's arm runs only (read back from the store); the CLI prints it to stdout."""
    parent = result.parent
    if parent is None or parent.run_id is None:
        say("compare: the runs were spooled; after `quantrack sync`, run "
            f"`quantrack compare --experiment {result.experiment}`")
        return None
    from quantrack.report.compare import build_table, render
    from quantrack.store.tracking import load_runs

    try:
        runs = [r for r in load_runs(result.experiment, uri) if r.tags.get(Tag.MLFLOW_PARENT_RUN_ID) == parent.run_id]
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


def stored_baseline_accuracy(study: Study, tracker: Tracker) -> float | None:
    """The baseline's accuracy from its newest finished run in the store (for a single --arm run)."""
    from quantrack.store.tracking import load_runs

    try:
        runs = load_runs(tracker.experiment, tracker.uri)
    except QuantrackError:
        return None
    from quantrack.run.schema import accuracy_names

    for r in runs:
        key = accuracy_names(r.tags.get(Tag.EVAL_METRICS)).accuracy
        if r.arm == study.baseline.name and r.status == RunStatus.FINISHED and key in r.metrics:
            return r.metrics[key]
    return None
