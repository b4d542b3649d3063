"""The scripts users run follow the CLI's contract (issue #43): bench/parity_vllm_bench.py and
scripts/calibrate_kv.py end every bad input in one line on stderr and exit 2 — no traceback, no hang, nothing
created — and never lose a measurement already made.

Each case runs the script as a user does (a subprocess, ``python SCRIPT ...``), on paths that fail before any
server or GPU is needed: no network, no engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "parity_vllm_bench.py"
CALIBRATE = ROOT / "scripts" / "calibrate_kv.py"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens here


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def script(path: Path, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, str(path), *argv], capture_output=True, text=True, timeout=60, env=e,
                          cwd=cwd, check=False)


def one_line_exit_2(r: subprocess.CompletedProcess[str], prefix: str, want: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"{prefix}: error: "), lines[0]
    assert want in lines[0], lines[0]
    assert r.stdout == ""


def vllm_result(**over: object) -> str:
    base = {"output_throughput": 100.0, "median_ttft_ms": 20.0, "median_tpot_ms": 5.0, "duration": 2.0,
            "completed": 16, "max_concurrency": 1}
    return json.dumps({**base, **over})


# ----------------------------------------------------------------------------------- bench/parity_vllm_bench.py

def _vj(tmp: Path, text: str) -> list[str]:
    (tmp / "r.json").write_text(text)
    return ["--base-url", CLOSED, "--reference", "vllm-json", "--concurrency", "1", "--vllm-json", str(tmp / "r.json")]


def _vj_special(tmp: Path, make: Callable[[Path], None]) -> list[str]:
    p = tmp / "r.json"
    make(p)
    return ["--base-url", CLOSED, "--reference", "vllm-json", "--concurrency", "1", "--vllm-json", str(p)]


def _json_target(tmp: Path, make: Callable[[Path], None] | None, name: str = "out.json") -> list[str]:
    p = tmp / name
    if make is not None:
        make(p)
    return ["--base-url", CLOSED, "--json", str(p)]


BENCH_CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "no options": (lambda t: [], "give --base-url URL or --llamacpp"),
    "unknown option": (lambda t: ["--base-url", CLOSED, "--turbo"], "unrecognized arguments: --turbo"),
    "requests not a number": (lambda t: ["--requests", "many"], "argument --requests: invalid int value: 'many'"),
    "requests 0": (lambda t: ["--base-url", CLOSED, "--requests", "0"], "--requests must be >= 1 (got 0)"),
    "requests 2,000,000": (lambda t: ["--base-url", CLOSED, "--requests", "2000000"],
                           "--requests must be at most 1,000,000 (got 2,000,000)"),
    "compare-requests -1": (lambda t: ["--base-url", CLOSED, "--compare-requests", "-1"], "must be >= 0"),
    "concurrency empty": (lambda t: ["--base-url", CLOSED, "--concurrency", ""], "expected comma-separated integers"),
    "concurrency negative": (lambda t: ["--base-url", CLOSED, "--concurrency", "1,-2"], "levels must be >= 1"),
    "concurrency 10^9": (lambda t: ["--base-url", CLOSED, "--concurrency", "1000000000"], "at most 28,232"),
    "concurrency twice": (lambda t: ["--base-url", CLOSED, "--concurrency", "2,4,2"], "a level is given twice"),
    "tolerance NaN": (lambda t: ["--base-url", CLOSED, "--hit-rate-tolerance", "nan"], "must be in [0, 1] (got nan)"),
    "tolerance inf": (lambda t: ["--base-url", CLOSED, "--hit-rate-tolerance", "inf"], "must be in [0, 1] (got inf)"),
    "output tokens 1": (lambda t: ["--base-url", CLOSED, "--output-tokens", "1"], "TPOT needs two"),
    "input tokens 10^9": (lambda t: ["--base-url", CLOSED, "--input-tokens", "1000000000"], "at most 1,048,576"),
    "rounds 0": (lambda t: ["--base-url", CLOSED, "--rounds", "0"], "--rounds must be >= 1"),
    "parallel 0": (lambda t: ["--llamacpp", "--parallel", "0"], "--parallel must be >= 1"),
    "seed -1": (lambda t: ["--base-url", CLOSED, "--seed", "-1"], "--seed must be in 0..2^32-1 (got -1)"),
    "seed 2^40": (lambda t: ["--base-url", CLOSED, "--seed", str(2**40)], "--seed must be in 0..2^32-1"),
    "engine unknown": (lambda t: ["--base-url", CLOSED, "--engine", "tgi"], "invalid choice: 'tgi'"),
    "reference unknown": (lambda t: ["--base-url", CLOSED, "--reference", "guidellm"], "invalid choice: 'guidellm'"),
    "base-url not a URL": (lambda t: ["--base-url", "localhost"], "expected http://HOST:PORT"),
    "base-url bad port": (lambda t: ["--base-url", "http://127.0.0.1:99999"], "--base-url 'http://127.0.0.1:99999'"),
    "base-url and --llamacpp": (lambda t: ["--base-url", CLOSED, "--llamacpp"], "not both"),
    "reference vllm without --model": (lambda t: ["--base-url", CLOSED, "--reference", "vllm"], "needs --model"),
    "reference vllm, no vllm in PATH": (lambda t: ["--base-url", CLOSED, "--reference", "vllm", "--model", "m"],
                                        "no `vllm` in PATH"),
    "vllm-json without its reference": (lambda t: ["--base-url", CLOSED, "--vllm-json", "x.json"],
                                        "--vllm-json applies to --reference vllm-json"),
    "vllm-json: one file for two levels": (
        lambda t: ["--base-url", CLOSED, "--reference", "vllm-json", "--concurrency", "1,2", "--vllm-json", "a"],
        "one --vllm-json file per level (2), got 1"),
    "vllm-json missing": (lambda t: _vj_special(t, lambda p: None), "r.json: file not found"),
    "vllm-json a folder": (lambda t: _vj_special(t, lambda p: p.mkdir()), "is not a regular file (a folder)"),
    "vllm-json a FIFO": (lambda t: _vj_special(t, os.mkfifo), "is not a regular file (a FIFO)"),
    "vllm-json /dev/zero": (lambda t: _vj_special(t, lambda p: p.symlink_to("/dev/zero")),
                            "is not a regular file (a character device)"),
    "vllm-json not JSON": (lambda t: _vj(t, "output_throughput: 1"), "not JSON (Expecting value)"),
    "vllm-json nested 100,000 deep": (lambda t: _vj(t, "[" * 100_000 + "]" * 100_000), "nested too deeply"),
    "vllm-json NaN throughput": (lambda t: _vj(t, vllm_result().replace("100.0", "NaN")), "NaN is not a number"),
    "vllm-json 1e400 duration": (lambda t: _vj(t, vllm_result().replace("2.0", "1e400")),
                                 "duration = inf is not a non-negative finite figure"),
    "vllm-json a list": (lambda t: _vj(t, "[1, 2]"), "not a JSON object"),
    "vllm-json missing keys": (lambda t: _vj(t, '{"duration": 1}'), "missing output_throughput"),
    "vllm-json string throughput": (lambda t: _vj(t, vllm_result(output_throughput="fast")),
                                    "missing output_throughput"),
    "vllm-json boolean TTFT": (lambda t: _vj(t, vllm_result(median_ttft_ms=True)), "missing median_ttft_ms"),
    "vllm-json negative TPOT": (lambda t: _vj(t, vllm_result(median_tpot_ms=-5)), "median_tpot_ms = -5"),
    "vllm-json zero duration": (lambda t: _vj(t, vllm_result(duration=0)), "duration = 0"),
    "vllm-json not UTF-8": (lambda t: _vj_special(t, lambda p: p.write_bytes(b"\xff\xfe\x00{")), "not JSON"),
    "--json a folder": (lambda t: _json_target(t, lambda p: p.mkdir()), "is a folder, not a file"),
    "--json in a missing folder": (lambda t: ["--base-url", CLOSED, "--json", str(t / "no" / "r.json")],
                                   "does not exist"),
    "--json a FIFO": (lambda t: _json_target(t, os.mkfifo), "is a FIFO; give a regular file"),
    "--json a link to a file": (lambda t: _json_target(t, lambda p: p.symlink_to(t / "target.json")),
                                "symbolic link"),
}


@pytest.mark.parametrize("case", list(BENCH_CASES))
def test_parity_bench_bad_input(tmp_path: Path, case: str) -> None:
    build, want = BENCH_CASES[case]
    (tmp_path / "target.json").write_text("kept\n")
    argv = build(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = script(BENCH, argv, tmp_path, PATH="/nonexistent")
    one_line_exit_2(r, "parity_vllm_bench", want)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created
    assert (tmp_path / "target.json").read_text() == "kept\n"


def test_parity_bench_keeps_what_it_measured_when_the_server_goes(tmp_path: Path) -> None:
    """A failure mid-run (here the server is not there at the first level): one line, exit 1, and the result so
    far (the levels finished: none here, and why it stopped) is in --json, not lost."""
    out = tmp_path / "r.json"
    r = script(BENCH, ["--base-url", closed_port(), "--concurrency", "1", "--requests", "1", "--json", str(out)],
               tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert "stopped after 0 finished level(s)" in r.stderr and f"the result so far is in {out}" in r.stderr
    saved = json.loads(out.read_text())
    assert saved["levels"] == [] and "connection refused" in saved["stopped_by"]


def test_parity_bench_result_goes_somewhere_safe_when_json_fails(tmp_path: Path) -> None:
    """The --json write fails after measuring (the folder went away): the result goes to a fresh temporary file,
    named in the one line on stderr (run in-process, the measurement given as a finished result)."""
    spec = importlib.util.spec_from_file_location("parity_vllm_bench", BENCH)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = {"levels": [{"concurrency": 1, "ratio_output_tok_s": 0.98}]}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    import tempfile

    tempfile.tempdir = None
    try:
        with pytest.raises(SystemExit) as exc:
            bench.save_result(res, tmp_path / "gone" / "r.json")
    finally:
        tempfile.tempdir = None
        if old is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = old
    assert exc.value.code == 2
    kept = list(tmp.glob("parity_vllm_bench-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == res


# ---------------------------------------------------------------------------------------- scripts/calibrate_kv.py

def _model(tmp: Path, cfg: str | None = '{"model_type": "qwen2"}') -> Path:
    d = tmp / "model"
    d.mkdir()
    if cfg is not None:
        (d / "config.json").write_text(cfg)
    return d


def _cal(tmp: Path, *extra: str, model: Path | None = None) -> list[str]:
    m = model if model is not None else _model(tmp)
    return ["--model", str(m), "--out", str(tmp / "out"), *extra]


def _finish(tmp: Path, make: Callable[[Path], None]) -> list[str]:
    out = tmp / "out"
    out.mkdir()
    make(out)
    return ["--model", str(tmp / "model"), "--out", str(out), "--finish"]


def _cfg(out: Path, text: str = '{"model_type": "qwen2"}') -> None:
    (out / "config.json").write_text(text)


def _st(out: Path, raw: bytes) -> None:
    _cfg(out)
    (out / "model.safetensors").write_bytes(raw)


def _fifo_config(t: Path) -> list[str]:
    d = _model(t, None)
    os.mkfifo(d / "config.json")
    return _cal(t, model=d)


def _fifo_st(out: Path) -> None:
    _cfg(out)
    os.mkfifo(out / "model.safetensors")


NO_SCALES = json.dumps({"model.layers.0.self_attn.k_proj.weight": {"dtype": "F32", "shape": [1],
                                                                    "data_offsets": [0, 4]}}).encode()

CAL_CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "no options": (lambda t: [], "the following arguments are required: --model, --out"),
    "no --out": (lambda t: ["--model", str(_model(t))], "the following arguments are required: --out"),
    "unknown option": (lambda t: _cal(t, "--fast"), "unrecognized arguments: --fast"),
    "samples not a number": (lambda t: _cal(t, "--samples", "all"), "argument --samples: invalid int value"),
    "samples 0": (lambda t: _cal(t, "--samples", "0"), "--samples must be between 1 and 7473"),
    "samples 10^9": (lambda t: _cal(t, "--samples", "1000000000"), "--samples must be between 1 and 7473"),
    "max-seq-len 0": (lambda t: _cal(t, "--max-seq-len", "0"), "--max-seq-len must be between 1 and 1,048,576"),
    "max-seq-len 10^12": (lambda t: _cal(t, "--max-seq-len", str(10**12)), "--max-seq-len must be between"),
    "strategy unknown": (lambda t: _cal(t, "--strategy", "channel"), "invalid choice: 'channel'"),
    "out exists": (lambda t: [*_cal(t)[:3], str(t)], "exists; give a new directory"),
    "out a dangling link": (lambda t: [*_cal(t)[:3], str(_dangling(t))], "exists; give a new directory"),
    "out in a missing folder": (lambda t: [*_cal(t)[:3], str(t / "no" / "out")], "does not exist"),
    "model not a folder": (lambda t: ["--model", "Qwen/Qwen2.5-1.5B", "--out", str(t / "out")],
                           "not a local checkpoint directory"),
    "model without config.json": (lambda t: _cal(t, model=_model(t, None)), "config.json: file not found"),
    "model config.json a FIFO": (_fifo_config, "config.json is not a regular file (a FIFO)"),
    "model config.json not JSON": (lambda t: _cal(t, model=_model(t, "{model_type")), "is not JSON"),
    "model config.json a list": (lambda t: _cal(t, model=_model(t, "[]")), "is not a JSON object"),
    "finish: nothing saved": (lambda t: _finish(t, lambda o: None), "holds no saved checkpoint"),
    "finish: config.json not JSON": (lambda t: _finish(t, lambda o: _cfg(o, "{")), "is not JSON"),
    "finish: config nested 100,000 deep": (lambda t: _finish(t, lambda o: _cfg(o, "[" * 10**5 + "]" * 10**5)),
                                           "is not JSON"),
    "finish: no scale tensors": (lambda t: _finish(t, lambda o: _st(o, struct.pack("<Q", len(NO_SCALES))
                                                                    + NO_SCALES + b"\0" * 4)),
                                 "no self_attn.k_scale / v_scale tensors were saved"),
    "finish: model.safetensors a FIFO": (lambda t: _finish(t, _fifo_st), "is not a regular file (a FIFO)"),
    "finish: model.safetensors cut short": (lambda t: _finish(t, lambda o: _st(o, b"\x01\x02")),
                                            "not a readable safetensors file"),
    "finish: header length 2^63": (lambda t: _finish(t, lambda o: _st(o, struct.pack("<Q", 2**63) + b"{}")),
                                   "not a readable safetensors file"),
}


def _dangling(t: Path) -> Path:
    p = t / "link"
    p.symlink_to(t / "nowhere")
    return p


@pytest.mark.parametrize("case", list(CAL_CASES))
def test_calibrate_kv_bad_input(tmp_path: Path, case: str) -> None:
    build, want = CAL_CASES[case]
    argv = build(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    r = script(CALIBRATE, argv, tmp_path)
    one_line_exit_2(r, "calibrate_kv", want)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="the [calibrate] extra is installed")
def test_calibrate_kv_without_its_extra_says_so_before_loading(tmp_path: Path) -> None:
    r = script(CALIBRATE, _cal(tmp_path, "--samples", "4"), tmp_path)
    one_line_exit_2(r, "calibrate_kv", "needs the [calibrate] extra (pip install -e '.[calibrate]')")
    assert not (tmp_path / "out").exists()


def test_calibrate_kv_keeps_the_checkpoint_when_a_side_file_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """After the (GPU) calibration saved its checkpoint, a failure writing the side files says where the checkpoint
    is and that --finish completes it (exit 1), and leaves it there. The GPU step is replaced by writing a saved
    checkpoint without scale tensors (what made the side files fail on the H200 before the bf16 reader)."""
    spec = importlib.util.spec_from_file_location("calibrate_kv", CALIBRATE)
    assert spec and spec.loader
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)

    def saved(a: object, texts: object, scheme: object, out: Path) -> None:
        out.mkdir()
        _st(out, struct.pack("<Q", len(NO_SCALES)) + NO_SCALES + b"\0" * 4)

    monkeypatch.setattr(cal, "_calibrate", saved)
    monkeypatch.setattr(cal, "check_extra", lambda: None)
    rc = cal.main(_cal(tmp_path, "--samples", "2"))
    err = capsys.readouterr().err
    assert rc == 1 and len(err.splitlines()) == 1
    assert f"the checkpoint is in {tmp_path / 'out'}: fix it and rerun with --finish" in err
    assert (tmp_path / "out" / "model.safetensors").is_file()
