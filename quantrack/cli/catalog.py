"""``quantrack catalog gpus|models``: list the built-in catalogs (each entry with its source)."""

from __future__ import annotations

from typing import Any

import click

_FORMATS = click.Choice(["table", "json", "csv", "md"])


@click.group("catalog")
def catalog() -> None:
    """List the built-in GPU and model catalogs."""


@catalog.command("gpus")
@click.option("--format", "fmt", type=_FORMATS, default="table", show_default=True)
@click.option("--sources", is_flag=True, help="Add the source column.")
def gpus_cmd(fmt: str, sources: bool) -> None:
    """GPUs: vendor, arch, compute capability / gfx, memory per device, bandwidth, aliases."""
    from quantrack.hardware import catalog as cat
    from quantrack.render import render

    rows: list[dict[str, Any]] = [g.to_dict() for g in cat.gpus()]
    if fmt in ("json", "csv"):
        click.echo(render(rows, fmt))
        return
    cols = ["name", "vendor", "arch", "compute_capability", "gfx", "memory_gib", "nvml_total_mib",
            "bandwidth_gbs", "aliases"] + (["source"] if sources else [])
    click.echo(render(rows, "md" if fmt == "md" else "table", columns=cols,
                      title="GPU catalog (memory per device, GiB; bandwidth GB/s; from rules/gpus.toml)"))


@catalog.command("models")
@click.option("--format", "fmt", type=_FORMATS, default="table", show_default=True)
@click.option("--sources", is_flag=True, help="Add the source column.")
def models_cmd(fmt: str, sources: bool) -> None:
    """Models: params, layers, KV heads, head dim, hidden, vocab, tied embeddings, max context."""
    from quantrack.hardware import catalog as cat
    from quantrack.render import render

    rows: list[dict[str, Any]] = [m.to_dict() for m in cat.models()]
    if fmt in ("json", "csv"):
        click.echo(render(rows, fmt))
        return
    cols = ["name", "params", "layers", "kv_heads", "head_dim", "hidden_size", "vocab_size", "intermediate_size",
            "tied_embeddings", "max_context", "unsupported"] + (["source"] if sources else [])
    for r in rows:
        r["params"] = f"{r['params']:,.0f}"
    click.echo(render(rows, "md" if fmt == "md" else "table", columns=cols,
                      title="Model catalog (shapes from config.json; from rules/models.toml)"))
