"""`quantrack audit`: find fleet nodes that silently fell back to a slower kernel."""

from __future__ import annotations

import click


@click.command("audit")
@click.option("--experiment", "experiments", multiple=True, metavar="NAME",
              help="Audit the tracked runs of this experiment (repeatable).")
@click.option("--logs", "log_dirs", multiple=True, metavar="DIR", type=click.Path(file_okay=False),
              help="Audit the raw engine startup logs (*.log) in this directory (repeatable).")
@click.option("--gpu", default=None, metavar="NAME",
              help="Catalog GPU the raw logs ran on, for logs that do not name it: FP8 weights below compute "
                   "capability 8.9 are then a fallback by the rulebook's gate, line or no line.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--tracking-uri", default=None, metavar="URI", help="MLflow store (default as `quantrack run`).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds one request to a tracking server may take (default 60; $MLFLOW_HTTP_REQUEST_TIMEOUT).")
def audit(experiments: tuple[str, ...], log_dirs: tuple[str, ...], gpu: str | None, fmt: str,
          tracking_uri: str | None, timeout: float | None) -> None:
    """Per node: GPU, compute capability, MIG, engine version, requested quantization, effective kernel,
    fallback with its evidence line, capacity deviation and TPOT against the same GPU + arm median.

    Every engine's catalogue of fallback lines is searched in every log, whatever engine it reads as. A node that
    cannot be read (engine unclear, log cut before the weights load, no fallback tag on a run, binary or empty
    file) is UNKNOWN with its reason, never "no". An FP8-weights node is "no" only with evidence of the native path:
    a GPU of compute capability >= 8.9 (from the log, the run or --gpu) or a native FP8 kernel line.

    Exit codes: 4 when any node fell back; otherwise 5 when any node is unknown; 0 only when every node was read
    and none fell back.
    """
    from quantrack.report.audit import audit as run_audit
    from quantrack.report.audit import render
    from quantrack.store.uri import set_request_timeout

    set_request_timeout(timeout)
    report = run_audit(experiments, log_dirs, tracking_uri, gpu)
    click.echo(render(report, fmt), nl=False)
    if report.exit_code:
        raise SystemExit(report.exit_code)
