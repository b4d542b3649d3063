"""GSM8K against a real llama.cpp server (SmolLM2-135M via xllamacpp).

Uses the ``llamacpp_server`` fixture (tests/integration/conftest.py, yields the base URL on 127.0.0.1);
skips when that fixture is not available. A 135M model scores near zero: the point is a working,
honest pipeline (records, counts, a wide interval, resume).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.accuracy.gsm8k import format_result, run_gsm8k, small_sample_warning
from quantrack.accuracy.records import load_records

pytestmark = pytest.mark.integration

N = 10


@pytest.fixture
def base_url(llamacpp_server: str) -> str:
    """conftest's shared llama.cpp server (real SmolLM2 GGUF on 127.0.0.1)."""
    return str(llamacpp_server)


def test_gsm8k_ten_questions_records_counts_and_resume(base_url: str, tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    calls: list[tuple[int, int, int]] = []
    res = run_gsm8k(base_url, num_questions=N, num_shots=5, max_tokens=64, concurrency=2, seed=42,
                    records_path=out, engine="llamacpp", progress=lambda *a: calls.append(a))
    print("\n".join(format_result(res)))
    print(small_sample_warning(res))

    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == list(range(N))
    assert calls[0] == (0, N, 0) and calls[-1][0] == N
    answered = [r for r in lines if r["error"] is None]
    assert res.n == len(answered) and res.errors == N - len(answered) == 0
    assert res.invalid == sum(1 for r in answered if r["extracted"] is None) <= res.n
    assert res.correct == sum(1 for r in answered if r["correct"])
    for r in answered:
        assert isinstance(r["response"], str) and r["prompt_tokens"] > 500 and 0 < r["latency_s"]
        assert r["completion_tokens"] is not None and r["completion_tokens"] <= 64
    assert res.accuracy is not None and 0.0 <= res.accuracy <= 1.0
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low <= res.accuracy <= res.ci_high and res.ci_high - res.ci_low > 0.25  # 10 questions: wide
    assert small_sample_warning(res) is not None

    # a finished file: resume asks nothing
    again: list[tuple[int, int, int]] = []
    res2 = run_gsm8k(base_url, num_questions=N, num_shots=5, max_tokens=64, concurrency=2, seed=42,
                     records_path=out, resume=True, engine="llamacpp", progress=lambda *a: again.append(a))
    assert again == [(N, N, 0)] and len(out.read_text().splitlines()) == N
    assert (res2.n, res2.correct, res2.invalid) == (res.n, res.correct, res.invalid)

    # an interrupted run (last 4 records lost, last line torn): resume asks only those 4
    kept = out.read_text().splitlines()[:6]
    out.write_text("\n".join(kept) + "\n" + '{"id": 9, "prompt_sha')
    before = {r.id for r in load_records(out).values()}
    assert len(before) == 6
    res3 = run_gsm8k(base_url, num_questions=N, num_shots=5, max_tokens=64, concurrency=2, seed=42,
                     records_path=out, resume=True, engine="llamacpp")
    final = out.read_text().splitlines()
    assert len(final) == N and sorted(json.loads(x)["id"] for x in final) == list(range(N))
    assert res3.n + res3.errors == N
