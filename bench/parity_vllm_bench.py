"""Parity of `quantrack sweep` with `vllm bench serve`: the same server, the two clients interleaved per level.

Per concurrency level the script runs, alternating the order each round:

* quantrack's sweep (closed loop, ``--requests N``, per-request samples kept);
* the reference: ``vllm bench serve`` (``--reference vllm``: run as a subprocess with ``--max-concurrency C
  --num-prompts N --request-rate inf --save-result``; needs vLLM in PATH) or a saved ``--save-result`` JSON
  (``--reference vllm-json --vllm-json FILE ...``, one per level, imported by :func:`import_vllm_result`);

and prints, per level, the ratios quantrack / reference of output tok/s, median TTFT and median TPOT, with
quantrack's own diagnostics: mean requests in flight / C (ramp-up and drain inside the level's wall time) and the
client's CPU ms per streamed token.

**A cache cannot fool it.** The engine's prefix-cache counters are read from its ``/metrics`` before and after
*each* tool's run (vLLM ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``: the
``Counter(name="vllm:prefix_cache_hits")`` / ``"vllm:prefix_cache_queries"`` of ``vllm/v1/metrics/loggers.py``,
exposed with ``_total`` by prometheus_client; llama.cpp ``llamacpp:prompt_tokens_cached_total`` /
``llamacpp:prompt_tokens_total``), so each run has its own hit rate = hits / queried prompt tokens over the run.
``vllm bench serve`` gets a fresh ``--seed`` every run (its random dataset with the default seed sends the same
prompts each time, and a re-run's prefills then come from the cache); quantrack salts its prompts. A round whose
two hit rates differ by more than ``--hit-rate-tolerance`` (default 0.05) gets no ratio: the script says so and
why, and a level with no such round prints none. ``--reference definitions`` recomputes the reference from the
same run (same hit rate by construction); ``--reference vllm-json`` cannot see the saved run's cache, so its
ratios are refused unless ``--accept-unknown-cache`` (then labelled "cache not checked").

``--reference definitions`` (what runs here, on the CPU, where vLLM's CUDA wheel does not install): recomputes
vLLM's figures *from quantrack's own per-request samples* with vLLM's formulas
(``vllm@4ba787ec9:vllm/benchmarks/serve.py:calculate_metrics`` L602-L810, engine-facts §5.3:
``output_throughput = sum(output_lens) / dur_s``; ``tpot = (latency - ttft) / (output_len - 1)`` for
``output_len > 1``; medians by ``np.median``), so a ratio away from 1 is a definition that differs, and
``--compare-requests M`` runs each level a second time with M requests (vLLM's default ``--num-prompts`` is 1000)
to measure what the request count does to the same server's figures (the ramp-up / drain share of the wall).

Usage (CPU, starts a llama.cpp server on the SmolLM2 GGUF the tests use):

    python bench/parity_vllm_bench.py --llamacpp --concurrency 1,2,4 --requests 8 --compare-requests 32 \\
        --input-tokens 64 --output-tokens 16 --rounds 2 --json parity.json

On the H200 (vLLM server already running; NOT RUN YET): bench/parity_vllm_h200.sh.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def vllm_definitions(samples: list[dict[str, Any]], dur_s: float) -> dict[str, float | None]:
    """vLLM's calculate_metrics over quantrack's samples (a failed request counts 0 output tokens)."""
    ok = [s for s in samples if s.get("ok")]
    out_lens = [int(s.get("completion_tokens") or 0) for s in ok]
    ttfts = [float(s["ttft_ms"]) for s in ok if s.get("ttft_ms") is not None]
    tpots = []
    for s, n in zip(ok, out_lens):
        if n > 1 and s.get("e2e_ms") is not None and s.get("ttft_ms") is not None:
            tpots.append((float(s["e2e_ms"]) - float(s["ttft_ms"])) / (n - 1))
    return {
        "output_tok_s": sum(out_lens) / dur_s if dur_s > 0 else None,
        "median_ttft_ms": statistics.median(ttfts) if ttfts else None,
        "median_tpot_ms": statistics.median(tpots) if tpots else None,
    }


def _json_file(path: str | Path, flag: str) -> Any:
    """A JSON file the user named: a regular file only (a FIFO or /dev/zero is refused, never read), at most
    64 MiB, finite numbers, nesting the parser survives; every refusal one line (BadArgs)."""
    from quantrack.errors import QuantrackError
    from quantrack.store.files import read_regular

    try:
        raw = read_regular(path, limit=64 * 2**20, what=f"{flag} {path}")
    except QuantrackError as exc:
        raise BadArgs(str(exc)) from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number")

    try:
        return json.loads(raw, parse_constant=no_constant)
    except RecursionError:
        raise BadArgs(f"{flag} {path}: not usable JSON (nested too deeply)") from None
    except UnicodeDecodeError:
        raise BadArgs(f"{flag} {path}: not JSON (not UTF-8 text)") from None
    except ValueError as exc:
        why = str(exc).split(": line ")[0]
        raise BadArgs(f"{flag} {path}: not JSON ({why})") from None


def import_vllm_result(path: str | Path) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` JSON -> the figures compared (keys as vllm@v0.31.0
    vllm/benchmarks/serve.py:1298-1299 and :1402 write them: output_throughput, median_ttft_ms, median_tpot_ms,
    duration, completed, max_concurrency)."""
    obj = _json_file(path, "--vllm-json")
    if not isinstance(obj, dict):
        raise BadArgs(f"--vllm-json {path}: not a vllm bench serve --save-result file (not a JSON object)")
    need = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "duration")
    missing = [k for k in need if not isinstance(obj.get(k), (int, float)) or isinstance(obj.get(k), bool)]
    if missing:
        raise BadArgs(f"{path}: not a vllm bench serve --save-result file (missing {', '.join(missing)})")
    bad = [f"{k} = {obj[k]!r}" for k in need if not (math.isfinite(obj[k]) and obj[k] >= 0)]
    if not obj["duration"] > 0:
        bad.append(f"duration = {obj['duration']!r}")
    if bad:
        raise BadArgs(f"--vllm-json {path}: {bad[0]} is not a non-negative finite figure (duration > 0)")
    return {"output_tok_s": float(obj["output_throughput"]), "median_ttft_ms": float(obj["median_ttft_ms"]),
            "median_tpot_ms": float(obj["median_tpot_ms"]), "duration_s": float(obj["duration"]),
            "completed": obj.get("completed"), "max_concurrency": obj.get("max_concurrency"),
            "num_prompts": obj.get("num_prompts"), "source": str(path)}


