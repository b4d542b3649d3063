"""``quantrack sweep``: throughput/latency at several concurrency levels; speedup plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from quantrack.cli.options import setting_option
from quantrack.errors import BadInput, MeasurementError
from quantrack.study import EngineSpec, LatencySpec, SweepSpec

HELP = """Throughput and latency at several load levels (measured).

Concurrency levels (closed loop): exactly C requests are kept in flight until --requests
have finished (default 4 x C, at least 8). Rate levels (--rate, open loop): requests are
sent at R/s on a seeded Poisson (or --arrival constant) schedule, at most
--max-concurrency in flight; the achieved rate is shown beside R. Each request has
--input-tokens in (token ids from the server's /tokenize) and --output-tokens out
(ignore_eos). Per level: output throughput, TTFT and TPOT p50/p90/p95/p99, goodput
against --goodput SLOs, the engine's own /metrics (KV usage, running/waiting,
preemptions, prefix-cache hits), failures; --repeats N gives a mean and 95% interval.
--slo-search bisects between the measured levels for the highest one meeting an SLO
(the answer is always a measured level); with --search-mode rate (or concurrency) it
probes new levels over --search-range LOW:HIGH instead: doubling from LOW until a miss,
then bisecting until the bracket is within --search-tolerance, each probe measured
--search-repeats times; the answer is a bracket [highest met, lowest missed]
(docs/load.md).

\b
Workloads (--dataset; docs/workloads.md):
  random         distinct filler prompts of exact token counts (default)
  gsm8k          GSM8K test questions, their answers' token counts as output
  shared-prefix  --prefix-groups N groups sharing a --prefix-tokens P prefix, then a distinct suffix
  multi-turn     --turns K: each turn resends the history and the previous answer
  length-mix     --lengths FILE: input,output[,weight] pairs drawn by weight (seeded)
  trace          --trace FILE: a Mooncake JSONL replayed (rate levels scale its times)
Per level the prefix-cache hit rate is shown (engine /metrics, else per-request counts).
--save keeps what each level sent (token ids, lengths, send times) and the seeds.

\b
Formulas:
  output tok/s = sum(usage.completion_tokens of ok requests) / level wall time
  level wall time = first request sent -> last request finished
  TPOT = (e2e - TTFT) / (output tokens - 1) per request

\b
Examples:
  quantrack sweep --engine vllm --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --save fp8.json
  quantrack sweep --engine vllm --base-url URL --rate 1,2,4,8 --goodput ttft:500,tpot:50
  quantrack sweep --engine vllm --base-url URL --concurrency 1,64 --slo-search 'tpot_p95<=50ms'
  quantrack sweep --engine vllm --base-url URL --slo-search 'ttft_p95<=1000ms' --search-mode rate
      --search-range 0.5:64 --search-tolerance 0.1 --search-repeats 2
  quantrack sweep --plot bf16.json fp8.json --out speedup.png
