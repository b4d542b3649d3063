"""The budget verdict (quantrack.accuracy.budget): fixed-n on Newcombe's interval, and the sequential betting
confidence sequence — its boundary cases, its error under optional stopping and its power, simulated; the pools
with train questions (quantrack.accuracy.gsm8k.pool_ids); `eval compare --budget [--sequential]`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quantrack.accuracy.budget import (
    SequentialMonitor,
    fixed_verdict,
    growth_rate,
    paired_differences,
    sequential_verdict,
    simulate,
)
from quantrack.accuracy.gsm8k import (
    FULL_TEST_SIZE,
    TRAIN_ID_OFFSET,
    outcome_position,
    pool_ids,
    pool_size,
    split_of,
)
from quantrack.accuracy.stats import compare_counts
from quantrack.errors import BadInput


def _seq(n: int, p_plus: float, p_minus: float, seed: int) -> list[int]:
    r = random.Random(seed)
    out = []
    for _ in range(n):
        u = r.random()
        out.append(1 if u < p_plus else -1 if u < p_plus + p_minus else 0)
    return out


# ------------------------------------------------------------------ fixed n


def test_fixed_within_exceeds_undecided() -> None:
    # 10,000 paired, 100 each way: Δ = 0, interval about ±0.28 points: within 1 point
    v = fixed_verdict(compare_counts(4000, 100, 100, 5800), 0.01)
    assert v.verdict == "within" and v.low is not None and -1 < v.low < 0 < v.high
    assert v.questions_used == 10000 and v.method == "fixed-n" and v.more_questions is None
    # Δ = -6 points on 5,000: exceeds
    v = fixed_verdict(compare_counts(2000, 400, 100, 2500), 0.01)
    assert v.verdict == "exceeds" and v.high is not None and v.high < -1
    # the H200 FP8 counts (76 only bf16 right, 69 only FP8, n = 1,319): undecided, more questions named
    v = fixed_verdict(compare_counts(453, 76, 69, 721), 0.01)
    assert v.verdict == "undecided" and v.low == pytest.approx(-2.32, abs=0.01) and v.high == pytest.approx(1.26, abs=0.01)
    assert v.more_questions is not None and 10_000 < v.more_questions < 30_000


def test_fixed_boundary_is_strict() -> None:
    """'within' needs the whole interval above -budget: an interval whose low end is the line is undecided."""
    pc = compare_counts(4000, 100, 100, 5800)
    v = fixed_verdict(pc, -pc.delta_ci_low)  # budget exactly at the interval's low end
    assert v.verdict == "undecided"
    v = fixed_verdict(pc, -pc.delta_ci_low + 1e-9)
    assert v.verdict == "within"


def test_fixed_on_the_line_says_no_number_settles_it() -> None:
    pc = compare_counts(400, 60, 50, 490)  # Δ = -1.0 point exactly
    v = fixed_verdict(pc, 0.01)
    assert v.verdict == "undecided" and v.more_questions is None and "budget line" in v.more_reason


# ------------------------------------------------------------------ sequential


def test_sequential_settles_within_and_stops_there() -> None:
    xs = _seq(8000, 0.025, 0.025, seed=3)  # Δ = 0, 5% discordance
    v = sequential_verdict(xs, 0.01)
    assert v.verdict == "within" and v.questions_used < 8000 and v.questions_available == 8000
    assert v.low is not None and v.low > -1.0  # the confidence sequence lies above -1 point where it settled
    # the verdict rests on the first questions_used only: the later ones change nothing
    v2 = sequential_verdict(xs[: v.questions_used] + [-1] * 500, 0.01)
    assert (v2.verdict, v2.questions_used) == ("within", v.questions_used)
    # one question fewer: not yet settled
    assert sequential_verdict(xs[: v.questions_used - 1], 0.01).verdict == "undecided"


def test_sequential_exceeds() -> None:
    xs = _seq(8000, 0.02, 0.06, seed=5)  # Δ = -4 points
    v = sequential_verdict(xs, 0.01)
    assert v.verdict == "exceeds" and v.high is not None and v.high < -1.0 and v.questions_used < 4000


def test_sequential_undecided_names_more_questions() -> None:
    xs = _seq(1319, 0.052, 0.058, seed=7)  # the FP8 pattern: 11% discordance, Δ about -0.5
    v = sequential_verdict(xs, 0.01)
    assert v.verdict == "undecided" and v.questions_used == 1319
    assert v.more_questions is not None and v.more_questions > 1000
    # wider than the fixed-n interval on the same questions: the price of looking at every question
    b = sum(1 for x in xs if x == -1)
    c = sum(1 for x in xs if x == 1)
    fixed = fixed_verdict(compare_counts(500, b, c, 1319 - 500 - b - c), 0.01)
    assert v.low is not None and v.high is not None and fixed.low is not None and fixed.high is not None
    assert v.high - v.low > fixed.high - fixed.low


def test_monitor_and_verdict_agree() -> None:
    for seed in range(5):
        xs = _seq(6000, 0.03, 0.02, seed=seed)
        mon = SequentialMonitor(0.01)
        settled = next((i + 1 for i, x in enumerate(xs) if mon.add(x) is not None), None)
        v = sequential_verdict(xs, 0.01)
        assert v.questions_used == (settled if settled is not None else 6000)
        assert v.verdict == mon.verdict


def test_empty_and_bad_input() -> None:
    assert sequential_verdict([], 0.01).verdict == "undecided"
    with pytest.raises(ValueError):
        sequential_verdict([2], 0.01)
    with pytest.raises(ValueError):
        sequential_verdict([0], 0.0)
    assert paired_differences([(True, False), (None, True), (False, True), (True, True)]) == [-1, 1, 0]


def test_growth_rate_zero_on_the_line_positive_off_it() -> None:
    assert growth_rate(0.025, 0.95, 0.025, 0.0, True) == pytest.approx(0.0, abs=1e-9)
    assert growth_rate(0.025, 0.95, 0.025, -0.01, True) > 0


# ------------------------------------------------------------------ simulated error and power


def test_error_under_optional_stopping_at_most_alpha_on_the_line() -> None:
    """At a true Δ exactly on the budget line, the share of sequences ever declared 'within' (looking after every
    question, up to 8,000) stays at or below alpha (0.05; the design spends 0.025 per side)."""
    for disc in (0.05, 0.11):
        r = simulate(-0.01, disc, 0.01, runs=2000, max_questions=8000, seed=11)
        assert r["within"] <= 0.05, r
        assert r["within"] <= 0.035, r  # and near the 0.025 it is built for (binomial noise on 2,000 runs)


def test_power_at_zero_and_at_minus_three() -> None:
    r = simulate(0.0, 0.05, 0.01, runs=1000, max_questions=8000, seed=12)
    assert r["within"] > 0.5 and r["exceeds"] < 0.01, r  # most runs settle 'within' inside 8,000
    r = simulate(-0.03, 0.08, 0.01, runs=1000, max_questions=8000, seed=13)
    assert r["exceeds"] > 0.95 and 200 <= r["median_questions"] <= 5000, r


# ------------------------------------------------------------------ pools


def test_pools_never_ask_an_exemplar_and_ids_do_not_collide() -> None:
    test = pool_ids("gsm8k", num_shots=5, sampler="first_n")
    train = pool_ids("gsm8k-train", num_shots=5, sampler="first_n")
    both = pool_ids("gsm8k-all", num_shots=5, sampler="first_n")
    assert test == list(range(FULL_TEST_SIZE))
    assert train[0] == TRAIN_ID_OFFSET + 5 and len(train) == pool_size("gsm8k-train", 5) == 7468
    assert both == test + train and len(both) == pool_size("gsm8k-all", 5) == 8787
    assert {split_of(q) for q in test} == {"test"} and {split_of(q) for q in train} == {"train"}
    positions = [outcome_position(q) for q in both]
    assert len(set(positions)) == len(positions) and max(positions) == FULL_TEST_SIZE + 7472
    with pytest.raises(BadInput, match="exemplars must be fixed"):
        pool_ids("gsm8k-all", num_shots=5, sampler="lm-eval")


# ------------------------------------------------------------------ eval compare


@pytest.fixture
def invoke(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """The real entry point: (exit code, stdout, whole stderr)."""
    from quantrack.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _records(path: Path, outcomes: dict[int, bool]) -> Path:
    path.write_text("".join(json.dumps({"id": q, "correct": ok, "prompt_sha256": f"p{q}"}) + "\n"
                            for q, ok in outcomes.items()), encoding="utf-8")
    return path


def test_eval_compare_budget_json_and_sequential(tmp_path: Path, invoke) -> None:  # type: ignore[no-untyped-def]
    r = random.Random(1)
    ids = list(range(FULL_TEST_SIZE)) + [TRAIN_ID_OFFSET + j for j in range(5, 7473)]
    r.shuffle(ids)
    base = {q: r.random() < 0.6 for q in ids}
    arm = dict(base)
    flips = r.sample(ids, 200)  # 2.3% discordance, both ways equally often: Δ = 0, spread over the order
    for q in flips[:100]:
        base[q], arm[q] = True, False
    for q in flips[100:]:
        base[q], arm[q] = False, True
    b = _records(tmp_path / "base.jsonl", base)
    a = _records(tmp_path / "arm.jsonl", arm)
    code, out, err = invoke("eval", "compare", str(b), str(a), "--budget", "1pp", "--format", "json")
    assert code == 0, err
    got = json.loads(out)["budget"]
    assert {"verdict", "budget_pp", "low", "high", "questions_used", "method"} <= set(got)
    assert got["verdict"] == "within" and got["method"] == "fixed-n" and got["questions_used"] == len(ids)
    code, out, err = invoke("eval", "compare", str(b), str(a), "--budget", "1pp", "--sequential", "--format", "json")
    assert code == 0, err
    seq = json.loads(out)["budget"]
    assert seq["method"] == "sequential" and seq["verdict"] == "within" and seq["questions_used"] < len(ids)
    code, out, _ = invoke("eval", "compare", str(b), str(a), "--budget", "1pp")
    assert code == 0 and "Budget: within a 1 pt budget" in out
    code, _, err = invoke("eval", "compare", str(b), str(a), "--sequential")
    assert code == 2 and err.count("\n") == 1 and "--budget" in err
    code, _, err = invoke("eval", "compare", str(b), str(a), "--budget", "1%")
    assert code == 2 and err.count("\n") == 1 and "percentage points" in err


def test_expected_questions_agrees_with_the_simulation() -> None:
    """The planning figure (Wald) lands near the simulated median where most runs settle (5% discordance, Δ = 0),
    is smaller for a larger true loss, and is None exactly on the budget line."""
    from quantrack.accuracy.budget import expected_questions, simulate

    planned = expected_questions(0.0, 0.05, 0.01)
    sim = simulate(0.0, 0.05, 0.01, runs=200, max_questions=20_000, seed=3)
    assert planned is not None and sim["median_questions"] is not None
    assert 0.7 * sim["median_questions"] <= planned <= 1.3 * sim["median_questions"], (planned, sim)
    assert expected_questions(-0.03, 0.11, 0.01) < expected_questions(0.0, 0.11, 0.01)  # type: ignore[operator]
    assert expected_questions(-0.01, 0.05, 0.01) is None


def test_preflight_prints_the_budget_plan(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    study = Path(__file__).parents[2] / "examples/gpu/h200-qwen2.5-coder-1.5b-budget-vllm.toml"
    try:
        main(["preflight", "--study", str(study), "--gpu", "H200"])
    except SystemExit as exc:
        assert exc.code in (0, None)

    class R:
        output = capsys.readouterr().out

    res = R
    assert "budget plan (derived" in res.output and "pool 8,787 questions" in res.output
    assert "each of bf16-again, fp8, kv-int8-per-token-head, kv-fp8-calibrated stops when settled" in res.output
    assert "true Δ +0.0 pts, discordance 11%: " in res.output
