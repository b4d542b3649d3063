"""The bundled llama.cpp server reads $LLAMA_ARG_THREADS as llama-server does (llama.cpp common/arg.cpp: -t/--threads
.set_env("LLAMA_ARG_THREADS")): -t given wins, the variable is logged when it decides, a bad value is one line, exit 2.
The test suite sets it to 1 (tests/conftest.py): with threads = cores, one other CPU-bound process slowed llama.cpp's
batch-1 TPOT 12x on two cores (bench/llamacpp_contention.py, docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from quantrack.engines.xllamacpp_server import THREADS_ENV, build_parser, threads_from_env


def _args(*argv: str):
    return build_parser().parse_args(["-m", "model.gguf", *argv])


def test_env_sets_threads_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "1")
    a = _args()
    assert threads_from_env(a) == "quantrack-xllamacpp: threads 1 (from $LLAMA_ARG_THREADS)"
    assert a.threads == 1


def test_flag_wins_over_env_and_no_env_leaves_llamacpp_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "1")
    a = _args("-t", "2")
    assert threads_from_env(a) is None and a.threads == 2
    monkeypatch.delenv(THREADS_ENV)
    a = _args()
    assert threads_from_env(a) is None and a.threads is None


@pytest.mark.parametrize("bad", ["two", "0", "-1", "1.5"])
def test_bad_env_value_is_one_line_exit_2(bad: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(THREADS_ENV, bad)
    with pytest.raises(SystemExit) as exc:
        threads_from_env(_args())
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LLAMA_ARG_THREADS" in err and "Traceback" not in err
