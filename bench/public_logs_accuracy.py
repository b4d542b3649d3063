"""Parser accuracy and reconcile error on the public corpus (tests/data/public-logs/), as markdown tables.

    python bench/public_logs_accuracy.py

Table 1: for every excerpt, the engine detected with --engine auto (and the marker that decided it) and how many of
the figures its sidecar states (``# expect:``) the parser read exactly. Table 2: `quantrack logs reconcile` on the
excerpts whose thread states the model and enough of the setup, with the settings listed (from the sidecar), the
KV-token and weight errors per rank, or the one-line refusal. Printed for docs/capacity-model.md ("Logs from the
wild"); nothing here is fitted: the capacity model is used as shipped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LOGS = REPO / "tests" / "data" / "public-logs"

# (excerpt, reconcile arguments from its sidecar's "settings stated" / "model" lines)
RECONCILE: list[tuple[str, list[str]]] = [
    ("vllm-10517-rtx3090-llama31-8b-20k.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "RTX 3090",
                                               "--max-num-batched-tokens", "20000", "--max-num-seqs", "256"]),
    ("vllm-10517-rtx3090-llama31-8b-29k.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "RTX 3090",
                                               "--max-num-batched-tokens", "29000", "--max-num-seqs", "256"]),
    ("vllm-10511-v0-profile-table-tp1.log", ["--model", "Llama-3-8B", "--arm", "bf16"]),
    ("vllm-10511-v0-profile-table-tp2.log", ["--model", "Llama-3-8B", "--arm", "bf16"]),
    ("vllm-13882-rtx4060-qwen25-7b-awq.log", ["--model", "Qwen2.5-7B", "--arm", "awq", "--context-len", "4096",
                                              "--max-num-batched-tokens", "4096", "--max-num-seqs", "256"]),
    ("vllm-12126-h100-llama32-11b-vision.log", ["--params", "10.6e9", "--layers", "40", "--kv-heads", "8",
                                                "--head-dim", "128", "--arm", "bf16", "--context-len", "65536",
                                                "--max-num-batched-tokens", "65536", "--max-num-seqs", "128"]),
    ("vllm-jimw-v064-turing-opt125m-xformers.log", ["--params", "125e6", "--layers", "12", "--kv-heads", "12",
                                                    "--head-dim", "64", "--max-num-batched-tokens", "2048",
                                                    "--max-num-seqs", "256"]),
    ("vllm-5248-2xt4-tp2-blocks.log", ["--params", "6.74e9", "--layers", "32", "--kv-heads", "32", "--head-dim",
                                       "128", "--arm", "fp16", "--gpu", "T4", "--tp", "2", "--context-len", "16384",
                                       "--max-num-batched-tokens", "16384", "--max-num-seqs", "256"]),
    ("vllm-13061-2x4090-tp2-maxlen.log", ["--params", "14.77e9", "--layers", "48", "--kv-heads", "8", "--head-dim",
                                          "128", "--arm", "bf16", "--gpu", "RTX 4090", "--tp", "2", "--util", "0.98",
                                          "--max-num-batched-tokens", "131072", "--max-num-seqs", "256"]),
    ("vllm-21348-4xh100-qwen3-235b-fp8.log", ["--params", "235e9", "--layers", "94", "--kv-heads", "4",
                                              "--head-dim", "128", "--arm", "fp8", "--gpu", "H100", "--tp", "4",
                                              "--util", "0.90", "--context-len", "40960"]),
    ("sglang-21348-4xh100-qwen3-235b-fp8.log", ["--params", "235e9", "--layers", "94", "--kv-heads", "4",
                                                "--head-dim", "128", "--arm", "fp8", "--gpu", "H100", "--tp", "4",
                                                "--util", "0.93", "--context-len", "40960"]),
    ("sglang-ktransformers1870-tp2-hybrid-gdn.log", ["--params", "35e9", "--layers", "40", "--kv-heads", "2",
                                                     "--head-dim", "256", "--arm", "bf16", "--gpu", "RTX 4090"]),
    ("vllm-32105-pp-kv-too-small.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "H100"]),
    ("vllm-lmcache1739-qwen3-14b.log", ["--params", "14.8e9", "--layers", "40", "--kv-heads", "8", "--head-dim",
                                        "128", "--arm", "bf16"]),
]


def _got(report: object, key: str) -> object:
    if key == "engine":
        return report.engine  # type: ignore[attr-defined]
    if key in ("errors", "fallbacks"):
        return sorted({e.kind for e in getattr(report, key)})
    if key != "extra" and hasattr(report, key):
        return getattr(report, key)
    return report.extra.get(key)  # type: ignore[attr-defined]


def accuracy() -> list[str]:
    from quantrack.engines import parse_log_file

    out = ["| excerpt | source | engine (auto) | decided by | figures read / stated |", "|---|---|---|---|---|"]
    total_ok = total = engines_ok = 0
    files = sorted(LOGS.glob("*.log"))
    for p in files:
        meta = (p.parent / f"{p.name}.meta").read_text()
        want = json.loads(re.search(r"^# expect: (\{.*\})$", meta, re.MULTILINE).group(1))  # type: ignore[union-attr]
        url = re.search(r"^# source: (\S+)", meta, re.MULTILINE).group(1)  # type: ignore[union-attr]
        r = parse_log_file(p)
        ok = sum(1 for k, v in want.items() if (sorted(v) if isinstance(v, list) else v) == _got(r, k))
        total_ok, total = total_ok + ok, total + len(want)
        engines_ok += r.engine == want["engine"]
        ev = r.engine_evidence[0] if r.engine_evidence else {}
        short = url.replace("https://github.com/", "")
        out.append(f"| `{p.name}` | [{short}]({url}) | {r.engine} | {ev.get('marker', '-')} (line "
                   f"{ev.get('line_no', '-')}) | {ok} / {len(want)} |")
    out.append(f"| **all {len(files)}** | | **{engines_ok} / {len(files)}** | | **{total_ok} / {total}** |")
    return out


def reconcile_table() -> list[str]:
    from quantrack.arms import parse_arm_spec
    from quantrack.cli.logs import _shape
    from quantrack.engines.reconcile import reconcile
    from quantrack.errors import QuantrackError

    out = [("| excerpt | settings passed (from the sidecar) | KV tokens: predicted / log, error | weights GiB per rank: "
           "predicted / log, error | layout |"), "|---|---|---|---|---|"]
    for name, args in RECONCILE:
        opts: dict[str, str] = {}
        it = iter(args)
        for flag in it:
            opts[flag.lstrip("-").replace("-", "_")] = next(it)
        shape = _shape({k: opts.get(k) for k in ("model", "config", "gguf", "params", "layers", "kv_heads",
                                                  "head_dim")})
        kw = {k: (int(v) if k in ("tp", "context_len", "max_num_batched_tokens", "max_num_seqs") else float(v)
                  if k == "util" else v) for k, v in opts.items()
              if k in ("gpu", "util", "tp", "context_len", "max_num_batched_tokens", "max_num_seqs")}
        arm = parse_arm_spec(opts["arm"]) if "arm" in opts else None
        try:
            res = reconcile(LOGS / name, shape, arm=arm, **kw)  # type: ignore[arg-type]
        except QuantrackError as exc:
            out.append(f"| `{name}` | `{' '.join(args)}` | refused: {exc} | | |")
            continue
        rows = {(r["figure"], r["scope"].split(" ")[0]): r for r in res.to_dict()["rows"]}

        def cell(key: tuple[str, str], rows: dict[tuple[str, str], dict] = rows) -> str:
            r = rows.get(key)
            if not r or r["log"] is None:
                return f"{r['predicted'] if r else '-'} / not in the log"
            err = "n/a (log 0)" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
            return f"{r['predicted']:,} / {r['log']:,}, {err}"

        kv_key = next(k for k in rows if k[0] == "kv_cache_tokens")
        layout = ", ".join(f"{k} {v}" for k, v in res.parallel.items())
        out.append(f"| `{name}` | `{' '.join(args)}` | {cell(kv_key)} | {cell(('weights_gib', 'per'))} | "
                   f"{layout}; arm from {res.arm_source} |")
    return out


def main() -> int:
    print("\n".join(accuracy()))
    print()
    print("\n".join(reconcile_table()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
