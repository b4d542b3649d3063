"""Leave-one-thread-out validation of the engine-aware capacity model (bench/capacity_loo.py).

The table in docs/capacity-model.md §7.4 is this module's output; the test recomputes it and checks, for every row,
that the constant it was predicted with was fitted on the other threads only.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("capacity_loo", ROOT / "bench" / "capacity_loo.py")
assert SPEC and SPEC.loader
loo = importlib.util.module_from_spec(SPEC)
sys.modules["capacity_loo"] = loo  # dataclasses look their module up
SPEC.loader.exec_module(loo)


def test_doc_carries_the_recomputed_table() -> None:
    table = loo.markdown(loo.leave_one_thread_out())
    doc = (ROOT / "docs" / "capacity-model.md").read_text()
    for line in table.splitlines():
        if line.strip():
            assert line in doc, f"docs/capacity-model.md §7.4 lacks: {line}"


def test_no_row_is_predicted_with_a_constant_fitted_on_its_own_thread() -> None:
    cases = loo.corpus()
    implied = {c.file: loo.implied_reserve(c) for c in cases}
    for case, row in zip(cases, loo.leave_one_thread_out(), strict=True):
        others = [implied[c.file] for c in cases if c.engine == case.engine and c.thread != case.thread]
        assert row["fit_gib"] == pytest.approx(statistics.median(others) / loo.GiB)
        assert row["train_n"] == len(others) and len(others) < sum(c.engine == case.engine for c in cases)


def test_implied_constant_reproduces_the_log_exactly() -> None:
    for case in loo.corpus():
        pred = loo.predict(case, loo.implied_reserve(case))
        block = 16 if case.engine == "vllm" else 1
        assert abs(pred.engine_tokens - loo.logged(case)) <= block


def test_copies_match_the_shared_logs(shared_data: Path) -> None:
    for name in ("vllm-0.25.0-bf16", "vllm-0.25.0-fp8", "vllm-0.25.0-fp8kv"):
        assert (ROOT / "tests/data/logs/h200-default" / f"{name}.log").read_bytes() == \
            (shared_data / "vllm-h200" / f"{name}.log").read_bytes()
    for name in ("sglang-0.5.16-bf16", "sglang-0.5.16-fp8", "sglang-0.5.16-fp8kv"):
        assert (ROOT / "tests/data/logs/h200-default" / f"{name}.log").read_bytes() == \
            (shared_data / "sglang-h200" / f"{name}.log").read_bytes()
