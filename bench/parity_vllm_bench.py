"""Parity of `quantrack sweep` with `vllm bench serve`: the same server, the two clients interleaved per level.

Per concurrency level the script runs, alternating the order each round:

* quantrack's sweep (closed loop, ``--requests N``, per-request samples kept);
* the reference: ``vllm bench serve`` (``--reference vllm``: run as a subprocess with ``--max-concurrency C
  --num-prompts N --request-rate inf --save-result``; needs vLLM in PATH) or a saved ``--save-result`` JSON
  (``--reference vllm-json --vllm-json FILE ...``, one per level, imported by :func:`import_vllm_result`);

and prints, per level, the ratios quantrack / reference of output tok/s, median TTFT and median TPOT, with
quantrack's own diagnostics: mean requests in flight / C (ramp-up and drain inside the level's wall time), the
client's CPU ms per streamed token, and the engine's prefix-cache hit rate from its /metrics.

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


def import_vllm_result(path: str | Path) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` JSON -> the figures compared (keys as vllm@v0.31.0
    vllm/benchmarks/serve.py:1298-1299 and :1402 write them: output_throughput, median_ttft_ms, median_tpot_ms,
    duration, completed, max_concurrency)."""
    obj = json.loads(Path(path).read_text(encoding="utf-8"))
    need = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "duration")
    missing = [k for k in need if not isinstance(obj.get(k), (int, float))]
    if missing:
        raise SystemExit(f"{path}: not a vllm bench serve --save-result file (missing {', '.join(missing)})")
    return {"output_tok_s": float(obj["output_throughput"]), "median_ttft_ms": float(obj["median_ttft_ms"]),
            "median_tpot_ms": float(obj["median_tpot_ms"]), "duration_s": float(obj["duration"]),
            "completed": obj.get("completed"), "max_concurrency": obj.get("max_concurrency"),
            "num_prompts": obj.get("num_prompts"), "source": str(path)}


def run_vllm_bench(base_url: str, model: str, c: int, n: int, input_tokens: int, output_tokens: int,
                   tokenizer: str | None) -> dict[str, Any]:
    exe = shutil.which("vllm")
    if exe is None:
        raise SystemExit("--reference vllm: no `vllm` in PATH (pip install vllm, or use --reference vllm-json)")
    with tempfile.TemporaryDirectory() as d:
        argv = [exe, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--model", model,
                "--dataset-name", "random", "--random-input-len", str(input_tokens), "--random-output-len",
                str(output_tokens), "--ignore-eos", "--num-prompts", str(n), "--max-concurrency", str(c),
                "--request-rate", "inf", "--save-result", "--result-dir", d, "--result-filename", "r.json"]
        if tokenizer:
            argv += ["--tokenizer", tokenizer]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        return import_vllm_result(Path(d) / "r.json")


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


def run(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    levels = [int(x) for x in args.concurrency.split(",")]
    out: dict[str, Any] = {"command": " ".join(sys.argv), "reference": args.reference, "levels": []}
    jsons = list(args.vllm_json or [])
    for li, c in enumerate(levels):
        rounds = []
        for rnd in range(args.rounds):
            pair: dict[str, Any] = {}
            order = ("quantrack", "reference") if rnd % 2 == 0 else ("reference", "quantrack")
            for who in order:
                if who == "quantrack":
                    pair["quantrack"] = quantrack_level(base_url, args.engine, c, args.requests, args.input_tokens,
                                                        args.output_tokens)
                elif args.reference == "vllm":
                    pair["reference"] = run_vllm_bench(base_url, args.model or "", c, args.requests,
                                                       args.input_tokens, args.output_tokens, args.tokenizer)
                elif args.reference == "vllm-json":
                    pair["reference"] = import_vllm_result(jsons[li])
            if args.reference == "definitions":
                q = pair["quantrack"]
                pair["reference"] = vllm_definitions(q["row"]["samples"], q["wall_s"])
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
    def med(key: str, who: str = "quantrack", ref: str = "reference") -> float | None:
        vals = [r for p in rounds if (r := ratio(p[who].get(key), p[ref].get(key))) is not None]
        return statistics.median(vals) if vals else None

    s: dict[str, Any] = {f"ratio_{k}": med(k) for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")}
    if all("more_requests" in p for p in rounds):
        s.update({f"more_requests_ratio_{k}": med(k, "quantrack", "more_requests")
                  for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms")})
        s["in_flight_share"] = statistics.median(p["quantrack"]["in_flight_share"] for p in rounds)
        s["in_flight_share_more_requests"] = statistics.median(p["more_requests"]["in_flight_share"] for p in rounds)
    cpu = [p["quantrack"]["client_cpu_ms_per_token"] for p in rounds if p["quantrack"]["client_cpu_ms_per_token"]]
    s["client_cpu_ms_per_token"] = statistics.median(cpu) if cpu else None
    return s


def render(res: dict[str, Any]) -> str:
    def f(x: float | None, d: int = 3) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x:.{d}f}"

    lines = [f"reference: {res['reference']}",
             ("conc  tok/s ratio  TTFT p50 ratio  TPOT p50 ratio  | vs more requests: tok/s  TTFT  TPOT  "
             "in-flight share (N / more)  client CPU ms/token")]
    for lv in res["levels"]:
        lines.append(f"{lv['concurrency']:>4}  {f(lv['ratio_output_tok_s']):>11}  {f(lv['ratio_median_ttft_ms']):>14}  "
                     f"{f(lv['ratio_median_tpot_ms']):>14}  | {f(lv.get('more_requests_ratio_output_tok_s')):>22}  "
                     f"{f(lv.get('more_requests_ratio_median_ttft_ms'))}  {f(lv.get('more_requests_ratio_median_tpot_ms'))}"
                     f"  {f(lv.get('in_flight_share'), 2)} / {f(lv.get('in_flight_share_more_requests'), 2)}"
                     f"  {f(lv['client_cpu_ms_per_token'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="A running server (else --llamacpp starts one)")
    ap.add_argument("--llamacpp", action="store_true", help="Start llama.cpp (xllamacpp) on the SmolLM2 GGUF")
    ap.add_argument("--parallel", type=int, default=4, help="llama.cpp slots (with --llamacpp)")
    ap.add_argument("--engine", default="llamacpp")
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
    ap.add_argument("--json", type=Path, help="Write the full result here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
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
                res = run(args, str(srv.base_url))
            finally:
                srv.stop()
    elif args.base_url:
        res = run(args, args.base_url)
    else:
        raise SystemExit("give --base-url URL or --llamacpp")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    print(render(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    return res


if __name__ == "__main__":
    main()
