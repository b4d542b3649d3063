"""`quantrack run STUDY.toml`: every arm preflighted, served, measured and logged to MLflow."""

from __future__ import annotations

import click


@click.command("run")
@click.argument("study_file", metavar="STUDY.toml", type=click.Path(dir_okay=False))
@click.option("--arm", default=None, metavar="NAME", help="Run only this arm of the study.")
@click.option("--base-url", default=None, metavar="URL",
              help="Measure a server that is already running (with --arm) instead of starting one.")
@click.option("--server-log", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="That server's startup log (with --base-url): parsed for weights, KV tokens, fallbacks.")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="MLflow store: http://host:port (shared server) or sqlite:///path/mlflow.db. "
                   "Default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db.")
@click.option("--workdir", default=None, metavar="DIR", type=click.Path(file_okay=False),
              help="Where server logs and eval records are written (default .quantrack-cache/runs/...).")
def run(study_file: str, arm: str | None, base_url: str | None, server_log: str | None,
        tracking_uri: str | None, workdir: str | None) -> None:
    """Run a study: one nested MLflow run per arm under a parent run for the study.

    Progress goes to stderr; a summary line per arm to stdout. An arm that fails is logged
    with status FAILED and everything it measured; a rejected arm is logged as rejected (KILLED).
    The engine API key, if any, is read from $QUANTRACK_API_KEY and never logged.
    Exit code 1 when any arm failed.
    """
    from pathlib import Path

    from quantrack.runner import RunOptions, run_study
    from quantrack.study import load_study

    study = load_study(study_file)
    opts = RunOptions(arm=arm, base_url=base_url, server_log=server_log, tracking_uri=tracking_uri,
                      workdir=Path(workdir) if workdir else None)
    result = run_study(study, opts, progress=lambda m: click.echo(f"quantrack: {m}", err=True))
    for o in result.outcomes:
        where = result.logged[o.arm.name]
        dest = where.run_id or f"spooled ({where.spooled})"
        extra = f": {o.error}" if o.error else ""
        click.echo(f"{o.arm.name}\t{o.status}\t{dest}{extra}")
    if result.failed:
        raise SystemExit(1)
