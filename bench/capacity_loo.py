"""Out-of-sample error of the engine-aware capacity model: leave one thread (run session) out.

Each engine has one calibrated constant (vLLM ``VLLM_NON_TORCH_BYTES``, SGLang ``SGLANG_PRELOAD_USED_BYTES``,
quantrack/hardware/capacity.py). For every log in the corpus below we compute the constant that would make the prediction
exact (the *implied* constant). Then, for each thread, the constant is refitted as the median implied constant of
the **other** threads of the same engine, and that thread's logs are predicted with it: nothing a reported row
depends on was fitted on that row's thread. Run sessions of one machine count as one thread when they share a
session (the fp8 and fp8-kv logs of one session are not independent).

    python bench/capacity_loo.py            # prints the markdown table of docs/capacity-model.md §7.4

Logs: tests/data/logs/h200-default (copies of ../shared/data/{vllm,sglang}-h200, session 1),
tests/data/logs/h200-util045 (session 2), tests/data/public-logs (public threads; each file's .meta sidecar names its source).
Excluded, with the reason printed in the table's footer: logs whose GPU is not stated, whose KV figure is not
positive, or whose model is multimodal (the profile run is the vision encoder's).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from quantrack.arms import make_arm
from quantrack.engines import parse_log_file
from quantrack.hardware.capacity import (
    SGLANG_PRELOAD_USED_BYTES,
    VLLM_NON_TORCH_BYTES,
    GiB,
    kv_bytes_per_token,
    predict_engine,
)
from quantrack.hardware.catalog import ModelShape, get_gpu, get_model

LOGS = ROOT / "tests" / "data"
BF16 = make_arm("bf16", weights="bf16")
FP8 = make_arm("fp8", weights="fp8")
FP8KV = make_arm("fp8-kv", weights="fp8", kv="fp8")
H200_LLAMA = replace(get_model("Llama-3-8B"), params=8_030_261_248.0)  # ../shared/gpu/make_model.py checkpoint
# Qwen3-235B-A22B (excerpt headers: 94 layers, 4 KV heads, head_dim 128; config: hidden 4096, 64 heads,
# 128 experts of moe_intermediate_size 1536, 8 per token, vocab 151936); params 235e9 per the model card (rounded)
QWEN3_235B = ModelShape(name="Qwen3-235B-A22B", params=235e9, layers=94, kv_heads=4, head_dim=128, hidden_size=4096,
                        vocab_size=151936, attention_heads=64, intermediate_size=12288, num_experts=128,
                        experts_per_token=8, moe_intermediate_size=1536)


@dataclass(frozen=True)
class Case:
    thread: str  # the leave-out unit
    era: str  # engine version era, as the log shows or the thread states
    gpu: str
    file: str
    engine: str
    shape: ModelShape
    arm: Any
    total_bytes: float
    settings: dict[str, Any]
    logged_tokens: int | None = None  # None: read from the log


def corpus() -> list[Case]:
    h200 = float(get_gpu("H200").total_bytes)
    h100 = float(get_gpu("H100-SXM").total_bytes)
    s1 = "H200 session 1 (util 0.92 / 0.903)"
    s2 = "H200 session 2 (util 0.45)"
    v_h200 = {"util": 0.92, "context_len": 8192, "gpu_name": "H200"}
    cases = [Case(s1, "vLLM 0.25.0 (V1)", "H200", f"logs/h200-default/vllm-0.25.0-{a}.log", "vllm", H200_LLAMA,
                  arm, h200, v_h200) for a, arm in (("bf16", BF16), ("fp8", FP8), ("fp8kv", FP8KV))]
    cases += [Case(s2, "vLLM 0.25.0 (V1)", "H200", f"logs/h200-util045/vllm-0.25.0-{a}.log", "vllm", H200_LLAMA,
                   arm, h200, {**v_h200, "util": 0.45}) for a, arm in (("bf16", BF16), ("fp8kv", FP8KV))]
    for ctx, blocks in ((20000, 1952), (29000, 1478)):
        cases.append(Case("#10517 RTX 3090", "vLLM 0.6.4 (V0)", "RTX 3090",
                          f"public-logs/vllm-10517-rtx3090-llama31-8b-{ctx // 1000}k.log", "vllm",
                          get_model("Llama-3.1-8B"), BF16, 23.58 * GiB,
                          {"util": 0.90, "context_len": ctx, "max_num_batched_tokens": ctx, "max_num_seqs": 256},
                          logged_tokens=blocks * 16))
    cases.append(Case("#21348 4xH100 vLLM", "vLLM V1 (2025-07)", "4 x H100, TP 4",
                      "public-logs/vllm-21348-4xh100-qwen3-235b-fp8.log", "vllm", QWEN3_235B, FP8, h100,
                      {"util": 0.90, "context_len": 40960, "tp": 4, "gpu_name": "H100-SXM"}))
    g_h200 = {"context_len": 8192}
    cases += [Case(s1, "SGLang 0.5.16", "H200", f"logs/h200-default/sglang-0.5.16-{a}.log", "sglang", H200_LLAMA,
                   arm, h200, g_h200) for a, arm in (("bf16", BF16), ("fp8", FP8), ("fp8kv", FP8KV))]
    cases += [Case(s2, "SGLang 0.5.16", "H200", f"logs/h200-util045/sglang-0.5.16-{a}.log", "sglang", H200_LLAMA,
                   arm, h200, {**g_h200, "util": 0.45}) for a, arm in (("bf16", BF16), ("fp8kv", FP8KV))]
    cases.append(Case("#21348 4xH100 SGLang", "SGLang (2025-07)", "4 x H100, TP 4",
                      "public-logs/sglang-21348-4xh100-qwen3-235b-fp8.log", "sglang", QWEN3_235B, FP8, h100,
                      {"util": 0.93, "context_len": 40960, "tp": 4}))
    return cases


EXCLUDED = [
    ("public-logs/vllm-12126-h100-llama32-11b-vision.log", "multimodal: the profile peak is the vision encoder's"),
    ("public-logs/vllm-13882-rtx4060-qwen25-7b-awq.log", "KV budget negative (0 blocks): no % error; verdict agrees"),
    ("public-logs/vllm-lmcache1739-qwen3-14b.log", "GPU and memory settings not stated"),
]


def logged(case: Case) -> int:
    if case.logged_tokens is not None:
        return case.logged_tokens
    tokens = parse_log_file(LOGS / case.file, case.engine).kv_cache_tokens
    assert tokens, case.file
    return int(tokens)


def predict(case: Case, reserve: float | None = None) -> Any:
    return predict_engine(case.shape, case.total_bytes, case.arm, case.engine, reserve_bytes=reserve,
                          **case.settings)


def implied_reserve(case: Case) -> float:
    """The constant that makes this log's prediction exact (bytes)."""
    pred = predict(case)
    kv_logged = logged(case) * kv_bytes_per_token(case.shape, pred.kv_dtype, case.settings.get("tp", 1))
    if case.engine == "vllm":
        return VLLM_NON_TORCH_BYTES + (pred.kv_bytes - kv_logged)
    return SGLANG_PRELOAD_USED_BYTES + (pred.kv_bytes - kv_logged) / pred.settings["mem_fraction_static"]


