"""Pure math of quantrack.accuracy.kl: per-position KL estimate and bound, top-1, bootstrap, summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from quantrack.accuracy.kl import (
    PositionStats,
    argmax,
    bootstrap_ci,
    position_stats,
    summarize,
    truncate_topk,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "kl"


def _logs(d: dict[int, float]) -> dict[int, float]:
    return {t: math.log(p) for t, p in d.items()}


def _topk_of(probs: np.ndarray, k: int) -> dict[int, float]:
    idx = np.argsort(-probs)[:k]
    return {int(i): float(np.log(probs[i])) for i in idx}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_identical_top_k_gives_agreement_and_zero_kl() -> None:
    base = _logs({5: 0.5, 7: 0.2, 9: 0.1})
    s = position_stats(base, dict(base))
    assert s.agree is True
    assert s.kl == 0.0 and s.kl_lower == 0.0
    assert s.overlap == 1.0
    assert s.base_tail == pytest.approx(0.2) and s.cand_tail == pytest.approx(0.2)


def test_hand_worked_example_estimate_and_lower_bound() -> None:
    # base top-2 {1: .6, 2: .3}, cand top-2 {1: .5, 3: .4}; both have 0.1 outside their top-2.
    s = position_stats(_logs({1: 0.6, 2: 0.3}), _logs({1: 0.5, 3: 0.4}))
    # lower bound: cells {1}, {everything else}: base (.6, .4), cand (.5, .5)
    assert s.kl_lower == pytest.approx(0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5))
    # estimate: token 2 unknown on cand -> min(.4, .1/2) = .05; token 3 unknown on base -> min(.3, .1/2) = .05;
    # "other" bucket: base .1 - .05, cand .1 - .05 -> contributes 0.
    expected = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.05) + 0.05 * math.log(0.05 / 0.4)
    assert s.kl == pytest.approx(expected)
    assert s.agree is True  # argmax 1 on both
    assert s.overlap == pytest.approx(0.5)


def test_top1_disagreement_and_tie_break() -> None:
    assert position_stats(_logs({1: 0.6, 2: 0.3}), _logs({1: 0.3, 2: 0.6})).agree is False
    # equal log-probabilities: the smaller id wins on both sides, so ties never count as disagreement
    assert argmax({9: -1.0, 4: -1.0, 7: -2.0}) == 4


def test_truncate_topk_keeps_the_k_most_likely() -> None:
    d = {1: -0.5, 2: -1.0, 3: -9.0, 4: -2.0}
    assert truncate_topk(d, 2) == {1: -0.5, 2: -1.0}
    assert truncate_topk(d, 10) == d


def test_full_coverage_is_exact() -> None:
    # When the top-k holds the whole vocabulary, estimate and lower bound are the exact KL.
    rng = np.random.default_rng(1)
    p, q = _softmax(rng.normal(size=12)), _softmax(rng.normal(size=12))
    true = float(np.sum(p * np.log(p / q)))
    s = position_stats(_topk_of(p, 12), _topk_of(q, 12))
    assert s.kl == pytest.approx(true, rel=1e-9)
    assert s.kl_lower == pytest.approx(true, rel=1e-9)


@pytest.mark.parametrize("scale", [3.0, 5.0])
@pytest.mark.parametrize("noise", [0.05, 0.3, 1.0])
def test_lower_bound_holds_on_random_distributions(scale: float, noise: float) -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        logits = rng.normal(scale=scale, size=2000)
        p = _softmax(logits)
        q = _softmax(logits + rng.normal(scale=noise, size=2000))
        true = float(np.sum(p * np.log(p / q)))
        s = position_stats(_topk_of(p, 20), _topk_of(q, 20))
        assert s.kl_lower <= true + 1e-12
        assert s.kl >= s.kl_lower


def test_estimate_recovers_most_of_the_kl_when_the_tail_is_small() -> None:
    # logits scale 5 over 2,000 tokens leaves ~5% outside the top-20, like SmolLM2 on GSM8K answers (measured
    # base_tail_mass 0.045); the invisible tail makes the estimate low, not high.
    rng = np.random.default_rng(11)
    ratios, tails = [], []
    for _ in range(200):
        logits = rng.normal(scale=5.0, size=2000)
        p, q = _softmax(logits), _softmax(logits + rng.normal(scale=0.3, size=2000))
        s = position_stats(_topk_of(p, 20), _topk_of(q, 20))
        ratios.append(s.kl / float(np.sum(p * np.log(p / q))))
        tails.append(s.base_tail)
    assert 0.02 < float(np.mean(tails)) < 0.1
    assert 0.85 < float(np.median(ratios)) <= 1.0


def _stats(agree: bool, kl: float) -> PositionStats:
    return PositionStats(agree=agree, kl=kl, kl_lower=kl, base_tail=0.0, cand_tail=0.0, overlap=1.0)


def test_bootstrap_needs_two_texts_and_is_deterministic() -> None:
    assert bootstrap_ci([[_stats(True, 0.1)] * 5]) is None
    groups = [[_stats(True, 0.1), _stats(False, 0.3)], [_stats(True, 0.0)] * 3, [_stats(False, 0.5)]]
    a, b = bootstrap_ci(groups), bootstrap_ci(groups)
    assert a == b and a is not None
    lo, hi = a["kl_mean"]
    assert lo <= (0.1 + 0.3 + 0.5) / 6 <= hi
    lo, hi = a["top1_agree"]
    assert 0.0 <= lo <= 4 / 6 <= hi <= 1.0
    # identical texts: no spread at all
    same = bootstrap_ci([[_stats(True, 0.2)] * 4] * 3)
    assert same == {"top1_agree": [1.0, 1.0], "kl_mean": [pytest.approx(0.2), pytest.approx(0.2)]}


def test_summarize_pools_positions_and_names_the_mlflow_metrics() -> None:
    groups = [[_stats(True, 0.0), _stats(False, 0.4)], [_stats(True, 0.2)]]
    r = summarize(groups, engine="llamacpp", baseline_url="http://a", candidate_url="http://b", top_k=20,
                  sources=["t1", "t2"])
    assert r.n_positions == 3 and r.n_texts == 2
    assert r.top1_agree == pytest.approx(2 / 3)
    assert r.kl_mean == pytest.approx(0.2) and r.kl_median == pytest.approx(0.2)
    assert r.kl_p99 == pytest.approx(float(np.percentile([0.0, 0.4, 0.2], 99)))
    assert set(r.metrics()) == {"kl_top1_agree", "kl_mean", "kl_median", "kl_p99", "kl_positions"}
    d = r.to_dict()
    assert d["metrics"]["kl_positions"] == 3.0
    assert d["label"] == "measured"
    assert [t["source"] for t in d["per_text"]] == ["t1", "t2"]
    json.dumps(d)  # serialisable as --format json / --out


def test_real_llamacpp_f16_vs_q4_0_positions() -> None:
    # top-20 lists parsed from a real llama.cpp run (see the file's "captured" field)
    data = json.loads((DATA / "llamacpp-f16-vs-q4_0-topk.json").read_text())
    pos = [({int(k): v for k, v in p["base"].items()}, {int(k): v for k, v in p["cand"].items()})
           for p in data["positions"]]
    stats = [position_stats(b, c) for b, c in pos]
    for (b, c), s in zip(pos, stats, strict=True):
        assert 0.0 <= s.kl_lower <= s.kl
        assert s.agree == (max(b, key=b.__getitem__) == max(c, key=c.__getitem__))
        assert 0.0 < s.base_tail < 1.0  # a real top-20 never holds all the mass of a 49k vocabulary
    assert 0 < sum(s.agree for s in stats) < len(stats)  # Q4_0 flips some argmaxes on this text
    # each side against itself: agreement and zero KL
    assert all(position_stats(b, b).kl == 0.0 and position_stats(c, c).agree for b, c in pos)
