"""`quantrack report`: the decision page — which arm to deploy under the stated SLOs and accuracy budget, and why."""

from __future__ import annotations

from pathlib import Path

import click

PARENT = "parent"  # --log-to-run alone: the experiment's newest study parent run


@click.command("report")
@click.option("--experiment", required=True, metavar="NAME", help="MLflow experiment (the study name).")
@click.option("--slo", "slos", multiple=True, metavar="SLO",
              help="Latency objective METRIC_STAT<=VALUE(ms|s)@CONCURRENCY, e.g. 'tpot_p99<=30ms@64' "
                   "(repeatable; metrics ttft/tpot/e2e, stats p50/p90/p99/mean: what the sweep records).")
@click.option("--max-accuracy-drop", default=None, metavar="PP",
              help="GSM8K budget vs the baseline, e.g. 1pp: judged on Δ's 95% interval, not its point estimate.")
@click.option("--max-kl", default=None, metavar="NATS", help="Budget on the mean KL(baseline ‖ arm), e.g. 0.01.")
@click.option("--prices", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="GPU prices (TOML, [[price]] tables) for the derived cost per 1M output tokens "
                   "(default: the study's [decision] prices, else the shipped rules/prices.toml).")
@click.option("--study", "study_file", default=None, metavar="STUDY.toml", type=click.Path(dir_okay=False),
              help="Read the constraints from this study file's [decision] table (flags override it). Default: "
                   "the study file logged on the experiment's newest parent run, when readable.")
@click.option("--baseline", default=None, metavar="ARM",
              help="The reference arm (default: the arm tagged baseline, else bf16).")
@click.option("--gpu", default=None, metavar="NAME", help="Only the runs measured on this GPU type.")
@click.option("--out", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Where to write the page (default: beside a local store, <store dir>/reports/EXPERIMENT.html, "
                   "or .md with --format md; required for a tracking server). The md form writes its PNGs "
                   "beside it.")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default=None,
              help="html: one self-contained file, figures embedded; md: Markdown + PNG files (default: from "
                   "--out's suffix, else html).")
@click.option("--log-to-run", default=None, is_flag=False, flag_value=PARENT, metavar="[RUN_ID]",
              help="Also log the page as artifacts report/* of a run: alone, the experiment's newest study "
                   "parent run; or a run id.")
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds one request to a tracking server may take (default 60; $MLFLOW_HTTP_REQUEST_TIMEOUT).")
def report(experiment: str, slos: tuple[str, ...], max_accuracy_drop: str | None, max_kl: str | None,
           prices: str | None, study_file: str | None, baseline: str | None, gpu: str | None, out: str | None,
           fmt: str | None, log_to_run: str | None, tracking_uri: str | None, timeout: float | None) -> None:
    """Per arm a verdict with its reasons — each SLO met or missed (goodput: the highest measured concurrency that
    meets it), capacity and throughput at the SLO against the baseline, GSM8K Δ with its 95% interval (and the
    questions needed to tell it from 0), KL, cost per 1M output tokens, rulebook warnings, fallbacks and contention
    flags, every figure labelled measured / derived / imported with its run id — then the Pareto frontier, the arm
    to deploy and what would change the answer. An arm whose accuracy was not measured stays FILL IN and cannot
    be cleared. A fleet experiment gets one section per GPU type and the fleet audit's findings."""
    from pathlib import Path

    from quantrack.constraints import Constraints, parse_accuracy_drop, parse_max_kl, parse_slo
    from quantrack.errors import BadInput
    from quantrack.report.decision import decision_report
    from quantrack.store.uri import set_request_timeout

    set_request_timeout(timeout)

    flags = Constraints(
        slos=tuple(parse_slo(s) for s in slos),
        max_accuracy_drop=None if max_accuracy_drop is None else parse_accuracy_drop(max_accuracy_drop),
        max_kl=None if max_kl is None else parse_max_kl(max_kl, from_text=True),
        prices=prices, sources=("flags",) if (slos or max_accuracy_drop or max_kl or prices) else ())
    if fmt is None:
        fmt = "md" if out and Path(out).suffix.lower() in (".md", ".markdown") else "html"
    from quantrack.store.uri import resolve_uri

    uri = resolve_uri(tracking_uri, create=False)
    target = Path(out) if out else _default_out(uri, experiment, fmt)
    if target.is_dir():
        raise BadInput(f"--out {str(target)!r} is a directory: give a file name")
    if out and not target.parent.is_dir():
        raise BadInput(f"--out {str(target)!r}: no such directory {str(target.parent)!r}")
    rep = decision_report(experiment, flags, uri=uri, study=study_file, baseline=baseline, gpu=gpu)
    if log_to_run:
        from quantrack.store.files import special_target

        kind = special_target(target, "--out")
        if kind is not None:
            raise BadInput(f"--log-to-run logs the written page as a file: --out {target} is a {kind}; give a file")
    run_id = _log_target(log_to_run, experiment, uri) if log_to_run else None  # checked before writing

    from quantrack.report.page import log_report, write_report

    target.parent.mkdir(parents=True, exist_ok=True)  # the default folder beside the store
    files = write_report(rep, target, fmt)
    for s in rep.sections:
        click.echo(f"{s.gpu}: {s.recommendation}")
        for a in s.arms:
            click.echo(f"  {a.arm}\t{a.verdict}\t{a.run_id}")
    if rep.fleet_pick:
        click.echo(rep.fleet_pick)
    click.echo(f"wrote {', '.join(str(f) for f in files)}")
    if run_id is not None:
        paths = log_report(files, run_id, uri)
        click.echo(f"logged {', '.join(paths)} to run {run_id}")


def _default_out(uri: str, experiment: str, fmt: str) -> Path:
    """Beside a local SQLite store (``sqlite:///mlruns/mlflow.db`` -> ``mlruns/reports/EXPERIMENT.html``), never
    the current folder; a server store has no folder of the user's, so --out is required."""
    import re

    from quantrack.errors import BadInput

    if not uri.startswith("sqlite:///"):
        raise BadInput(f"--out FILE is required with tracking store {uri.split('://')[0]}://… (no local folder "
                       "to write the page beside)")
    store = Path(uri.removeprefix("sqlite:///"))
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._") or "report"
    return store.parent / "reports" / f"{name}.{fmt}"


def _log_target(value: str, experiment: str, uri: str) -> str:
    from quantrack.errors import BadInput
    from quantrack.store.tracking import load_runs

    if value != PARENT:
        runs = {r.run_id for r in load_runs(experiment, uri, role=None)}
        if value not in runs:
            raise BadInput(f"--log-to-run {value!r}: no such run in experiment {experiment!r}")
        return value
    parents = load_runs(experiment, uri, role="study")
    if not parents:
        raise BadInput(f"--log-to-run: experiment {experiment!r} has no study parent run (runs logged with "
                       "`quantrack log` have none): pass a run id")
    return max(parents, key=lambda r: r.start_time).run_id