class BadArgs(Exception):
    """A bad input to the script: one line on stderr, exit 2."""


# (hits, queried) counter names per engine, first present wins: vLLM V1 (loggers.py, with prometheus_client's
# _total), then its counters without _total; llama.cpp: cached / uncached prompt tokens (xllamacpp 2026.10.11549)
CACHE_COUNTERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "vllm": (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
             ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"), "queries"),
    "llamacpp": (("llamacpp:prompt_tokens_cached_total",), ("llamacpp:prompt_tokens_total",), "uncached"),
}


def cache_counters(text: str, engine: str) -> dict[str, Any]:
    """Prefix-cache counters from one /metrics text: {hits, queries} (prompt tokens; summed over engines), each
    None with ``missing`` naming the series absent."""
    from quantrack.measure.scrape import parse_prometheus, pick

    series = parse_prometheus(text)
    names = CACHE_COUNTERS.get(engine)
    if names is None:
        return {"hits": None, "queries": None, "missing": f"{engine}: no prefix-cache counters known"}
    hits, other, kind = pick(series, names[0]), pick(series, names[1]), names[2]
    queries = None if hits is None or other is None else (other if kind == "queries" else other + hits)
    missing = [n[0] for n, v in ((names[0], hits), (names[1], other)) if v is None]
    return {"hits": hits, "queries": queries, "missing": ", ".join(missing) or None}


