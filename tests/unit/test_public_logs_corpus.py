"""The public corpus: startup-log excerpts copied verbatim from public GitHub threads (tests/data/public-logs/).

Each ``<name>.log`` holds only the lines copied from the thread; its sidecar ``<name>.log.meta`` gives the URL, the
model, GPU, engine and settings the thread states, and ``# expect: {...}``: the figures a person reads off the excerpt
(LogReport fields or ``extra`` keys; ``errors`` / ``fallbacks`` as the set of kinds). Every excerpt is parsed with
``--engine auto``: the engine must be detected from the lines alone, the figures must come out exactly, and the
JSON must name the lines that decided the engine.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from quantrack.cli import main
from quantrack.engines import parse_log_file
from quantrack.engines.detect import detect_text, markers
from quantrack.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "data" / "public-logs"
FILES = sorted(LOGS.glob("*.log"))
IDS = [p.name.removesuffix(".log") for p in FILES]
_EXPECT = re.compile(r"^# expect: (\{.*\})$", re.MULTILINE)


def meta(path: Path) -> str:
    return (path.parent / f"{path.name}.meta").read_text()


def expected(path: Path) -> dict[str, Any]:
    m = _EXPECT.search(meta(path))
    assert m, f"{path.name}.meta has no '# expect: {{...}}' line"
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def got(report: Any, key: str) -> Any:
    if key == "engine":
        return report.engine
    if key in ("errors", "fallbacks", "warnings"):
        return sorted({e.kind for e in getattr(report, key)})
    if key != "extra" and hasattr(report, key):
        return getattr(report, key)
    return report.extra.get(key)


def test_the_corpus_is_large_and_varied() -> None:
    assert len(FILES) >= 112
    engines = [expected(p)["engine"] for p in FILES]
    assert {e: engines.count(e) for e in set(engines)} == {"vllm": 63, "sglang": 13, "llamacpp": 36}
    urls = [re.search(r"^# source: (\S+)", meta(p), re.MULTILINE).group(1) for p in FILES]  # type: ignore[union-attr]
    assert len(set(urls)) >= 105 and all(u.startswith("https://github.com/") for u in urls)
    # a thread gives one excerpt, unless it holds distinct runs the corpus keeps apart (before/after, two settings)
    repeated = sorted({u for u in urls if urls.count(u) > 1})
    assert repeated == ["https://github.com/vllm-project/vllm/issues/10517", "https://github.com/vllm-project/vllm/issues/21348",
                        "https://github.com/vllm-project/vllm/issues/25350", "https://github.com/vllm-project/vllm/pull/10511",
                        "https://github.com/vllm-project/vllm/pull/13596"]


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_sidecar_names_source_model_gpu_engine_settings(path: Path) -> None:
    header = meta(path)
    for key in ("# source: https://github.com/", "# model:", "# gpu:", "# engine:", "# settings stated:",
                "# expect: {", "copied verbatim"):
        assert key in header, f"{path.name}.meta lacks {key!r}"
    assert not path.read_text().startswith("# source"), "the .log holds the copied lines only"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_auto_detection_reads_the_stated_figures(path: Path) -> None:
    want = expected(path)
    if "refused" in want:  # a file quantrack must not read as one run: refused with the reason, one line
        with pytest.raises(BadInput, match=want["refused"]) as exc:
            parse_log_file(path)
        assert "\n" not in str(exc.value)
        return
    report = parse_log_file(path)  # --engine auto
    have = {k: got(report, k) for k in want}
    norm = {k: sorted(v) if isinstance(v, list) else v for k, v in want.items()}
    assert have == norm
    # the JSON names the lines that decided the engine, each a real line of the file at its number
    assert report.detection["method"] == "auto" and report.detection["engine"] == want["engine"]
    lines = path.read_text().splitlines()
    assert report.engine_evidence
    for ev in report.engine_evidence:
        assert ev["engine"] == want["engine"]
        assert ev["line"] == lines[ev["line_no"] - 1].strip()[:300]


def test_every_marker_names_where_it_was_seen() -> None:
    assert {m.engine for m in markers()} == {"vllm", "sglang", "llamacpp"}
    for m in markers():
        assert m.source and m.weight > 0 and m.anchors, m.label
        re.compile(m.pattern)


# --- detection holds for a few lines pasted out of the middle of a log -----------------------------------------
REAL = ROOT / "tests" / "data" / "logs" / "h200-util045"


@pytest.mark.parametrize("name,engine", [("vllm-0.25.0-bf16.log", "vllm"), ("vllm-0.25.0-fp8kv.log", "vllm"),
                                         ("sglang-0.5.16-bf16.log", "sglang"), ("sglang-0.5.16-fp8kv.log", "sglang")])
def test_three_lines_from_the_middle_of_a_real_log(name: str, engine: str) -> None:
    lines = (REAL / name).read_text().split("\n")  # newline only: tqdm bars keep their carriage returns
    hits = 0
    windows = range(len(lines) // 4, 3 * len(lines) // 4)
    for start in windows:
        det = detect_text("\n".join(lines[start:start + 3]))
        assert det.engine in (None, engine), f"lines {start + 1}-{start + 3} read as {det.engine}"
        hits += det.engine == engine
    # every 3-line window of the middle half names the engine (progress bars included), none names another
    assert hits == len(windows)


def test_no_clear_winner_is_said_with_the_candidates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = (REAL / "vllm-0.25.0-bf16.log").read_text().splitlines()
    s = (REAL / "sglang-0.5.16-bf16.log").read_text().splitlines()
    p = tmp_path / "two-engines.log"
    p.write_text("\n".join(x for pair in zip(v, s, strict=False) for x in pair) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["logs", "parse", str(p)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "engine unclear (no clear engine: " in err
    assert "closest: vllm (" in err and "sglang (" in err and "pass --engine" in err
    # the user's choice is taken, and the mismatch is not hidden
    main(["logs", "parse", str(p), "--engine", "sglang", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data[0]["engine"] == "sglang" and data[0]["detection"]["method"] == "given"


@pytest.mark.parametrize("content,message", [
    (b"", "empty file, not a startup log"),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64, "binary file, not a text log"),
    (b'10.0.0.1 - - [10/Oct/2025:13:55:36 +0000] "GET / HTTP/1.1" 200 2326\n' * 20,
     ("not a vLLM, SGLang or llama.cpp startup log (no engine line found); pass --engine vllm|sglang|llamacpp if it "
     "is one")),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
                                      message: str) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main(["logs", "parse", str(p)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"quantrack: error: {p}: {message}\n"
    with pytest.raises(SystemExit) as exc:
        main(["logs", "parse", str(tmp_path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"quantrack: error: {tmp_path}: is a directory, not a log file\n"


# --- audit: every fallback flagged, every unreadable node unknown --------------------------------------------
MARLIN_NO_BANNER = "vllm-31387-a100-fp8-marlin-nobanner.log"


def test_marlin_excerpt_without_banner_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real A100 Marlin warning, pasted without its engine banner or log prefix, is a fallback (exit 4)."""
    shutil.copy(LOGS / MARLIN_NO_BANNER, tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--format", "json"])
    assert exc.value.code == 4
    data = json.loads(capsys.readouterr().out)
    node = data["nodes"][0]
    assert node["fallback"] is True and node["fallback_kinds"] == "fp8_marlin"
    assert node["evidence"].startswith(f"{MARLIN_NO_BANNER}:1: **Your GPU does not have native support for FP8")


def test_audit_over_the_corpus_and_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for p in FILES:
        shutil.copy(p, tmp_path)
    (tmp_path / "zz-binary.log").write_bytes(b"\x00\x01\x02" * 1000)
    (tmp_path / "zz-empty.log").write_bytes(b"")
    (tmp_path / "zz-nginx.log").write_text('10.0.0.1 - - [10/Oct/2025] "GET / HTTP/1.1" 200 2326\n' * 10)
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--format", "json"])
    assert exc.value.code == 4
    data = json.loads(capsys.readouterr().out)
    by = {n["node"]: n for n in data["nodes"]}
    # layers left on the CPU are their own class (CPU placement), not a fallback: 4 of the 12 excerpts with one
    from quantrack.report.audit import CPU_PLACEMENT_KINDS

    def kernel(p: Path) -> set[str]:
        return set(expected(p).get("fallbacks", [])) - set(CPU_PLACEMENT_KINDS)

    want_fallback = {p.name for p in FILES if kernel(p)}
    want_cpu = {p.name for p in FILES if set(expected(p).get("fallbacks", [])) & set(CPU_PLACEMENT_KINDS)}
    assert set(data["fell_back"]) == want_fallback and len(want_fallback) == 8
    assert set(data["cpu_placement"]) == want_cpu and len(want_cpu) == 4
    for name in want_fallback:
        assert by[name]["fallback_kinds"] == ",".join(sorted(kernel(LOGS / name)))
    for name in want_cpu:
        assert data["cpu_placement"][name].startswith(f"{name}:") and "layers to GPU" in data["cpu_placement"][name]
    assert data["unknown"]["zz-binary.log"] == "binary file, not a text log"
    assert data["unknown"]["zz-empty.log"] == "empty file, not a startup log"
    assert data["unknown"]["zz-nginx.log"].startswith("engine not recognised (no engine markers found")
    # "no" only where the log was read past weight loading, names its quantization and did not fail: of the
    # excerpts, two; the others stop before loading, name no quantization, or failed, so they are unknown, not clean
    clean = sorted(n for n, r in by.items() if r["fallback"] is False and not r["cpu_placement"])
    assert clean == ["vllm-2418-v02-banner-blocks.log", "vllm-club3090-295-tp2-autoround-fp8e5m2-kv.log"]
    assert by["vllm-49011-5090-nvfp4-banner.log"]["unknown_reason"].startswith("the log has no line printed once the "
                                                                               "weights are loaded")
    assert by["vllm-substratus37-t4-bf16-error.log"]["unknown_reason"].startswith(
        "the engine failed before loading the weights (bf16_unsupported_error at line 1)")
    assert by["vllm-12569-v1-llama31-70b-w8a8.log"]["unknown_reason"] == (
        "the log names no quantization (no engine banner / server_args / GGUF file type)")
    # every failed start is a FAILED node with its evidence line, never clean; the reason says where it failed
    failed = {p.name for p in FILES if expected(p).get("startup_failed") is True}
    assert failed <= set(data["failed"]) and len(data["failed"]) == 23
    for name in data["failed"]:
        assert by[name]["status"] == "FAILED" and by[name]["fallback"] is not False
    assert by["vllm-27508-h100-gptoss-oom-profile.log"]["unknown_reason"].startswith(
        "the engine failed after loading the weights")  # an OOM in the profile run, not before the weights
    assert by["vllm-15617-two-launches-kv-too-small-then-oom.log"]["unknown_reason"].startswith("holds 2 runs")
    # degraded paths are listed with their evidence line, outside the exit code
    degraded = {n: r["degraded"] for n, r in by.items() if r["degraded"]}
    assert degraded == {"llamacpp-26297-alloc-retry-no-pp.log": "alloc_retried_without_pp",
                        "llamacpp-lmstudio1454-cpu-kv-fa-auto-disabled.log": "flash_attn_auto_disabled",
                        "sglang-5390-dp-attention-b200-default-config.log": "w8a8_block_fp8_default_config",
                        "sglang-5675-w8a8-block-fp8-default-config.log": "w8a8_block_fp8_default_config",
                        "vllm-15340-custom-allreduce-disabled-8gpu.log": "custom_allreduce_disabled",
                        "vllm-17619-default-moe-config.log": "moe_default_config",
                        "vllm-llamafactory5050-fa2-missing-xformers.log": "xformers_extensions_missing"}
    for name in degraded:  # the evidence is the file's own line, at its number
        line_no = int(by[name]["degraded_evidence"].split(":")[1])
        line = (LOGS / name).read_text().splitlines()[line_no - 1].strip()
        assert by[name]["degraded_evidence"] == f"{name}:{line_no}: {line}"
    assert len(data["unknown"]) + len(clean) + len(want_fallback) + len(want_cpu) == len(FILES) + 3
    text_exc = None
    try:
        main(["audit", "--logs", str(tmp_path)])
    except SystemExit as e:
        text_exc = e.code
    text = capsys.readouterr().out
    assert text_exc == 4
    assert f"; {len(data['unknown'])} node(s) unknown: not read far enough to say" in text
    assert "UNKNOWN zz-binary.log: binary file, not a text log" in text


def test_only_unknown_nodes_exit_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(LOGS / "sglang-11716-tp8-init.log", tmp_path)  # stops before the weights are loaded
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path)])
    assert exc.value.code == 5
    out = capsys.readouterr().out
    assert "UNKNOWN sglang-11716-tp8-init.log: the log has no line printed once the weights are loaded" in out
    assert "0 of 1 node(s) fell back; 1 node(s) unknown: not read far enough to say (exit 5)." in out
