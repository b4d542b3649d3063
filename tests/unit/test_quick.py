"""`quantrack run --quick`: the same arms, far fewer requests, its own experiment, tagged."""

from __future__ import annotations

from pathlib import Path

from quantrack.study import load_study, quick_study

ROOT = Path(__file__).resolve().parents[2]


def test_quick_study_of_the_cpu_example() -> None:
    full = load_study(ROOT / "examples" / "cpu-smollm2.toml")
    q = quick_study(full)
    assert [a.name for a in q.arms] == [a.name for a in full.arms]
    assert (q.latency.warmup, q.latency.iterations) == (1, 3)
    assert (q.latency.input_tokens, q.latency.output_tokens) == (full.latency.input_tokens, full.latency.output_tokens)
    assert q.sweep.concurrency == (1, 4) and q.sweep.requests_per_level == 4
    assert q.eval.num_questions == 3 and q.eval.kl_tokens == 64
    assert q.tracking.experiment == "cpu-smollm2-quick" and q.quick and not full.quick
    assert q.context_len == full.context_len and q.parallel == full.parallel


def test_quick_never_asks_for_more_than_the_study() -> None:
    full = load_study(ROOT / "examples" / "cpu-smollm2.toml")
    from dataclasses import replace

    small = replace(full, latency=replace(full.latency, warmup=0, iterations=2),
                    eval=replace(full.eval, num_questions=2, kl_tokens=0))
    q = quick_study(small)
    assert (q.latency.warmup, q.latency.iterations, q.eval.num_questions, q.eval.kl_tokens) == (0, 2, 2, 0)


def test_quick_tags_the_runs() -> None:
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.record import record_for_arm, study_record
    from quantrack.run.schema import Tag

    q = quick_study(load_study(ROOT / "examples" / "cpu-smollm2.toml"))
    rec = record_for_arm(q, ArmOutcome(arm=q.arms[0], status="FINISHED"), experiment=q.tracking.experiment or "")
    assert rec.tags[Tag.QUICK] == "true"
    assert study_record(q, "e", {}).tags[Tag.QUICK] == "true"