def prefix_caching_enabled(text: str) -> bool | None:
    """vLLM's ``vllm:cache_config_info{...,enable_prefix_caching="True",...}`` label; None when not served."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{") and 'enable_prefix_caching="' in line:
            return line.split('enable_prefix_caching="', 1)[1].startswith("True")
    return None


def hit_rate(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One run's prefix-cache hit rate = (hits after - before) / (queried tokens after - before); None with why."""
    if before.get("missing") or after.get("missing"):
        return {"hit_rate": None, "why": f"/metrics has no {before.get('missing') or after.get('missing')}"}
    dh, dq = after["hits"] - before["hits"], after["queries"] - before["queries"]
    if dq < 0 or dh < 0:
        return {"hit_rate": None, "why": "the counters went down during the run (the server restarted?)"}
    if dq == 0:
        return {"hit_rate": None, "why": "no prompt tokens were counted during the run"}
    return {"hit_rate": dh / dq, "hits": dh, "queries": dq}


def cache_verdict(q: dict[str, Any], r: dict[str, Any], tolerance: float, accept_unknown: bool = False) -> str | None:
    """None when the round's ratio may be printed; else why not (hit rates apart or unknown)."""
    a, b = q.get("hit_rate"), r.get("hit_rate")
    if a is None or b is None:
        if accept_unknown:
            return None
        who, why = ("quantrack", q.get("why")) if a is None else ("the reference", r.get("why"))
        return f"{who}'s prefix-cache hit rate is unknown ({why}): a ratio could be the cache's"
    if abs(a - b) > tolerance:
        return (f"prefix-cache hit rates differ: quantrack {a:.3f}, reference {b:.3f} (|diff| {abs(a - b):.3f} > "
                f"tolerance {tolerance:g}): the ratio would measure the cache, not the client")
    return None


def read_metrics(base_url: str) -> str | None:
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=30.0)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


