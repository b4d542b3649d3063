"""Command-line options built from the study schema: the flag and the study key accept the same values, refuse
the same ones with one line, and the engines' benchmark spellings are aliases (quantrack.cli.options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from quantrack.cli import main
from quantrack.errors import BadInput
from quantrack.settings import convert
from quantrack.study import EngineSpec, EvalSpec, GpuSpec, LatencySpec, Study, SweepSpec


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    return int(code or 0), capsys.readouterr().err


SERVE = ["serve", "--engine", "vllm", "--model", "org/model", "--arm", "fp8", "--dry-run"]


@pytest.mark.parametrize("args, message", [
    ([*SERVE, "--port", "70000"], "--port: expected an integer in 0..65535, got 70000"),
    ([*SERVE, "--port", "-1"], "--port: expected an integer in 0..65535, got -1"),
    ([*SERVE, "--parallel", "0"], "--parallel: expected an integer in 1..28232 (a slot serves one request in flight: one connection per request in flight: the default Linux ephemeral port range 32768-60999), got 0"),
    ([*SERVE, "--tp", "0"], "--tp: expected an integer in 1..72 (the GPUs of one NVLink domain, GB200 NVL72), got 0"),
    ([*SERVE, "--context-len", "-4"], "--context-len: expected an integer ≥ 1, got -4"),
    ([*SERVE, "--timeout", "nan"], "--timeout: expected a finite number > 0, got nan"),
    (["preflight", "--gpu", "H100", "--arm", "fp8", "--tp", "0"], "--tp: expected an integer in 1..72 (the GPUs of one NVLink domain, GB200 NVL72), got 0"),
    (["sweep", "--engine", "vllm", "--base-url", "http://127.0.0.1:9", "--concurrency", "1,x"],
     '--concurrency: expected a list of integers in 1..28232 (one connection per request in flight: the default Linux ephemeral port range 32768-60999), got "1,x"'),
    (["sweep", "--engine", "vllm", "--base-url", "http://127.0.0.1:9", "--requests", "-3"],
     "--requests: expected an integer in 0..1000000 (every prompt of a level is built before its first request), got -3"),
    (["sweep", "--engine", "vllm", "--base-url", "http://127.0.0.1:9", "--num-prompts", "100"],
     "--num-prompts (vllm bench serve / sglang.bench_serving) counts the requests of the whole run"),
    (["latency", "--engine", "vllm", "--base-url", "http://127.0.0.1:9", "--num-iters", "0"],
     "--iterations: expected an integer ≥ 1, got 0"),
    (["eval", "--base-url", "http://127.0.0.1:9", "--style", "bogus"],
     '--style: expected one of vllm, lm-eval, got "bogus"'),
    (["eval", "--base-url", "http://127.0.0.1:9", "--concurrency", "0"],
     "--concurrency: expected an integer in 1..1024, got 0"),
    (["eval", "kl", "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9", "--top-k", "500"],
     "--top-k: expected an integer in 1..100, got 500"),
])
def test_bad_flags_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, *args)
    assert code == 2
    assert err.startswith(f"quantrack: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_serve_port_in_range_reaches_the_launch_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`--port 70000` used to be accepted (and the server listened on 70000 - 65536 = 4464)."""
    code = main([*SERVE, "--port", "65535"])
    assert code is None and "--port 65535" in capsys.readouterr().out


def _params(command: click.Command, args: list[str]) -> dict[str, Any]:
    return command.make_context(command.name or "", args).params


def test_benchmark_spellings_are_aliases() -> None:
    from quantrack.cli.latency import latency
    from quantrack.cli.sweep import sweep

    lat = _params(latency, ["--input-len", "512", "--output-len", "64", "--num-iters", "7", "--num-iters-warmup", "3"])
    assert (lat["input_tokens"], lat["output_tokens"], lat["iterations"], lat["warmup"]) == (512, 64, 7, 3)
    sw = _params(sweep, ["--random-input-len", "256", "--output-len", "32", "--concurrency", "1,8"])
    assert (sw["input_tokens"], sw["output_tokens"], sw["concurrency"]) == (256, 32, (1, 8))
    # no --concurrency: 1,4,16,64 unless --rate levels are given (quantrack.cli.sweep resolves it; the help says so)
    assert _params(sweep, [])["concurrency"] is None and _params(sweep, [])["requests_per_level"] == 0
    assert "[default: 1,4,16,64" in " ".join(sweep.get_help(click.Context(sweep)).split())
    assert _params(sweep, ["--request-rate", "2,4"])["rates"] == (2.0, 4.0)


# (settings class, field, the command-line flag, values both must refuse, a value both accept)
SAME_RULE = [
    (EngineSpec, "port", "--port", [70000, -1], 8000),
    (EngineSpec, "ready_timeout_s", "--timeout", [-5.0, float("nan")], 30.0),
    (GpuSpec, "count", "--tp", [0], 2),
    (GpuSpec, "util", "--util", [0.0, 1.5], 0.45),
    (Study, "context_len", "--context-len", [0], 8192),
    (Study, "parallel", "--parallel", [0], 4),
    (LatencySpec, "output_tokens", "--output-tokens", [1], 2),
    (SweepSpec, "requests_per_level", "--requests", [-3], 0),
    (EvalSpec, "num_questions", "--num-questions", [0, 8793], 8792),
    (EvalSpec, "style", "--style", ["bogus"], "lm-eval"),
    (EvalSpec, "kl_top_k", "--top-k", [0, 500], 100),
]


@pytest.mark.parametrize("cls, field, flag, bad, good", SAME_RULE, ids=[r[2] for r in SAME_RULE])
def test_study_key_and_flag_share_one_rule(cls: type, field: str, flag: str, bad: list[Any], good: Any) -> None:
    assert convert(cls, field, good, "[t] k") == good == convert(cls, field, good)
    for value in bad:
        with pytest.raises(BadInput) as as_key:
            convert(cls, field, value, "[t] k")
        with pytest.raises(BadInput) as as_flag:
            convert(cls, field, value)
        assert str(as_flag.value).startswith(f"{flag}: ")
        assert str(as_key.value).removeprefix("[t] k: ") == str(as_flag.value).removeprefix(f"{flag}: ")


@pytest.mark.parametrize("module, attr, args", [
    ("latency", "latency", []), ("sweep", "sweep", []), ("eval", "eval_group", []),
    ("eval_kl", "kl", ["--baseline", "http://a:1", "--candidate", "http://b:1"]), ("serve", "serve", ["--arm", "x"]),
    ("preflight", "preflight", []),
])
def test_every_schema_option_reaches_its_command(module: str, attr: str, args: list[str]) -> None:
    """The options' Python names are the command function's parameters (a renamed flag cannot drop a value)."""
    import importlib
    import inspect

    cmd = getattr(importlib.import_module(f"quantrack.cli.{module}"), attr)
    params = _params(cmd, args)
    sig = inspect.signature(cmd.callback)
    if "ctx" in sig.parameters:
        params["ctx"] = None
    sig.bind(**params)
