"""`quantrack compare`: the study table from the tracking store (FILL IN where unmeasured)."""

from __future__ import annotations

import click


@click.command("compare")
@click.option("--experiment", required=True, metavar="NAME", help="MLflow experiment (the study name).")
@click.option("--baseline", default=None, metavar="ARM",
              help="Arm the Δ column is against (default: the arm tagged baseline, else bf16).")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json"]), default="table",
              show_default=True)
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
def compare(experiment: str, baseline: str | None, fmt: str, tracking_uri: str | None) -> None:
    """One row per arm (its newest finished run): weights, capacity (reported and predicted), batch-1 TPOT,
    GSM8K, Δ vs baseline with the paired McNemar test, fallback, top-1 agreement and KL."""
    from quantrack.report.compare import compare_experiment, render

    click.echo(render(compare_experiment(experiment, baseline, tracking_uri), fmt), nl=False)
