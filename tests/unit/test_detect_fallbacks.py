"""Detection and the fallback catalogues on the smallest pastes: one real line, no prefix, no banner.

Lines are taken verbatim from the public excerpts in tests/data/public-logs/ (named per test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines import parse_log_file
from quantrack.engines.detect import detect_text

PUB = Path(__file__).resolve().parents[1] / "data" / "public-logs"
# the Marlin warning without any prefix (vllm-31387-a100-fp8-marlin-nobanner.log, line 1, minus the paste's "**")
MARLIN = ("Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
          "Weight-only FP8 compression will be used leveraging the Marlin kernel.")


def test_the_marlin_text_alone_names_no_engine_but_is_a_fallback(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM and SGLang print the same text: it is no evidence for either, and still a fallback for audit."""
    det = detect_text(MARLIN)
    assert det.engine is None and det.scores == {"vllm": 1, "sglang": 1, "llamacpp": 0}
    assert det.reason == "too few engine markers (best: vllm with 1 point)"
    p = tmp_path / "node.log"
    p.write_text(MARLIN + "\n")
    report = parse_log_file(p)
    assert report.engine is None and [(e.kind, e.line_no) for e in report.fallbacks] == [("fp8_marlin", 1)]
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--format", "json"])
    assert exc.value.code == 4
    node = json.loads(capsys.readouterr().out)["nodes"][0]
    assert node["fallback"] is True and node["engine"] is None


def test_file_name_prefix_decides_a_one_line_paste() -> None:
    # "[marlin_utils_fp8.py:80] ..." (vllm-sglang12887-marlin-fp8-line.log): vLLM's logger format names the file
    line = (PUB / "vllm-sglang12887-marlin-fp8-line.log").read_text().strip()
    det = detect_text(line)
    assert det.engine == "vllm" and det.evidence[0]["marker"] == "vLLM logger file name"


@pytest.mark.parametrize(("name", "engine", "marker"), [
    ("llamacpp-lcpp1939-docker-prefix.log", "llamacpp", "llama.cpp KV cache"),  # "llama-1  | " before each line
    ("vllm-unsloth2887-v085-wrapped-banner.log", "vllm", "vLLM engine banner"),  # "vLLM STDOUT: "
    ("llamacpp-23792-pid-prefix-tp.log", "llamacpp", "llama.cpp model info"),  # "[47161] " before the timestamp
    ("vllm-12539-l4-docker-workers.log", "vllm", "vLLM process prefix"),  # "deepseek  | (VllmWorkerProcess ..."
])
def test_wrapper_prefixes_do_not_hide_the_engine(name: str, engine: str, marker: str) -> None:
    report = parse_log_file(PUB / name)
    assert report.engine == engine
    assert marker in [e["marker"] for e in report.engine_evidence]


def test_a_given_engine_that_contradicts_the_log_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    report = parse_log_file(PUB / "vllm-12569-v1-llama31-70b-w8a8.log", "sglang")
    assert report.engine == "sglang" and report.detection["method"] == "given"
    [w] = [w for w in report.warnings if w.kind == "engine_mismatch"]
    assert w.line.startswith("--engine sglang, but the log reads as vllm (vllm: ")


def test_cli_json_names_the_deciding_lines(capsys: pytest.CaptureFixture[str]) -> None:
    main(["logs", "parse", str(PUB / "sglang-4048-tp8-input-too-long.log"), "--format", "json"])
    [data] = json.loads(capsys.readouterr().out)
    assert data["engine"] == "sglang" and data["detection"]["method"] == "auto"
    top = data["engine_evidence"][0]
    assert top["marker"] == "SGLang rank prefix" and top["line_no"] == 3
    assert top["line"].startswith("[2025-03-03 06:49:28 TP5] Input length (160062 tokens) exceeds")
