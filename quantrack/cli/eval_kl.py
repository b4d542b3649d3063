"""`quantrack eval kl`: top-1 agreement and KL divergence of a candidate arm against its baseline server."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from quantrack.cli.options import setting_option
from quantrack.study import EngineSpec, EvalSpec


@click.command("kl")
@click.option("--baseline", required=True, metavar="URL", help="Baseline arm's server, e.g. http://127.0.0.1:8000.")
@click.option("--candidate", required=True, metavar="URL", help="Candidate (quantized) arm's server.")
@setting_option(EngineSpec, "kind", name="engine", help="Engine both servers run (their logprob APIs differ).")
@click.option("--texts", "texts_path", type=click.Path(dir_okay=False), default=None,
              help='JSONL of {"prompt", "continuation"}; default: GSM8K test questions + reference answers.')
@setting_option(EvalSpec, "kl_tokens", name="tokens", default=2000, help="Stop after this many scored positions.")
@setting_option(EvalSpec, "kl_top_k", name="top_k")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON result here.")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Seconds a server may take to answer one request (connect: 10 s).")
def kl(baseline: str, candidate: str, engine: str, texts_path: str | None, tokens: int, top_k: int, fmt: str,
       out: str | None, timeout: float) -> None:
    """Teacher-force the same token ids through both servers and compare their next-token distributions.

    Reports top-1 agreement, KL(P_base || P_cand) mean / median / p99 in nats from the top-k
    log-probabilities (with a guaranteed lower bound and the mass outside the top-k) and 95% bootstrap
    intervals over texts. An arm against itself gives agreement 1 and KL 0.
    """
    from quantrack.accuracy.kl import run_kl
    from quantrack.accuracy.texts import load_texts
    from quantrack.store.files import check_writable

    check_writable(out, "--out")
    texts = load_texts(texts_path) if texts_path else None
    tty = sys.stderr.isatty()
    result = run_kl(baseline, candidate, engine, texts=texts, tokens=tokens, top_k=top_k,
                    progress=lambda msg: click.echo(f"\r{msg}" if tty else msg, err=True, nl=not tty),
                    texts_label=texts_path, timeout_s=timeout)
    if tty:
        click.echo("", err=True)
    data = result.to_dict()
    if out:
        from quantrack.store.files import atomic_write_text

        atomic_write_text(out, json.dumps(data, indent=1), flag="--out")
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
        return
    click.echo(render_table(data))


def _ci(data: dict[str, Any], key: str, digits: int) -> str:
    ci = (data.get("ci") or {}).get(key)
    return f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "n/a (< 2 texts)"


def render_table(data: dict[str, Any]) -> str:
    """The human-readable summary of a KL result dict (``KLResult.to_dict()``)."""
    from tabulate import tabulate  # type: ignore[import-untyped]

    rows = [
        ["top-1 agree", f"{data['top1_agree']:.4f}", _ci(data, "top1_agree", 4)],
        ["KL mean (nats)", f"{data['kl_mean']:.5f}", _ci(data, "kl_mean", 5)],
        ["KL median", f"{data['kl_median']:.5f}", ""],
        ["KL p99", f"{data['kl_p99']:.5f}", ""],
        ["KL mean, lower bound", f"{data['kl_lower_mean']:.5f}", "guaranteed <= true mean"],
        ["mass outside top-k (base / cand)", f"{data['base_tail_mass']:.4f} / {data['cand_tail_mass']:.4f}", ""],
        ["top-k overlap", f"{data['topk_overlap']:.4f}", ""],
    ]
    head = (f"fidelity ({data['engine']}, top-{data['top_k']}) — measured: {data['n_positions']} positions over "
            f"{data['n_texts']} texts in {data['wall_s']} s\n"
            f"baseline  {data['baseline_url']}\ncandidate {data['candidate_url']}")
    return head + "\n" + tabulate(rows, headers=["", "value", "95% CI (bootstrap over texts)"])
