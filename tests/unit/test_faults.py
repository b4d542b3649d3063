"""Fault paths of the client, latency and sweep against a local fixture SSE server (127.0.0.1).

The fixture (tests/sse_fixture.py) exercises timing and error handling only; it is not
evidence that any engine works.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_fixture import FixtureServer

from quantrack.cli import main
from quantrack.errors import BadInput, MeasurementError, NotFound
from quantrack.measure import client as client_mod
from quantrack.measure.latency import measure_latency
from quantrack.measure.sweep import run_sweep

KEY = "sk-test-should-never-appear-0123"
SMALL = {"input_tokens": 8, "output_tokens": 6, "warmup": 0, "iterations": 2}


@pytest.fixture(scope="module")
def server() -> Iterator[FixtureServer]:
    srv = FixtureServer(interval_s=0.002, slow_s=1.5).start()
    yield srv
    srv.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ok_stream_timing(server: FixtureServer) -> None:
    r = measure_latency(server.base_url + "/ok", "llamacpp", **SMALL)
    assert r.n_failed == 0 and len(r.samples) == 2 and r.prompt_exact
    for s in r.samples:
        assert s.completion_tokens == 6 and s.prompt_tokens == 8
        # chunk k leaves the server no earlier than (k + 1) x 2 ms after the request arrived
        assert s.ttft is not None and s.ttft >= 0.002
        assert s.e2e is not None and s.e2e >= 6 * 0.002
        assert s.tpot == pytest.approx((s.e2e - s.ttft) / 5)
    sent = server.requests[-1]["body"]
    assert sent["ignore_eos"] is True and len(sent["prompt"]) == 8 and sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("short", "short: server returned 3 of 6 tokens (finish_reason=length)"),
        ("long", "server ignored max_tokens: returned 9 > 6 tokens"),
        ("cut", "stream cut mid-way"),
        ("malformed", "malformed SSE line: 'this is not an SSE line'"),
        ("badjson", "malformed SSE data (not JSON)"),
        ("http500", 'HTTP 500: {"error": {"code": 500, "message": "internal fixture error"}}'),
        ("http400", "HTTP 400"),
    ],
)
def test_faulty_samples_fail_with_reason(server: FixtureServer, mode: str, reason: str) -> None:
    r = measure_latency(server.base_url + "/" + mode, "llamacpp", **SMALL)
    assert r.n_failed == 2 and not r.ok_samples
    assert all(s.error is not None and s.error.startswith(reason) for s in r.samples), r.failure_reasons()
    assert r.to_row()["tpot_ms"] is None  # nothing averaged in


def test_timeout(server: FixtureServer) -> None:
    r = measure_latency(server.base_url + "/slow", "llamacpp", input_tokens=4, output_tokens=2, warmup=0, iterations=1, timeout=0.3)
    assert r.failure_reasons() == {"timeout (read)": 1}


def test_no_usage_is_noted_not_failed(server: FixtureServer) -> None:
    r = measure_latency(server.base_url + "/nousage", "llamacpp", **SMALL)
    assert r.n_failed == 0 and r.notes() == {"server sent no usage; output tokens counted from chunks": 2}


def test_connection_refused_and_dns() -> None:
    with pytest.raises(MeasurementError, match=r"GET http://127\.0\.0\.1:\d+/v1/models: connection refused"):
        measure_latency(f"http://127.0.0.1:{_free_port()}", "vllm", **SMALL)
    with pytest.raises(MeasurementError, match="DNS failure"):
        measure_latency("http://no-such-host.invalid:8000", "vllm", **SMALL)


def test_bad_input_messages() -> None:
    with pytest.raises(BadInput, match=r"^--iterations must be >= 1 \(got -3\)$"):
        measure_latency("http://127.0.0.1:1", "vllm", input_tokens=8, output_tokens=4, warmup=0, iterations=-3)
    with pytest.raises(BadInput, match=r"^--base-url 'localhost:8000' must look like http://HOST:PORT$"):
        measure_latency("localhost:8000", "vllm")
    with pytest.raises(NotFound, match=r"^unknown engine 'vlm' \(did you mean 'vllm'\?\)$"):
        measure_latency("http://127.0.0.1:1", "vlm")


def test_cli_failures_exit_1_one_line(server: FixtureServer, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["latency", "--engine", "llamacpp", "--base-url", server.base_url + "/short", "--input-tokens", "8", "--output-tokens", "6", "--warmup", "0", "--iterations", "2"]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["quantrack: error: 2 of 2 requests failed: short: server returned 3 of 6 tokens (finish_reason=length) (x2) (use --allow-failures to accept)"]
    assert main([*args, "--allow-failures"]) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--warmup", "-1"], "quantrack: error: --warmup: expected an integer ≥ 0, got -1"),
        (["--output-tokens", "1"], "quantrack: error: --output-tokens: expected an integer ≥ 2, got 1"),
    ],
)
def test_cli_bad_flags_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["latency", "--engine", "vllm", "--base-url", "http://127.0.0.1:1", *args])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_api_key_sent_never_printed_or_saved(server: FixtureServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    save = tmp_path / "row.json"
    # the /auth fixture answers 401 and echoes the Authorization header back in its error body
    with pytest.raises(SystemExit) as exc:
        main(["latency", "--engine", "llamacpp", "--base-url", server.base_url + "/auth", "--input-tokens", "4", "--output-tokens", "2", "--warmup", "0", "--iterations", "1", "--save", str(save)])
    assert exc.value.code == 1
    assert server.requests[-1]["auth"] == f"Bearer {KEY}"
    out = capsys.readouterr()
    text = out.out + out.err + save.read_text()
    assert "HTTP 401" in text and "***" in text
    assert KEY not in text


def test_ctrl_c_keeps_measured_and_saves(server: FixtureServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = client_mod.HttpStreamClient.stream
    calls = {"n": 0}

    def stream(self: client_mod.HttpStreamClient, *a: object, **k: object) -> client_mod.StreamSample:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(client_mod.HttpStreamClient, "stream", stream)
    save = tmp_path / "part.json"
    with pytest.raises(SystemExit) as exc:
        main(["latency", "--engine", "llamacpp", "--base-url", server.base_url + "/ok", "--input-tokens", "4", "--output-tokens", "3", "--warmup", "1", "--iterations", "5", "--save", str(save)])
    assert exc.value.code == 130
    row = json.loads(save.read_text())
    assert row["interrupted"] is True and row["n_ok"] == 1 and len(row["samples"]) == 1
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.timing  # a throughput ratio of wall-clock rates
def test_sweep_keeps_requests_in_flight(server: FixtureServer) -> None:
    res = run_sweep(server.base_url + "/ok", "llamacpp", [1, 4], requests_per_level=8, input_tokens=4, output_tokens=20, warmup=0)
    r1, r4 = res.rows
    assert r1["n_ok"] == r4["n_ok"] == 8 and res.n_failed == 0
    # the fixture serves each request in its own thread at a fixed cadence: 4 in flight ~ 4x throughput
    assert r4["output_tok_s"] > 2.0 * r1["output_tok_s"]
    assert r1["output_tok_s"] == pytest.approx(r1["output_tokens"] / r1["wall_s"])


def test_sweep_counts_failures(server: FixtureServer) -> None:
    res = run_sweep(server.base_url + "/cut", "llamacpp", [2], requests_per_level=4, input_tokens=4, output_tokens=6, warmup=0)
    row = res.rows[0]
    assert row["n_failed"] == 4 and row["output_tok_s"] is None
    assert all(k.startswith("stream cut mid-way") for k in row["failures"])