def leave_one_thread_out() -> list[dict[str, Any]]:
    cases = corpus()
    implied = {c.file: implied_reserve(c) for c in cases}
    rows = []
    for case in cases:
        train = [implied[c.file] for c in cases if c.engine == case.engine and c.thread != case.thread]
        fit = statistics.median(train)
        pred = predict(case, fit)
        truth = logged(case)
        rows.append({"thread": case.thread, "era": case.era, "gpu": case.gpu, "log": Path(case.file).name,
                     "arm": case.arm.name, "logged": truth, "predicted": pred.engine_tokens,
                     "error_pct": 100.0 * (pred.engine_tokens - truth) / truth, "fit_gib": fit / GiB,
                     "implied_gib": implied[case.file] / GiB, "in_sample_pct":
                     100.0 * (predict(case).engine_tokens - truth) / truth, "train_n": len(train)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [("| thread (left out) | engine era | GPU | log | arm | logged tokens | predicted (LOO) | error (LOO) | "
           "constant refit on the other threads (GiB) | this log's implied constant (GiB) |"),
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['thread']} | {r['era']} | {r['gpu']} | {r['log']} | {r['arm']} | {r['logged']:,} | "
                   f"{r['predicted']:,} | {r['error_pct']:+.2f}% | {r['fit_gib']:.3f} (n={r['train_n']}) | "
                   f"{r['implied_gib']:.3f} |")
    for engine in ("vLLM", "SGLang"):
        errs = [abs(r["error_pct"]) for r in rows if r["era"].startswith(engine)]
        out.append(f"\n{engine}: {len(errs)} logs, median |error| {statistics.median(errs):.2f}%, "
                   f"worst {max(errs):.2f}% (leave one thread out)")
    out.append("\nExcluded: " + "; ".join(f"{Path(f).name} ({why})" for f, why in EXCLUDED))
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(leave_one_thread_out()))
