"""`quantrack run STUDY.toml`: every arm preflighted, served, measured and logged to MLflow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from quantrack.run.outcome import StudyResult

# Exit codes: every selected arm FINISHED -> 0; any arm FAILED -> 1; an arm rejected by preflight
# (none failed) -> 3. Bad input is 2 (quantrack.errors.BadInput, one line). Interrupted: 128 + the signal
# (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), the arm in progress logged KILLED.
EXIT_FAILED = 1
EXIT_REJECTED = 3


@click.command("run")
@click.argument("study_file", metavar="STUDY.toml", type=click.Path(dir_okay=False))
@click.option("--arm", "arms", multiple=True, metavar="NAME",
              help="Run only this arm of the study (repeatable); the baseline runs first unless --base-url is given.")
@click.option("--base-url", default=None, metavar="URL",
              help="Measure a server that is already running (with one --arm) instead of starting one.")
@click.option("--server-log", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="That server's startup log (with --base-url): parsed for weights, KV tokens, fallbacks.")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="MLflow store: http://host:port (shared server) or sqlite:///path/mlflow.db. "
                   "Default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db.")
@click.option("--workdir", default=None, metavar="DIR", type=click.Path(file_okay=False),
              help="Where server logs and eval records are written (default .quantrack-cache/runs/...).")
@click.option("--prices", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="GPU prices (TOML, [[price]] tables) for the table's derived cost column "
                   "(default: the shipped rules/prices.toml).")
@click.option("--ray", "ray_address", default=None, is_flag=False, flag_value="auto", metavar="[auto|ADDRESS]",
              help="Run the study's (GPU x arm) jobs on a Ray cluster: `--ray` / `--ray auto` (the running "
                   "cluster) or an address (ray://host:10001).")
@click.option("--format", "fmt", type=click.Choice(["table", "tsv"]), default="table", show_default=True,
              help="stdout: the compare table, then one `arm<TAB>status<TAB>run_id` line per arm (table); "
                   "only those lines (tsv).")
@click.option("--quick", is_flag=True,
              help="A first look: the same arms with far fewer requests (latency 1 + 3, two sweep levels of 4, "
                   "3 GSM8K questions, 64 KL positions), logged to the experiment NAME-quick and tagged "
                   "quantrack.quick so it never stands in for the full study.")
def run(study_file: str, arms: tuple[str, ...], base_url: str | None, server_log: str | None,
        tracking_uri: str | None, workdir: str | None, prices: str | None, ray_address: str | None,
        fmt: str, quick: bool) -> None:
    """Run a study: one nested MLflow run per arm under a parent run for the study.

    Progress goes to stderr; the compare table of this study's runs, the decision under it and a line per arm
    to stdout.
    An arm that fails is logged with status FAILED and everything it measured; a rejected arm is
    logged as rejected (KILLED). The engine API key, if any, is read from $QUANTRACK_API_KEY and
    never logged. Exit code 0 when every arm finished, 1 when any arm failed, 3 when an arm was
    rejected by preflight and none failed.
    """
    from pathlib import Path

    from quantrack.errors import BadInput
    from quantrack.study import load_study

    pending: list[str] = []  # the --quick note, printed with the first progress line: an error before it is alone

    def progress(m: str) -> None:
        while pending:
            click.echo(f"quantrack: {pending.pop(0)}", err=True)
        click.echo(f"quantrack: {m}", err=True)

    study = load_study(study_file)
    if quick:
        from quantrack.study import quick_study

        study = quick_study(study)
        pending.append(f"--quick: fewer requests than the study asks; runs go to experiment "
                       f"{study.tracking.experiment!r} (a first look, not figures to decide on)")
    from quantrack.cli.serve import exposure_warning

    exposed = exposure_warning(study.engine.host, [*study.engine.args, *(x for a in study.arms for x in a.engine_args)],
                               subject="[engine] host =",
                               env={**dict(study.engine.env), **{k: v for a in study.arms for k, v in a.env_dict.items()}})
    if exposed and not base_url:
        click.echo(f"quantrack: warning: {exposed}", err=True)
    if ray_address is not None:
        if arms or base_url or server_log:
            raise BadInput("--ray runs every (GPU x arm) job of the study: it does not take --arm, --base-url "
                           "or --server-log")
        if prices:
            raise BadInput("--prices prices the closing table of a local run; after --ray, run "
                           f"`quantrack compare --experiment {study.tracking.experiment or study.name} --prices {prices}`")
        from quantrack.fleet.ray_runner import run_study_on_ray, summary_lines

        fr = run_study_on_ray(study, ray_address, tracking_uri, progress=progress)
        for line in summary_lines(fr):
            click.echo(line)
        if fr.failed:
            click.echo(f"quantrack: {len(fr.failed)} job(s) did not finish: {', '.join(fr.failed)}", err=True)
            raise SystemExit(EXIT_FAILED)
        return

    from quantrack.run.orchestrate import run_study
    from quantrack.run.outcome import RunOptions
    from quantrack.run.schema import STATUS_REJECTED

    opts = RunOptions(arm=arms or None, base_url=base_url, server_log=server_log, tracking_uri=tracking_uri,
                      workdir=Path(workdir) if workdir else None, prices=prices)
    try:
        result = run_study(study, opts, progress=progress)
        if pending:  # no progress line came: the note still belongs before the results
            progress(pending.pop())
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM / SIGHUP: the arm in progress is logged KILLED already
        from quantrack.interrupts import as_interrupted

        intr = as_interrupted(exc)
        click.echo(f"quantrack: {intr.reason}: stopped; what was measured is logged (the lines above say where)",
                   err=True)
        raise SystemExit(intr.exit_code) from None
    _echo_result(result, fmt)
    rejected = [o.arm.name for o in result.outcomes if o.status == STATUS_REJECTED and o.verdict == "reject"]
    if result.failed:
        click.echo(f"quantrack: {len(result.failed)} arm(s) failed: {', '.join(result.failed)}", err=True)
        raise SystemExit(EXIT_FAILED)
    if rejected:
        click.echo(f"quantrack: {len(rejected)} arm(s) rejected by preflight: {', '.join(rejected)}", err=True)
        raise SystemExit(EXIT_REJECTED)


def _echo_result(result: StudyResult, fmt: str) -> None:
    """stdout: the closing table and the decision right under it (table format), then one line per arm."""
    if fmt == "table" and (result.table or result.decision):
        if result.table:
            click.echo(result.table.rstrip("\n"))
        for line in result.decision:  # the answer, where the reader of the table looks (also on report.html)
            click.echo(line)
        click.echo("")
    for o in result.outcomes:
        where = result.logged[o.arm.name]
        dest = where.run_id or f"spooled ({where.spooled})"
        extra = f": {o.error}" if o.error else ""
        click.echo(f"{o.arm.name}\t{o.status}\t{dest}{extra}")
