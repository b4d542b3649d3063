"""`quantrack log`: record results measured elsewhere as an arm run (the lab's manual workflow)."""

from __future__ import annotations

import click

from quantrack.engines import ENGINE_KINDS


@click.command("log")
@click.option("--study", "study_file", required=True, metavar="STUDY.toml", type=click.Path(dir_okay=False),
              help="The study the arm belongs to (experiment, model, engine, GPU).")
@click.option("--arm", required=True, metavar="NAME", help="The arm these results are for.")
@click.option("--latency", default=None, metavar="row.json", type=click.Path(dir_okay=False),
              help="A latency row: `quantrack latency --output` JSON or the reference client's JSON.")
@click.option("--eval", "eval_path", default=None, metavar="result.json|records.jsonl",
              type=click.Path(dir_okay=False),
              help="GSM8K per-question records (.jsonl; enables the paired test) or a result JSON.")
@click.option("--server-log", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="The server's startup log (weights, KV tokens, kernel, fallbacks).")
@click.option("--engine", default=None, type=click.Choice(ENGINE_KINDS),
              help="Engine that produced the log, if not the study's.")
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
def log(study_file: str, arm: str, latency: str | None, eval_path: str | None, server_log: str | None,
        engine: str | None, tracking_uri: str | None) -> None:
    """Log an arm run from files: every metric comes from the files given, nothing else is filled in."""
    from pathlib import Path

    from quantrack.run.imported import LogInputs, log_results
    from quantrack.store.uri import resolve_uri
    from quantrack.study import load_study

    if tracking_uri and not tracking_uri.startswith("sqlite:///"):
        resolve_uri(tracking_uri)  # refused before anything is read or logged
    # (a sqlite URI is resolved, which creates its folder, only once every file given was checked)
    inputs = LogInputs(study=load_study(study_file), arm=arm, latency=Path(latency) if latency else None,
                       eval=Path(eval_path) if eval_path else None,
                       server_log=Path(server_log) if server_log else None, engine=engine,
                       tracking_uri=tracking_uri)
    rec, where = log_results(inputs, progress=lambda m: click.echo(f"quantrack: {m}", err=True))
    dest = where.run_id or f"spooled ({where.spooled})"
    metrics = rec.latest_metrics()
    click.echo(f"{arm}\t{rec.status}\t{dest}\t{len(rec.params)} params, {len(metrics)} metrics, "
               f"{len(rec.artifacts) + len(rec.artifact_files)} artifacts")
