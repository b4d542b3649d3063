"""A context length the model or the memory cannot hold is a preflight rejection (issue #16: `context_len =
2000000000` passed preflight and the engine was OOM-killed after allocating ~20 GB). Capacity is derived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    try:
        code = main(["preflight", "--arm", "bf16", *args, "--format", "json"])
    except SystemExit as exc:
        code = exc.code
    return int(code or 0), json.loads(capsys.readouterr().out)


def rules(report: dict) -> dict[str, str]:
    return {v["rule"]: v["verdict"] for r in report["results"] for v in r["reasons"]
            if v["rule"].startswith("context-")}


def test_two_billion_tokens_is_rejected_twice(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = preflight(capsys, "--gpu", "H100", "--model", "Llama-3-8B", "--context-len", "2000000000")
    assert code == 3 and report["verdict"] == "reject"
    assert rules(report) == {"context-exceeds-model": "reject", "context-exceeds-kv": "reject"}
    reason = next(v for v in report["results"][0]["reasons"] if v["rule"] == "context-exceeds-model")
    assert reason["message"] == "context 2,000,000,000 is above Llama-3-8B's maximum of 8,192 tokens"
    assert report["results"][0]["launch"] is None  # not runnable: no launch command


def test_model_maximum_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = preflight(capsys, "--gpu", "H100", "--model", "Llama-3-8B", "--context-len", "8192")
    assert code == 0 and rules(report) == {}


def test_within_the_model_but_not_in_the_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B allows 131,072 tokens; on an L4 (24 GB) bf16 weights leave room for far fewer (derived)."""
    code, report = preflight(capsys, "--gpu", "L4", "--model", "Llama-3.1-8B", "--context-len", "131072")
    cap = report["results"][0]["capacity"]
    assert cap["engine_tokens"] < 131072
    assert code == 3 and rules(report) == {"context-exceeds-kv": "reject"}


def test_llamacpp_kv_against_the_device_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = preflight(capsys, "--gpu", "L4", "--engine", "llamacpp", "--model", "Llama-3-8B",
                             "--context-len", "2000000000")
    assert code == 3
    assert rules(report) == {"context-exceeds-model": "warn", "context-exceeds-memory": "reject"}


def test_study_context_len_goes_through_the_same_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "s.toml"
    study.write_text('name = "s"\ncontext_len = 2000000000\n[model]\nname = "Llama-3-8B"\npath = "/m"\n'
                     '[gpu]\nname = "H100"\n[[arms]]\nname = "bf16"\n', encoding="utf-8")
    try:
        code = main(["preflight", "--study", str(study), "--format", "json"])
    except SystemExit as exc:
        code = exc.code
    report = json.loads(capsys.readouterr().out)
    assert code == 3 and rules(report)["context-exceeds-model"] == "reject"
