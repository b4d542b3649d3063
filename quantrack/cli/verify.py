"""`quantrack verify`: every arm run's stored figures recomputed from its own artifacts."""

from __future__ import annotations

import click


@click.command("verify")
@click.option("--experiment", required=True, metavar="NAME", help="MLflow experiment (the study name).")
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds one request to a tracking server may take (default 60; $MLFLOW_HTTP_REQUEST_TIMEOUT).")
def verify(experiment: str, tracking_uri: str | None, fmt: str, timeout: float | None) -> None:
    """For every arm run of the experiment, recompute its figures from the run's own artifacts (per-question
    GSM8K records, latency samples, KL per-text figures, the engine log parsed again, sweep counts) and name
    each stored metric that disagrees (stored, recomputed). Per arm it says how many figures were recomputed,
    how many could only be compared with their artifact's summary, and which stored metrics were not recomputed
    and why: a figure not recomputed is never called verified.

    Exit codes: 0 when every figure checked agrees, 1 when any disagrees, 2 for bad input.
    """
    import json

    from quantrack.report.verify import render, verify_experiment
    from quantrack.store.uri import set_request_timeout

    set_request_timeout(timeout)
    result = verify_experiment(experiment, tracking_uri)
    click.echo(json.dumps(result.to_dict(), indent=1) if fmt == "json" else render(result), nl=fmt == "json")
    if not result.ok:
        raise SystemExit(1)
