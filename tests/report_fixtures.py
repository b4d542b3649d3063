"""A constructed MLflow store for the decision-report tests: one study parent run and six arm runs, logged with
quantrack's own Tracker into a real SQLite store, each arm built to exercise one verdict.

The figures are constructed, not measured (the tests check the report's logic, not an engine): GSM8K per-question
outcomes are bitmaps over 1,319 question ids (the size of GSM8K's test split), arranged so that the paired 2x2
table is known exactly (a: both right, b: baseline only, c: arm only):

* ``bf16``   the baseline: 1,020 of 1,319 right; c64 TPOT p50 18 ms.
* ``fp8``    meets the SLO (TPOT p50 12 ms @c64) but b=20, c=12 -> Δ -0.61 pp [-1.48, +0.26]: crosses a 1 pp budget.
* ``fp8-good`` meets the SLO, b=3, c=1 -> Δ -0.15 pp with an interval inside the budget: cleared.
* ``slow``   misses the SLO at c64 (35 ms), meets it at c16.
* ``marlin`` a fallback (fp8_marlin, with its evidence line) and a rulebook warning; accuracy within budget.
* ``fp8-kv`` no GSM8K (FILL IN); a contention tag (host load), and a sweep/sweep.json artifact with p99s.
"""

from __future__ import annotations

import json

from quantrack.store.records import RunRecord
from quantrack.store.tracking import Tracker

EXPERIMENT = "report-constructed"
N_Q = 1319
SLO = "tpot_p50<=20ms@64"
GPU = "H100"


def _gsm(rec: RunRecord, outcomes: str) -> None:
    from quantrack.accuracy.stats import proportion

    k, n = outcomes.count("1"), len(outcomes)
    p = proportion(k, n)
    rec.metric("gsm8k_accuracy", p.p)
    rec.metric("gsm8k_se", p.se)
    rec.metric("gsm8k_ci_low", p.ci_low)
    rec.metric("gsm8k_ci_high", p.ci_high)
    rec.metric("gsm8k_n", n)
    rec.tag("quantrack.gsm8k_correct", outcomes)
    rec.tag("quantrack.gsm8k_data_sha256", "constructed")
    rec.tag("quantrack.gsm8k_source", "measured")


def _arm(name: str, parent: str, *, baseline: bool = False, kv: float, tps: dict[int, float],
         tpot: dict[int, float], gpu: str = GPU) -> RunRecord:
    rec = RunRecord(experiment=EXPERIMENT, run_name=name, parent_uuid=parent)
    rec.tag("quantrack.role", "arm")
    rec.tag("quantrack.arm", name)
    rec.tag("quantrack.baseline", "true" if baseline else "false")
    rec.tag("quantrack.verdict", "allow")
    rec.tag("quantrack.fallback", "no")
    rec.param("engine", "vllm")
    rec.param("engine_version", "0.25.0")
    rec.param("weights", "bf16" if baseline else "fp8")
    rec.param("kv_cache_dtype", "auto")
    rec.param("gpu_name", gpu)
    rec.param("tp", 1)
    rec.param("hostname", f"node-{gpu.lower()}")
    rec.metric("kv_tokens_reported", kv)
    rec.metric("kv_tokens_predicted", kv * 0.995)
    rec.metric("tpot_ms_p50", tpot[1])
    for c, v in tps.items():
        rec.metric(f"sweep_output_tps_c{c}", v)
    for c, v in tpot.items():
        rec.metric(f"sweep_tpot_ms_p50_c{c}", v)
        rec.metric(f"sweep_ttft_ms_p50_c{c}", 30.0 * c)
    return rec


