"""`quantrack probe`: is there a native FP8 GEMM on this node, and how much faster is it than bf16?"""

from __future__ import annotations

import json

import click


@click.command("probe")
@click.option("--model", "model_name", default="Llama-3-8B", show_default=True,
              help="Catalog model whose linear-layer shapes are timed (q/k/v, o, gate/up, down).")
@click.option("--batch", "batch", default="1,16,64,256,1024", show_default=True,
              help="Comma-separated batch sizes (tokens per GEMM).")
@click.option("--repeats", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0, 1000))
@click.option("--graphs/--no-graphs", default=True, show_default=True,
              help="Time each pass as one replayed CUDA graph (removes Python launch overhead at small batch).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON result here.")
@click.option("--track", is_flag=True, help="Log the result to MLflow as a node fact (used by `audit`).")
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlruns).")
def probe(model_name: str, batch: str, repeats: int, warmup: int, graphs: bool, fmt: str, out: str | None, track: bool,
          tracking_uri: str | None) -> None:
    """Time bf16 torch.matmul against FP8 torch._scaled_mm (e4m3) at the model's linear shapes on GPU 0.

    Measured with CUDA events (median of repeats, weight copies rotated so L2 does not serve the read),
    plus a large device-to-device copy for the achievable bandwidth. Verdict: "native" FP8 path when an FP8
    GEMM runs and the layer stack is >= 1.05x faster than bf16 at some batch size, else "none". Needs
    `pip install 'quantrack[probe]'` and an NVIDIA GPU; without CUDA it says so and exits 2.
    """
    from quantrack.hardware import catalog
    from quantrack.hardware.probe import parse_batches, run_probe

    shape = catalog.get_model(model_name)
    batches = parse_batches(batch)
    result = run_probe(shape, batches, repeats=repeats, warmup=warmup, graphs=graphs,
                       progress=lambda s: click.echo(s, err=True))
    data = result.to_dict()
    if out:
        from quantrack.store.files import atomic_write_text

        atomic_write_text(out, json.dumps(data, indent=1), flag="--out")
    if track:
        from quantrack.store.tracking import log_node_fact

        run_id = log_node_fact("probe", data, tracking_uri=tracking_uri)
        click.echo(f"logged probe as MLflow run {run_id}", err=True)
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
        return
    from tabulate import tabulate  # type: ignore[import-untyped]

    rows = [[b.batch, f"{b.bf16_stack_ms:.3f}", "n/a" if b.fp8_stack_ms is None else f"{b.fp8_stack_ms:.3f}",
             "n/a" if b.speedup is None else f"{b.speedup:.2f}x", f"{b.bf16_gbps:,.0f}",
             "n/a" if b.fp8_gbps is None else f"{b.fp8_gbps:,.0f}"] for b in result.batches]
    click.echo(f"FP8 probe on {result.device['name']} (cc {result.device['compute_capability']}), "
               f"{result.model} x {result.layers} layers — measured")
    click.echo(tabulate(rows, headers=["batch", "bf16 stack ms", "fp8 stack ms", "speedup", "bf16 GB/s",
                                       "fp8 GB/s"]))
    click.echo(f"device-to-device copy: {result.copy_tbps:.2f} TB/s (read+write)")
    click.echo(f"verdict: {result.verdict} — " + "; ".join(result.evidence[-2:]))
    click.echo(f"method: {result.method}")