"""


@click.command("sweep", help=HELP)
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine behind --base-url.")
@click.option("--base-url", help="Server root, e.g. http://127.0.0.1:8000")
@setting_option(SweepSpec, "concurrency", default=None, help="Comma-separated levels [default: 1,4,16,64 "
                "without --rate].")
@setting_option(SweepSpec, "rates", "--request-rate", help="Comma-separated request rates (requests/s): open-loop levels.")
@setting_option(SweepSpec, "arrival")
@setting_option(SweepSpec, "seed")
@setting_option(SweepSpec, "max_concurrency")
@setting_option(SweepSpec, "goodput", help="Per-request SLOs in ms, e.g. ttft:500,tpot:50,e2el:10000 "
                "(the grammar of vllm bench serve --goodput).")
@setting_option(SweepSpec, "slo_search")
@setting_option(SweepSpec, "search_mode")
@setting_option(SweepSpec, "search_range")
@setting_option(SweepSpec, "search_tolerance")
@setting_option(SweepSpec, "search_repeats")
@setting_option(SweepSpec, "repeats")
@setting_option(SweepSpec, "dataset", "--dataset-name")
@setting_option(SweepSpec, "range_ratio")
@setting_option(SweepSpec, "prefix_groups")
@setting_option(SweepSpec, "prefix_tokens")
@setting_option(SweepSpec, "turns")
@setting_option(SweepSpec, "lengths", help="length-mix: a file of input,output[,weight] token lengths per line "
                "(or JSONL with input_tokens, output_tokens).")
@setting_option(SweepSpec, "trace", help="trace: a Mooncake-format JSONL (timestamp ms, input_length, "
                "output_length[, hash_ids] per line).")
@click.option("--no-scrape", is_flag=True, help="Do not read the server's /metrics during the levels.")
@setting_option(SweepSpec, "requests_per_level")
# --random-input-len / --random-output-len: `vllm bench serve` and `sglang.bench_serving` (random dataset,
# sglang@0033168f0:python/sglang/bench_serving.py usage); --input-len / --output-len: `vllm bench latency`
@setting_option(SweepSpec, "input_tokens", "--input-len", "--random-input-len", default=1024,
                help="Prompt length in tokens.")
@setting_option(SweepSpec, "output_tokens", "--output-len", "--random-output-len", default=128,
                help="Output tokens per request (ignore_eos); TPOT needs two.")
@setting_option(LatencySpec, "warmup", default=2, help="Requests sent one at a time before the first level.")
@click.option("--num-prompts", type=int, hidden=True, expose_value=False, callback=lambda _c, _p, v: _no_num_prompts(v))
@click.option("--chat", is_flag=True, help="Use /v1/chat/completions (prompt length becomes approximate).")
@click.option("--model", help="Model name to send (default: first id at /v1/models).")
@click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, help="Sent as Authorization: Bearer; never printed or saved.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds without data before a request fails.")
@click.option("--label", help="Name of this arm in saved files and plots.")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), help="Write the sweep (JSON, rows per level).")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even if some requests failed.")
@click.option("--plot", is_flag=True, help="Plot speedup of FILES[1] over FILES[0] instead of measuring.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("speedup.png"), show_default=True)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
def sweep(
    engine: str | None,
    base_url: str | None,
    concurrency: tuple[int, ...] | None,
    rates: tuple[float, ...],
    arrival: str,
    seed: int,
    max_concurrency: int,
    goodput: str | None,
    slo_search: str | None,
    search_mode: str,
    search_range: str | None,
    search_tolerance: float,
    search_repeats: int,
    repeats: int,
    dataset: str,
    range_ratio: float,
    prefix_groups: int,
    prefix_tokens: int,
    turns: int,
    lengths: str | None,
    trace: str | None,
    no_scrape: bool,
    requests_per_level: int,
    input_tokens: int,
    output_tokens: int,
    warmup: int,
    chat: bool,
    model: str | None,
    api_key: str | None,
    timeout: float,
    label: str | None,
    save: Path | None,
    allow_failures: bool,
    plot: bool,
    out: Path,
    files: tuple[Path, ...],
) -> None:
    if plot:
        if len(files) != 2:
            raise BadInput(f"--plot needs two sweep files: BASELINE ARM (got {len(files)})")
        from quantrack.report.plots import (
            plot_speedup,
            speedup_points,
            sweep_rows_from_file,
        )

        label_a, rows_a = sweep_rows_from_file(files[0])
        label_b, rows_b = sweep_rows_from_file(files[1])
        path = plot_speedup(rows_a, rows_b, out, label_a=label_a, label_b=label_b)
        click.echo(_render_points(speedup_points(rows_a, rows_b), label_a, label_b))
        click.echo(f"wrote {path}")
        return
    if files:
        raise BadInput(f"unexpected argument {str(files[0])!r} (files are read only with --plot)")
    if not engine or not base_url:
        raise BadInput("--engine and --base-url are required (or use --plot BASE.json ARM.json)")

    from quantrack.interrupts import Interrupted
    from quantrack.measure.load import parse_criterion, parse_request_slo
    from quantrack.measure.search import probe_spec
    from quantrack.measure.sweep import LoadOptions, run_sweep

    criterion = parse_criterion(slo_search) if slo_search else None
    probe = probe_spec(search_mode, search_range, search_tolerance, search_repeats, criterion=criterion)
    levels = list(concurrency) if concurrency is not None else ([] if rates or probe else [1, 4, 16, 64])
    load = LoadOptions(arrival=arrival, seed=seed, max_concurrency=max_concurrency or None,
                       slo=parse_request_slo(goodput) if goodput else None, repeats=repeats, scrape=not no_scrape,
                       search=criterion, probe=probe, dataset=dataset,
                       range_ratio=range_ratio, prefix_groups=prefix_groups, prefix_tokens=prefix_tokens,
                       turns=turns, lengths=lengths, trace=trace, keep_sent=save is not None)
    try:
        result = run_sweep(
            base_url,
            engine,
            levels,
            rates=list(rates or ()),
            load=load,
            requests_per_level=requests_per_level or None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            warmup=warmup,
            chat=chat,
            api_key=api_key or None,
            model=model,
            progress=_progress(),
            timeout=timeout,
            label=label,
        )
    except Interrupted as exc:  # Ctrl-C: what was measured is printed and saved, then exit 130
        result = exc.partial
    if sys.stderr.isatty():
        click.echo("", err=True)
    data = result.to_dict()
    click.echo(_render_sweep(data))
    if save:
        from quantrack.store.files import atomic_write_text

        atomic_write_text(save, json.dumps(data, indent=2) + "\n", flag="--save")
        click.echo(f"saved {save}" + (" (interrupted: partial)" if result.interrupted else ""))
    if result.interrupted:
        click.echo("quantrack: interrupted; kept the finished levels", err=True)
        sys.exit(130)
    failed = result.n_failed + len(result.warmup_errors)
    if failed and not allow_failures:
        reasons: dict[str, int] = {}
        for row in data["rows"]:
            for k, v in row["failures"].items():
                reasons[k] = reasons.get(k, 0) + v
        for e in result.warmup_errors:
            reasons[e] = reasons.get(e, 0) + 1
        text = "; ".join(f"{k} (x{v})" for k, v in reasons.items())
        raise MeasurementError(f"{failed} requests failed: {text} (use --allow-failures to accept)")


RAMP_WARN = 0.9  # a closed-loop level whose mean in-flight requests fall below this share of C is ramp/drain-bound


def _no_num_prompts(value: int | None) -> None:
    """vLLM/SGLang's --num-prompts counts every request of a run; quantrack's --requests counts per level."""
    if value is not None:
        raise BadInput("--num-prompts (vllm bench serve / sglang.bench_serving) counts the requests of the whole "
                       "run; quantrack sweep measures each level separately: give --requests N per level")


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _render_sweep(data: dict[str, Any]) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    head = (
        f"sweep (measured) - {data['label'] or '(no label)'}: {data['engine']} at {data['base_url']}, model {data['model']}\n"
        f"input {data['input_tokens']} tokens ({data['prompt']}), output {data['output_tokens']} tokens (ignore_eos)"
    )
    from quantrack.measure.sweep import level_label

    table = []
    for r in data["rows"]:
        tt, tp = r["ttft_ms"] or {}, r["tpot_ms"] or {}
        gp, sm = r.get("goodput") or {}, r.get("server_metrics") or {}
        ci = (r.get("repeat_stats") or {}).get("output_tok_s")
        tps = _f(r["output_tok_s"], 1) + (f" [{ci['ci95_low']:.1f}–{ci['ci95_high']:.1f}]"
                                           if ci and ci.get("ci95_low") is not None else "")
        level = level_label(r) + ("*" if r.get("search") else "")
        if r.get("mode") == "rate":
            level += f" ({_f(r.get('achieved_rate'))}/s)"
        table.append([
            level, f"{r['n_ok']}/{r['requests']}", _f(r["wall_s"]), tps,
            _f(tt.get("p50")), _f(tt.get("p95")), _f(tt.get("p99")),
            _f(tp.get("p50")), _f(tp.get("p95")), _f(tp.get("p99")),
            _f(gp.get("request_s")), _f(sm.get("kv_usage_max")), _f(sm.get("running_max"), 0),
            _f(sm.get("waiting_max"), 0),
            "unknown" if r.get("prefix_cache_hit_rate") is None else _f(r["prefix_cache_hit_rate"], 3),
        ])
    headers = ["level (achieved)", "ok/sent", "wall s", "out tok/s", "TTFT p50", "p95", "p99", "TPOT p50 ms", "p95",
               "p99", "goodput req/s", "KV max", "run max", "wait max", "prefix hit"]
    lines = [head, tabulate(table, headers=headers, disable_numparse=True)]
    load = data.get("load") or {}
    if load.get("slo"):
        lines.append("goodput SLO (per request, ms): " + ", ".join(f"{k} <= {v:g}" for k, v in load["slo"].items()))
    if any(r.get("mode") == "rate" for r in data["rows"]):
        lines.append(f"rate levels: {load.get('arrival')} arrivals, seed {load.get('seed')}, max concurrency "
                     f"{load.get('max_concurrency') or 'none'}; (achieved) = (sent - 1) / dispatch span")
    if (load.get("repeats") or 1) > 1:
        lines.append(f"repeats: {load['repeats']} per level; figures are means, [95% t-interval] of out tok/s")
    thin = [f"{level_label(r)} {r['mean_in_flight'] / r['concurrency']:.0%}" for r in data["rows"]
            if r.get("mode") != "rate" and isinstance(r.get("mean_in_flight"), (int, float))
            and r.get("concurrency") and r["mean_in_flight"] / r["concurrency"] < RAMP_WARN]
    if thin:
        lines.append("⚠ mean requests in flight / level below 90% (ramp-up and drain inside the wall time): "
                     + ", ".join(thin) + "; raise --requests (vllm bench serve's --num-prompts default is 1000) "
                     "for steady-state figures")
    if any(r.get("server_metrics") for r in data["rows"]):
        lines.append("KV max / run max / wait max: the engine's own /metrics during the level (- = not served)")
    srcs = {(r.get("prefix_cache") or {}).get("source") or "" for r in data["rows"]} - {""}
    unknown = {str(why) for r in data["rows"] if r.get("prefix_cache_hit_rate") is None
               and (why := (r.get("prefix_cache") or {}).get("unknown"))}
    if srcs:
        lines.append("prefix hit: cached prompt tokens / prompt tokens, from " + "; ".join(sorted(srcs)))
    for why in sorted(unknown):
        lines.append(f"prefix hit unknown: {why}")
    s_ = data.get("slo_search")
    if s_ and s_.get("method") == "probe":
        lines.extend(_render_probe_search(s_))
    elif s_:
        lines.append(f"SLO search {s_['criterion']}: highest measured {s_['mode']} meeting it: "
                     f"{s_['limit'] if s_['limit'] is not None else 'none'}"
                     + (f"; first miss {s_['first_miss']}" if s_.get("first_miss") is not None else
                        " (no measured level missed: the limit is at least that)") + "; * = measured by the search")
    for r in data["rows"]:
        for reason, n in r["failures"].items():
            lines.append(f"FAILED x{n} at concurrency {r['concurrency']}: {reason}")
    if data["interrupted"]:
        lines.append("INTERRUPTED: levels after the last row were not measured")
    lines.append("formulas: " + "; ".join(data["formulas"][k] for k in ("output_tok_s", "wall_s", "tpot")))
    return "\n".join(lines)


def _render_probe_search(s: dict[str, Any]) -> list[str]:
    """The probing search's answer: its bracket first (never a point without it), then every probe."""
    from quantrack.measure.search import bracket_text

    unit = "c" if s["mode"] == "concurrency" else "r"
    lines = [f"SLO search {s['criterion']} (search result, measured probes): bracket {bracket_text(s)}",
             f"  stopped: {s['stop_text']}; ascent: {s['ascent_stop']}",
             (f"  range {unit}{s['range'][0]:g}-{unit}{s['range'][1]:g}, tolerance {s['tolerance']:g}, "
             f"{s['repeats']} repeats per probe, {s['n_probes']} probes (bound {s['probe_bound']}); "
             f"over-saturation: {s['saturation_rule']}")]
    for p in s["probes"]:
        sp = p.get("spread_ms")
        spread = f" (repeats {sp[0]:.1f}–{sp[1]:.1f})" if sp and len(p.get("repeats_ms") or []) > 1 else ""
        val = f"{p['value_ms']:.1f} ms{spread}" if p.get("value_ms") is not None else f"unknown: {p.get('why')}"
        verdict = "meets" if p["meets"] else ("misses: over-saturated, " + p["saturated"] if p.get("saturated")
                                              else "misses")
        lines.append(f"  probe {unit}{p['level']:g}: {val}: {verdict}"
                     + ("; its repeats disagree" if p.get("repeats_disagree") else ""))
    lines.append("  * = measured by the search (each probe is a level above)")
    return lines


def _render_points(points: list[dict[str, Any]], label_a: str, label_b: str) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    rows = [[p["concurrency"], _f(p["throughput_ratio"], 3), _f(p["tpot_ratio"], 3)] for p in points]
    return f"speedup of {label_b} over {label_a} (measured ratios, >1 = {label_b} faster)\n" + tabulate(
        rows, headers=["concurrency", "out tok/s ratio", "TPOT ratio (base/arm)"]
    )


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None

    def show(phase: str, done: int, total: int) -> None:
        click.echo(f"\r{phase}: {done}/{total} requests   ", err=True, nl=False)

    return show