def build_store(uri: str, gpus: tuple[str, ...] = (GPU,)) -> dict[str, str]:
    """Log the study; returns {arm: run id} (for the first GPU) and 'parent'."""
    tracker = Tracker(uri, EXPERIMENT)
    parent = RunRecord(experiment=EXPERIMENT, run_name="study:constructed", status="RUNNING")
    parent.tag("quantrack.role", "study")
    parent.param("study", "constructed")
    p = tracker.log(parent)
    ids: dict[str, str] = {"parent": p.run_id or ""}
    a, n = 1000, N_Q
    for gpu in gpus:
        scale = 1.0 if gpu == GPU else 0.5
        base_bits = "1" * (a + 20) + "0" * (n - a - 20)

        def arm_bits(b: int, c: int) -> str:
            # base right on ids [0, a+20); the arm keeps a of them right, loses b of the first a+20, gains c after
            right = set(range(a + 20 - b)) | set(range(a + 20, a + 20 + c))
            return "".join("1" if i in right else "0" for i in range(n))

        fp8_bits, good_bits, marlin_bits, slow_bits = arm_bits(20, 12), arm_bits(3, 1), arm_bits(2, 2), arm_bits(1, 1)
        base = _arm("bf16", p.uuid, baseline=True, kv=380_000, tps={1: 200 * scale, 16: 1900 * scale, 64: 3300 * scale},
                    tpot={1: 4.8, 16: 7.0, 64: 18.0}, gpu=gpu)
        _gsm(base, base_bits)
        base.metric("kl_mean", 0.0)
        base.metric("kl_top1_agree", 1.0)
        fp8 = _arm("fp8", p.uuid, kv=434_000, tps={1: 270 * scale, 16: 2600 * scale, 64: 4300 * scale},
                   tpot={1: 3.5, 16: 5.0, 64: 12.0}, gpu=gpu)
        _gsm(fp8, fp8_bits)
        fp8.metric("kl_mean", 0.004)
        fp8.metric("kl_top1_agree", 0.97)
        good = _arm("fp8-good", p.uuid, kv=434_000, tps={1: 260 * scale, 16: 2500 * scale, 64: 4100 * scale},
                    tpot={1: 3.6, 16: 5.2, 64: 12.5}, gpu=gpu)
        _gsm(good, good_bits)
        good.metric("kl_mean", 0.002)
        good.metric("kl_top1_agree", 0.98)
        slow = _arm("slow", p.uuid, kv=400_000, tps={1: 150 * scale, 16: 1500 * scale, 64: 2600 * scale},
                    tpot={1: 6.0, 16: 11.0, 64: 35.0}, gpu=gpu)
        _gsm(slow, slow_bits)
        marlin = _arm("marlin", p.uuid, kv=434_000, tps={1: 235 * scale, 16: 1550 * scale, 64: 2040 * scale},
                      tpot={1: 3.8, 16: 5.0, 64: 19.5}, gpu=gpu)
        _gsm(marlin, marlin_bits)
        marlin.tag("quantrack.verdict", "warn")
        marlin.tag("quantrack.rule_ids", "vllm-fp8-marlin-forced")
        marlin.artifacts["preflight/verdicts.json"] = json.dumps([{
            "rule": "vllm-fp8-marlin-forced", "verdict": "warn",
            "message": "This arm measures the fallback, not native FP8."}])  # the shape preflight logs
        marlin.tag("quantrack.fallback", "yes")
        marlin.tag("quantrack.fallback_kinds", "fp8_marlin")
        marlin.tag("quantrack.fallback_evidence", "marlin-server.log:29: WARNING [marlin_utils_fp8.py:112] Your GPU "
                   "does not have native support for FP8 computation")
        kv8 = _arm("fp8-kv", p.uuid, kv=868_000, tps={1: 265 * scale, 16: 2670 * scale, 64: 4500 * scale},
                   tpot={1: 3.5, 16: 5.1, 64: 12.6}, gpu=gpu)
        kv8.tag("quantrack.latency_contention", "yes")  # as quantrack.measure.hygiene tags it
        kv8.tag("quantrack.latency_contention_reasons", "host load 7.2 on 2 cores")
        kv8.artifacts["sweep/sweep.json"] = json.dumps({"rows": [
            {"concurrency": c, "tpot_ms": {"p50": v, "p90": v * 1.1, "p99": v * 1.3, "mean": v},
             "ttft_ms": {"p50": 30.0 * c, "p90": 33.0 * c, "p99": 40.0 * c, "mean": 30.0 * c}}
            for c, v in {1: 3.5, 16: 5.1, 64: 12.6}.items()]})
        for rec in (base, fp8, good, slow, marlin, kv8):
            got = tracker.log(rec)
            if gpu == gpus[0]:
                ids[rec.run_name] = got.run_id or ""
    tracker.finish(p, "FINISHED")
    return ids