def measured_cache(base_url: str | None, engine: str, fn: Any, *fargs: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``fn(*fargs)`` between two /metrics reads; (its result, the run's hit rate)."""
    if base_url is None:
        return fn(*fargs), {"hit_rate": None, "why": "a saved result: its server's counters were not read"}
    t0 = read_metrics(base_url)
    out = fn(*fargs)
    t1 = read_metrics(base_url)
    if t0 is None or t1 is None:
        return out, {"hit_rate": None, "why": "/metrics did not answer"}
    return out, hit_rate(cache_counters(t0, engine), cache_counters(t1, engine))


def run_vllm_bench(base_url: str, model: str, c: int, n: int, input_tokens: int, output_tokens: int,
                   tokenizer: str | None, seed: int) -> dict[str, Any]:
    exe = shutil.which("vllm")
    if exe is None:
        raise BadArgs("--reference vllm: no `vllm` in PATH (pip install vllm, or use --reference vllm-json)")
    with tempfile.TemporaryDirectory() as d:
        argv = [exe, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--model", model,
                "--dataset-name", "random", "--random-input-len", str(input_tokens), "--random-output-len",
                str(output_tokens), "--ignore-eos", "--num-prompts", str(n), "--max-concurrency", str(c),
                "--request-rate", "inf", "--seed", str(seed), "--save-result", "--result-dir", d,
                "--result-filename", "r.json"]
        if tokenizer:
            argv += ["--tokenizer", tokenizer]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        return dict(import_vllm_result(Path(d) / "r.json"), seed=seed)


def quantrack_level(base_url: str, engine: str, c: int, n: int, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    from quantrack.measure.sweep import LoadOptions, run_sweep

    res = run_sweep(base_url, engine, [c], requests_per_level=n, input_tokens=input_tokens,
                    output_tokens=output_tokens, warmup=0, load=LoadOptions(keep_samples=True))
    row = res.rows[0]
    sm = row.get("server_metrics") or {}
    return {"row": row, "model": res.model, "output_tok_s": row["output_tok_s"],
            "median_ttft_ms": row["ttft_p50_ms"], "median_tpot_ms": row["tpot_p50_ms"], "wall_s": row["wall_s"],
            "in_flight_share": (row["mean_in_flight"] or 0) / c, "client_cpu_ms_per_token":
            row["client_cpu_ms_per_token"], "prefix_hit_rate": sm.get("prefix_cache_hit_rate"),
            "n_failed": row["n_failed"]}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run(args: argparse.Namespace, base_url: str, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure every level; ``out`` (filled as it goes) holds the levels finished when a later one fails."""
    levels = parse_levels(args.concurrency)
    tol = getattr(args, "hit_rate_tolerance", 0.05)
    accept = getattr(args, "accept_unknown_cache", False)
    seed = getattr(args, "seed", None)
    seed = int(time.time()) % 1_000_000 if seed is None else seed
    out = {} if out is None else out
    out.update({"command": " ".join(sys.argv), "reference": args.reference, "hit_rate_tolerance": tol,
                "first_seed": seed, "levels": []})
    jsons = list(args.vllm_json or [])
    t0 = read_metrics(base_url)
    out["prefix_caching_enabled"] = prefix_caching_enabled(t0) if t0 else None
    for li, c in enumerate(levels):
        rounds = []
        for rnd in range(args.rounds):
            pair: dict[str, Any] = {}
            order = ("quantrack", "reference") if rnd % 2 == 0 else ("reference", "quantrack")
            for who in order:
                if who == "quantrack":
                    pair["quantrack"], pair["quantrack_cache"] = measured_cache(
                        base_url, args.engine, quantrack_level, base_url, args.engine, c, args.requests,
                        args.input_tokens, args.output_tokens)
                elif args.reference == "vllm":
                    seed += 1  # a fresh seed every run: the peer's random dataset sends new prompts
                    pair["reference"], pair["reference_cache"] = measured_cache(
                        base_url, args.engine, run_vllm_bench, base_url, args.model or "", c, args.requests,
                        args.input_tokens, args.output_tokens, args.tokenizer, seed)
                elif args.reference == "vllm-json":
                    pair["reference"], pair["reference_cache"] = measured_cache(
                        None, args.engine, import_vllm_result, jsons[li])
            if args.reference == "definitions":
                q = pair["quantrack"]
                pair["reference"] = vllm_definitions(q["row"]["samples"], q["wall_s"])
                pair["reference_cache"] = dict(pair["quantrack_cache"], note="the same run (vLLM's formulas)")
            pair["refused"] = cache_verdict(pair["quantrack_cache"], pair["reference_cache"], tol, accept)
            if args.compare_requests:
                pair["more_requests"] = quantrack_level(base_url, args.engine, c, args.compare_requests,
                                                        args.input_tokens, args.output_tokens)
            for p in ("quantrack", "more_requests"):
                if p in pair:
                    pair[p].pop("row", None)
            rounds.append(pair)
        out["levels"].append({"concurrency": c, "rounds": rounds, **summary(rounds)})
        print(f"level c{c} done: {json.dumps(summary(rounds), default=str)}", file=sys.stderr, flush=True)
    return out


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the per-round ratios over the rounds whose hit rates agree; a level without such a round has
    no ratio, and ``refused`` says why."""
    fair = [p for p in rounds if not p.get("refused")]

    def med(key: str, who: str = "quantrack", ref: str = "reference", pairs: list[dict[str, Any]] = fair
            ) -> float | None:
        vals = [r for p in pairs if (r := ratio(p[who].get(key), p[ref].get(key))) is not None]
        return statistics.median(vals) if vals else None

    def spread(key: str) -> list[float] | None:
        vals = [r for p in fair if (r := ratio(p["quantrack"].get(key), p["reference"].get(key))) is not None]
        return [min(vals), max(vals)] if vals else None

    s: dict[str, Any] = {f"ratio_{k}": med(k) for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")}
    s.update({f"ratio_{k}_range": spread(k) for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")})
    s["rounds_compared"] = len(fair)
    s["refused"] = sorted({str(p["refused"]) for p in rounds if p.get("refused")}) or None
    s["hit_rate_quantrack"] = [p.get("quantrack_cache", {}).get("hit_rate") for p in rounds]
    s["hit_rate_reference"] = [p.get("reference_cache", {}).get("hit_rate") for p in rounds]
    if all("more_requests" in p for p in rounds):
        s.update({f"more_requests_ratio_{k}": med(k, "quantrack", "more_requests", rounds)
                  for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")})
        s["in_flight_share"] = statistics.median(p["quantrack"]["in_flight_share"] for p in rounds)
        s["in_flight_share_more_requests"] = statistics.median(p["more_requests"]["in_flight_share"] for p in rounds)
    cpu = [p["quantrack"]["client_cpu_ms_per_token"] for p in rounds if p["quantrack"]["client_cpu_ms_per_token"]]
    s["client_cpu_ms_per_token"] = statistics.median(cpu) if cpu else None
    return s


def render(res: dict[str, Any]) -> str:
    def f(x: float | None, d: int = 3) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x:.{d}f}"

    lines = [(f"reference: {res['reference']}; prefix-cache hit rates must agree within "
              f"{res.get('hit_rate_tolerance', 0.05):g} (engine /metrics before and after each tool's run)"),
             ("conc  tok/s ratio  TTFT p50 ratio  TPOT p50 ratio  | vs more requests: tok/s  TTFT  TPOT  "
             "in-flight share (N / more)  client CPU ms/token")]
    for lv in res["levels"]:
        lines.append(f"{lv['concurrency']:>4}  {f(lv['ratio_output_tok_s']):>11}  {f(lv['ratio_median_ttft_ms']):>14}  "
                     f"{f(lv['ratio_median_tpot_ms']):>14}  | {f(lv.get('more_requests_ratio_output_tok_s')):>22}  "
                     f"{f(lv.get('more_requests_ratio_median_ttft_ms'))}  {f(lv.get('more_requests_ratio_median_tpot_ms'))}"
                     f"  {f(lv.get('in_flight_share'), 2)} / {f(lv.get('in_flight_share_more_requests'), 2)}"
                     f"  {f(lv['client_cpu_ms_per_token'])}")
    for lv in res["levels"]:
        hq = ", ".join(f(x) for x in lv.get("hit_rate_quantrack") or [])
        hr = ", ".join(f(x) for x in lv.get("hit_rate_reference") or [])
        lines.append(f"c{lv['concurrency']}: prefix-cache hit rate per round: quantrack {hq or '-'}; reference "
                     f"{hr or '-'}; rounds compared {lv.get('rounds_compared')}/{len(lv['rounds'])}")
        for why in lv.get("refused") or []:
            lines.append(f"c{lv['concurrency']}: NO RATIO for a round: {why}")
    if res.get("prefix_caching_enabled") is not None:
        lines.append(f"server: enable_prefix_caching={res['prefix_caching_enabled']} (vllm:cache_config_info)")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (argparse's own prints the usage too)
        raise BadArgs(message)


# bounds (quantrack's own, quantrack.study): one connection per request in flight on Linux's default ephemeral port
# range; every prompt of a level is built before its first request
MAX_IN_FLIGHT = 28_232
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1_048_576  # the longest context any engine here serves (1M tokens)
MAX_ROUNDS = 1_000


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise BadArgs(f"--concurrency: expected comma-separated integers >= 1, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise BadArgs(f"--concurrency: levels must be >= 1, got {text!r}")
    if max(levels) > MAX_IN_FLIGHT:
        raise BadArgs(f"--concurrency: at most {MAX_IN_FLIGHT:,} requests in flight (one connection each on the "
                      f"default Linux ephemeral port range), got {max(levels):,}")
    if len(set(levels)) != len(levels):
        raise BadArgs(f"--concurrency: a level is given twice in {text!r}")
    return levels


def check_url(url: str) -> None:
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        u.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise BadArgs(f"--base-url {url!r}: {exc}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadArgs(f"--base-url {url!r}: expected http://HOST:PORT or https://HOST:PORT")


def check_numbers(args: argparse.Namespace) -> None:
    """Every number in its range: at least what a measurement needs, at most what can be sent."""
    bounds = {"requests": MAX_REQUESTS, "input_tokens": MAX_TOKENS, "rounds": MAX_ROUNDS, "parallel": MAX_IN_FLIGHT,
              "output_tokens": MAX_TOKENS, "compare_requests": MAX_REQUESTS}
    for name in ("requests", "input_tokens", "rounds", "parallel"):
        if getattr(args, name) < 1:
            raise BadArgs(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if args.output_tokens < 2:
        raise BadArgs(f"--output-tokens must be >= 2: TPOT needs two (got {args.output_tokens})")
    if args.compare_requests < 0:
        raise BadArgs(f"--compare-requests must be >= 0 (got {args.compare_requests})")
    for name, top in bounds.items():
        if getattr(args, name) > top:
            raise BadArgs(f"--{name.replace('_', '-')} must be at most {top:,} (got {getattr(args, name):,})")
    if not (0 <= args.hit_rate_tolerance <= 1):
        raise BadArgs(f"--hit-rate-tolerance must be in [0, 1] (got {args.hit_rate_tolerance})")
    if args.seed is not None and not 0 <= args.seed < 2**32:
        raise BadArgs(f"--seed must be in 0..2^32-1 (got {args.seed})")


def check_args(args: argparse.Namespace) -> None:
    """Every input checked before the server is asked anything (and the --json path is writable)."""
    levels = parse_levels(args.concurrency)
    check_numbers(args)
    if args.reference == "vllm-json":
        jsons = args.vllm_json or []
        if len(jsons) != len(levels):
            raise BadArgs(f"--reference vllm-json needs one --vllm-json file per level ({len(levels)}), got "
                          f"{len(jsons)}")
        for j in jsons:
            import_vllm_result(j)
    elif args.vllm_json:
        raise BadArgs("--vllm-json applies to --reference vllm-json")
    if args.reference == "vllm" and not args.model:
        raise BadArgs("--reference vllm needs --model (the name vllm bench serve sends)")
    if args.reference == "vllm" and shutil.which("vllm") is None:
        raise BadArgs("--reference vllm: no `vllm` in PATH (pip install vllm, or use --reference vllm-json)")
    if not args.llamacpp and not args.base_url:
        raise BadArgs("give --base-url URL or --llamacpp")
    if args.llamacpp and args.base_url:
        raise BadArgs("give --base-url URL or --llamacpp, not both")
    if args.base_url:
        check_url(args.base_url)
    if args.json is not None:
        check_writable(args.json)


def check_writable(path: Path) -> None:
    """--json: a file we may write (its folder exists and is writable; not a folder; writable if present; not a
    link, a FIFO, a socket or a block device: the result is written at the end, when nobody may read a FIFO; a
    character device such as /dev/null or /dev/stdout is written through)."""
    import stat

    from quantrack.errors import QuantrackError
    from quantrack.store.files import check_writable as writable

    if path.is_dir():
        raise BadArgs(f"--json {path}: is a folder, not a file")
    if path.exists() and stat.S_ISFIFO(path.stat().st_mode):  # stat, not open: a FIFO is not blocked on
        raise BadArgs(f"--json {path}: is a FIFO; give a regular file (the result is written when the run ends)")
    try:
        writable(path, "--json")
    except QuantrackError as exc:
        raise BadArgs(str(exc)) from None


def save_result(res: dict[str, Any], path: Path | None, why: str | None = None) -> None:
    """Write the result to --json; when that fails (or on a failure mid-run), to a fresh file in the temporary
    folder, named in the one line on stderr: a measurement made is never lost."""
    import os

    from quantrack.errors import QuantrackError
    from quantrack.store.files import write_atomic

    text = json.dumps(res, indent=1, default=str) + "\n"
    problem = why
    if path is not None:
        try:
            write_atomic(path, text)
            if why is None:
                return
            where = str(path)
        except (QuantrackError, OSError) as exc:
            problem = f"--json {path}: {exc.strerror if isinstance(exc, OSError) else exc}"
            path = None
    if path is None:
        try:
            fd, name = tempfile.mkstemp(prefix="parity_vllm_bench-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            where = name
        except OSError as exc:  # no temporary folder either: the result goes to stdout
            print(text)
            where = f"stdout (the temporary folder failed too: {exc.strerror})"
    print(f"parity_vllm_bench: error: {problem}; the result so far is in {where}", file=sys.stderr)
    raise SystemExit(2 if why is None else 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="A running server (else --llamacpp starts one)")
    ap.add_argument("--llamacpp", action="store_true", help="Start llama.cpp (xllamacpp) on the SmolLM2 GGUF")
    ap.add_argument("--parallel", type=int, default=4, help="llama.cpp slots (with --llamacpp)")
    ap.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm", "sglang"))
    ap.add_argument("--model", help="Model name for vllm bench serve")
    ap.add_argument("--tokenizer", help="Tokenizer for vllm bench serve")
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--requests", type=int, default=16, help="Requests per level (vllm --num-prompts)")
    ap.add_argument("--compare-requests", type=int, default=0, help="Also run each level with this many requests")
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="Interleaved rounds per level (order alternates)")
    ap.add_argument("--reference", choices=("definitions", "vllm", "vllm-json"), default="definitions")
    ap.add_argument("--vllm-json", nargs="*", help="--save-result files, one per level (--reference vllm-json)")
    ap.add_argument("--hit-rate-tolerance", type=float, default=0.05,
                    help="Largest |difference| of the two runs' prefix-cache hit rates for which a ratio is printed")
    ap.add_argument("--accept-unknown-cache", action="store_true",
                    help="Print ratios when a run's hit rate cannot be read (labelled: cache not checked)")
    ap.add_argument("--seed", type=int, help="First vllm bench serve --seed (each run adds 1); default: from the clock")
    ap.add_argument("--json", type=Path, help="Write the full result here (checked writable before measuring)")
    try:
        args = ap.parse_args(argv)
        check_args(args)
    except BadArgs as exc:
        print(f"parity_vllm_bench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    t0 = time.perf_counter()
    res: dict[str, Any] = {}
    try:
        if args.llamacpp:
            import os

            from quantrack.arms import make_arm
            from quantrack.engines.lifecycle import server_for_arm
            from quantrack.models.gguf import fetch_smollm2

            cache = Path(os.environ.get("QUANTRACK_CACHE") or REPO / ".quantrack-cache")
            gguf = fetch_smollm2(cache)
            with tempfile.TemporaryDirectory() as d:
                srv = server_for_arm("llamacpp", str(gguf), make_arm("q4_1", weights="q4_1"), host="127.0.0.1",
                                     context_len=512 * args.parallel, parallel=args.parallel,
                                     log_path=Path(d) / "server.log", startup_timeout=180)
                srv.start()
                try:
                    run(args, str(srv.base_url), res)
                finally:
                    srv.stop()
        else:
            run(args, args.base_url, res)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - whatever stops it, the levels done are kept
        res["seconds"] = round(time.perf_counter() - t0, 1)
        res["stopped_by"] = f"{type(exc).__name__}: {exc}"
        done = len(res.get("levels", []))
        save_result(res, args.json, f"stopped after {done} finished level(s): {_one_line(exc)}")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    print(render(res))
    if args.json:
        save_result(res, args.json)
    return res


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


if __name__ == "__main__":
    main()
