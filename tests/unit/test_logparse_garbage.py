"""Garbage in: binary bytes, empty files, truncated lines, two engines interleaved, a big log.
An adapter (the runner's own captured log) returns a report whose not_found names what is missing and never raises;
``parse_log_file`` with auto-detection (the CLI, audit) refuses an empty, binary or directory input with one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from quantrack.engines import get_adapter, parse_log_file
from quantrack.errors import BadInput


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_empty_log(tmp_path: Path, engine: str) -> None:
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    r = get_adapter(engine).parse_log_file(p)
    assert r.engine == engine and r.kv_cache_tokens is None
    assert "kv_cache_tokens" in r.not_found and "weights_gib" in r.not_found
    assert r.extra["lines_read"] == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_binary_bytes(tmp_path: Path, engine: str) -> None:
    p = tmp_path / "binary.log"
    p.write_bytes(bytes(range(256)) * 4000 + b"\x00\xff\xfe" * 10000)  # ~1 MB, few newlines, NULs, bad UTF-8
    r = get_adapter(engine).parse_log_file(p)
    assert r.kv_cache_tokens is None and "kv_cache_tokens" in r.not_found


def test_auto_detect_on_garbage_is_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "noise.log"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 100)
    with pytest.raises(BadInput, match=r"noise\.log: binary file, not a text log$"):
        parse_log_file(p)
    (tmp_path / "empty.log").write_bytes(b"\n  \n")
    with pytest.raises(BadInput, match=r"empty\.log: empty file, not a startup log$"):
        parse_log_file(tmp_path / "empty.log")
    with pytest.raises(BadInput, match=r": is a directory, not a log file$"):
        parse_log_file(tmp_path)


def test_other_programs_log_names_no_engine(tmp_path: Path) -> None:
    p = tmp_path / "nginx.log"
    p.write_text('127.0.0.1 - - [10/Oct/2025:13:55:36 +0000] "GET /index.html HTTP/1.1" 200 2326\n' * 50)
    r = parse_log_file(p)
    assert r.engine is None and "engine" in r.not_found and r.detection["scores"] == {
        "vllm": 0, "sglang": 0, "llamacpp": 0}


def test_missing_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="log file not found"):
        parse_log_file(tmp_path / "nope.log")


def test_truncated_lines(shared_data: Path, tmp_path: Path) -> None:
    # the real fp8kv log, cut in the middle of its capacity line (line 50) and of the concurrency line
    lines = (shared_data / "vllm-h200" / "vllm-0.25.0-fp8kv.log").read_bytes().split(b"\n")
    assert b"GPU KV cache size: 1,945,728 tokens" in lines[49]
    cut = [*lines[:49], lines[49][:-12]]  # "...GPU KV cache size: 1,9" - the number is incomplete
    p = tmp_path / "cut.log"
    p.write_bytes(b"\n".join(cut))  # no final newline either
    r = get_adapter("vllm").parse_log_file(p)
    assert r.weights_gib == 8.5 and r.available_kv_gib == 118.76  # complete lines before the cut still count
    assert r.kv_cache_tokens is None or r.kv_cache_tokens < 1_945_728  # never the full figure from half a line
    assert "max_concurrency" in r.not_found and "cuda_graph_gib" in r.not_found


def test_two_engines_interleaved(shared_data: Path, tmp_path: Path) -> None:
    v = (shared_data / "vllm-h200" / "vllm-0.25.0-fp8marlin.log").read_text().splitlines()
    s = (shared_data / "sglang-h200" / "sglang-0.5.16-fp8kv.log").read_text().splitlines()
    mixed = [x for pair in zip(v, s, strict=False) for x in pair] + v[len(s):] + s[len(v):]
    p = tmp_path / "mixed.log"
    p.write_text("\n".join(mixed) + "\n")
    r = parse_log_file(p)
    # half vLLM, half SGLang: no engine is clear, both are named, and the fallback is still found
    assert r.engine is None and r.detection["candidates"] == ["vllm", "sglang"]
    assert r.detection["reason"].startswith("no clear engine: vllm ")
    assert [e.kind for e in r.fallbacks] == ["fp8_marlin"]
    # each adapter reads only its own engine's lines
    rv = get_adapter("vllm").parse_log_file(p)
    rs = get_adapter("sglang").parse_log_file(p)
    assert rv.kv_cache_tokens == 973_168 and rv.weights_gib == 8.49
    assert rs.kv_cache_tokens == 1_914_535 and rs.weights_gib == 8.74


@pytest.mark.timing  # a wall-clock bound (bench/parse_big_log.py times it)
def test_big_log_streams_fast(shared_data: Path, tmp_path: Path) -> None:
    src = (shared_data / "vllm-h200" / "vllm-0.25.0-fp8marlin.log").read_bytes()
    p = tmp_path / "big.log"
    copies = (10 * 1024 * 1024) // len(src) + 1  # ~10 MB here; bench/parse_big_log.py times 50 MB
    p.write_bytes(src * copies)
    t0 = time.perf_counter()
    r = get_adapter("vllm").parse_log_file(p)
    elapsed = time.perf_counter() - t0
    assert r.kv_cache_tokens == 973_168
    assert [(e.kind, e.line_no) for e in r.fallbacks] == [("fp8_marlin", 29)]  # repeats counted once
    assert r.extra["lines_read"] == copies * src.count(b"\n")
    assert elapsed < 2.0, f"10 MB took {elapsed:.2f} s"


def test_line_sources_agree_with_file_scan(shared_data: Path) -> None:
    path = shared_data / "sglang-h200" / "sglang-0.5.16-fp8marlin.log"
    a = get_adapter("sglang").parse_log_file(path)
    b = get_adapter("sglang").parse_log(path.read_bytes().split(b"\n"))
    assert (a.extra.pop("lines_read"), b.extra.pop("lines_read")) == (220, 221)  # split() adds an empty last item
    blank = {"source": None, "detection": {}, "engine_evidence": []}
    assert a.to_dict() | blank == b.to_dict() | blank
    assert a.detection["method"] == "given" and a.detection["scores"]["sglang"] > 0
    assert [(e.kind, e.line_no) for e in b.fallbacks] == [("fp8_marlin", 19)]
