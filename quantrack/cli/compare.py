"""`quantrack compare`: the study table from the tracking store (FILL IN where unmeasured)."""

from __future__ import annotations

import click


@click.command("compare")
@click.option("--experiment", required=True, metavar="NAME", help="MLflow experiment (the study name).")
@click.option("--baseline", default=None, metavar="ARM",
              help="Arm the Δ column is against (default: the arm tagged baseline, else bf16).")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json"]), default="table",
              show_default=True)
@click.option("--prices", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="GPU prices (TOML, [[price]] tables) for the derived cost column "
                   "(default: the shipped rules/prices.toml).")
@click.option("--gpu", default=None, metavar="NAME",
              help="Only the runs measured on this GPU (a fleet experiment otherwise prints one table per GPU).")
@click.option("--wide", is_flag=True, help="Every column (predicted capacity, capacity error, KV MiB, paired test, "
                                           "…); the default table keeps the decision columns within 120 characters.")
@click.option("--budget", default=None, metavar="PP",
              help="Accuracy budget such as 1pp: a Budget column (within / exceeds / undecided, per arm at 95%): the "
                   "study's sequential verdict where it judged this budget, else fixed-n on the paired records.")
@click.option("--allow-model-mismatch", is_flag=True,
              help="Pair arms whose source models differ (their recorded quantrack.model_source_sha256); by default "
                   "their Δ and paired test read n/a.")
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds one request to a tracking server may take (default 60; $MLFLOW_HTTP_REQUEST_TIMEOUT).")
def compare(experiment: str, baseline: str | None, fmt: str, prices: str | None, gpu: str | None,
            wide: bool, budget: str | None, allow_model_mismatch: bool, tracking_uri: str | None,
            timeout: float | None) -> None:
    """One row per arm (its newest finished run; skipped re-runs are counted in a footnote): weights,
    capacity (reported and predicted), KV MiB, batch-1 TPOT, derived $ per 1M output tokens at the highest
    measured sweep concurrency, GSM8K with its 95% Wilson interval, Δ vs baseline with the paired McNemar
    test, fallback, top-1 agreement and KL. An experiment measured on several GPUs (a fleet study) gets one
    table per GPU, each against that GPU's baseline."""
    from quantrack.errors import BadInput
    from quantrack.report.compare import compare_by_gpu, render_many
    from quantrack.store.uri import set_request_timeout

    set_request_timeout(timeout)
    from quantrack.constraints import parse_accuracy_drop

    frac = None if budget is None else parse_accuracy_drop(budget, "--budget")

    if wide and fmt != "table":
        raise BadInput(f"--wide applies to --format table (md, csv and json always hold every column), "
                       f"not --format {fmt}")
    click.echo(render_many(compare_by_gpu(experiment, baseline, tracking_uri, prices, gpu, frac,
                                                allow_model_mismatch), fmt, wide), nl=False)
