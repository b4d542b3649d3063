"""`compare` rendering against golden files, from runs logged into this test's own temporary store.

The runs are logged from real files only: the vLLM H200 logs and latency JSON in ../shared/data/vllm-h200
and real per-question GSM8K records captured from llama.cpp (tests/data/eval/smol-q41-*.jsonl, see its
README). Regenerate the golden files with QUANTRACK_UPDATE_GOLDEN=1 after an intended change.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.report.compare import (
    FILL,
    NO_RECORDS,
    build_table,
    compare_experiment,
    render,
)
from quantrack.runner import LogInputs, log_results
from quantrack.study import load_study
from quantrack.tracking import RunRow, load_runs

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden"
STUDY = DATA / "tracking" / "vllm-h200.toml"
EXPERIMENT = "vllm-h200-llama8b"


@pytest.fixture(scope="module")
def store_uri(shared_data_module: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Four arms logged with `quantrack log`'s library call into a fresh SQLite store."""
    store = tmp_path_factory.mktemp("compare-store")
    uri = f"sqlite:///{store}/mlflow.db"
    study = load_study(STUDY)
    d = shared_data_module / "vllm-h200"
    ev = {"bf16": DATA / "eval" / "smol-q41-max24.jsonl", "fp8": DATA / "eval" / "smol-q41-lmeval.jsonl"}
    for arm in ("bf16", "fp8", "fp8kv", "fp8marlin"):
        latency = d / f"client-latency-{arm}.json" if arm != "fp8marlin" else None
        log_results(LogInputs(study=study, arm=arm, latency=latency, eval=ev.get(arm),
                              server_log=d / f"vllm-0.25.0-{arm}.log", tracking_uri=uri))
    return uri


@pytest.fixture(scope="module")
def logged(store_uri: str) -> list[RunRow]:
    return load_runs(EXPERIMENT, store_uri)


@pytest.fixture(scope="module")
def shared_data_module() -> Path:
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def _normalize(text: str) -> str:
    return re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text)


@pytest.mark.parametrize("fmt,ext", [("table", "txt"), ("md", "md"), ("csv", "csv"), ("json", "json")])
def test_golden(logged: list[RunRow], fmt: str, ext: str) -> None:
    text = _normalize(render(build_table(EXPERIMENT, logged), fmt))
    golden = GOLDEN / f"compare-vllm-h200.{ext}"
    if os.environ.get("QUANTRACK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_values_come_from_the_files(logged: list[RunRow]) -> None:
    rows = {r["arm"]: r for r in build_table(EXPERIMENT, logged).rows}
    # vllm-0.25.0-bf16.log: "Model loading took 14.96 GiB", "GPU KV cache size: 920,192 tokens"
    assert rows["bf16"]["weights_gib"] == "14.96" and rows["bf16"]["capacity_tok"] == "920,192"
    # client-latency-fp8.json batch1.tpot_ms = 3.442...
    assert rows["fp8"]["tpot_ms"] == "3.44 ms"
    assert rows["fp8marlin"]["fallback"] == "yes (fp8_marlin)" and rows["fp8"]["fallback"] == "no"
    # no eval given for fp8kv / fp8marlin: never filled from elsewhere
    assert rows["fp8kv"]["gsm8k"] == FILL and rows["fp8kv"]["delta"] == FILL
    assert rows["fp8marlin"]["tpot_ms"] == FILL
    # the real records: 0 of 8 (max24) and 0 of 6 (lm-eval) correct -> McNemar over the shared answered ids
    assert rows["bf16"]["gsm8k"] == "0.000 ± 0.000"
    assert rows["fp8"]["delta"] == "+0.0 pts"
    assert rows["fp8"]["paired_test"].startswith("McNemar p=1 (n=")
    assert rows["bf16"]["top1_agree"] == FILL and rows["bf16"]["kl"] == FILL


def test_no_records_marker(logged: list[RunRow]) -> None:
    runs = [RunRow(**{**r.__dict__, "tags": {k: v for k, v in r.tags.items() if k != "quantrack.gsm8k_correct"}})
            for r in logged]
    rows = {r["arm"]: r for r in build_table(EXPERIMENT, runs).rows}
    assert rows["fp8"]["paired_test"] == NO_RECORDS


def test_baseline_choice(logged: list[RunRow]) -> None:
    t = build_table(EXPERIMENT, logged, baseline="fp8")
    assert t.rows[0]["arm"] == "fp8" and t.rows[0]["delta"] == "— (baseline)"
    assert "Δ vs fp8" in t.headers()
    with pytest.raises(BadInput, match=r"--baseline 'fp9' is not an arm of this experiment \(did you mean 'fp8'\?\)"):
        build_table(EXPERIMENT, logged, baseline="fp9")


def test_compare_experiment_and_unknown(store_uri: str) -> None:
    uri = store_uri
    t = compare_experiment(EXPERIMENT, None, uri)
    assert [r["arm"] for r in t.rows] == ["bf16", "fp8", "fp8kv", "fp8marlin"]
    with pytest.raises(BadInput, match="unknown experiment 'vllm-h200-llama9b'"):
        compare_experiment("vllm-h200-llama9b", None, uri)


def test_json_labels(logged: list[RunRow]) -> None:
    data = json.loads(render(build_table(EXPERIMENT, logged), "json"))
    sources = {c["key"]: c["source"] for c in data["columns"]}
    assert sources["predicted_tok"].startswith("derived") and sources["capacity_tok"].startswith("measured")
    assert data["values"][0]["metrics"]["kv_tokens_reported"] == 920192


def test_bad_format(logged: list[RunRow]) -> None:
    with pytest.raises(BadInput, match=r"unknown --format 'tabel' \(did you mean 'table'\?\)"):
        render(build_table(EXPERIMENT, logged), "tabel")
