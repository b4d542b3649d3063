"""Issue #43: absurd sizes are refused before any request, with the bound and where it comes from; the study key
and the command-line flag share one rule (quantrack.study's setting, checked by quantrack.settings)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from quantrack.cli import main

REPO = Path(__file__).resolve().parents[2]
CPU_STUDY = REPO / "examples" / "cpu-smollm2.toml"
CLOSED = "http://127.0.0.1:1"  # nothing listens: a request would fail differently


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.splitlines()


FLAGS = [
    ("sweep --concurrency 1e9", ["sweep", "--engine", "llamacpp", "--base-url", CLOSED, "--concurrency", "1000000000"],
     "--concurrency: expected a list of integers in 1..28232 (one connection per request in flight"),
    ("sweep --requests 2e6", ["sweep", "--engine", "llamacpp", "--base-url", CLOSED, "--concurrency", "1",
                              "--requests", "2000000"],
     "--requests: expected an integer in 0..1000000 (every prompt of a level is built before its first request)"),
    ("sweep --rate 1e-300", ["sweep", "--engine", "llamacpp", "--base-url", CLOSED, "--rate", "1e-300"],
     "--rate: expected a list of numbers in [0.001, 1000000] (slower than one request per 1000 s"),
    ("serve --parallel 1e9", ["serve", "--engine", "llamacpp", "--model", "x.gguf", "--arm", "f16",
                              "--parallel", "1000000000", "--dry-run"],
     "--parallel: expected an integer in 1..28232 (a slot serves one request in flight"),
    ("eval kl --tokens 1e9", ["eval", "kl", "--engine", "llamacpp", "--baseline", CLOSED, "--candidate", CLOSED,
                              "--tokens", "1000000000"],
     "--tokens: expected an integer in 1..1000000 (the top-k log-probabilities of both sides"),
    ("plan --tp 1e6", ["plan", "--model", "SmolLM2-135M", "--tp", "1000000"],
     "--tp: expected an integer in 1..72 (the GPUs of one NVLink domain, GB200 NVL72)"),
    ("logs reconcile --max-num-seqs 1e12", ["logs", "reconcile", "--max-num-seqs", "1000000000000", "x.log"],
     "1000000000000 is not in the range 1<=x<=2147483647"),
]


@pytest.mark.parametrize(("argv", "words"), [pytest.param(a, w, id=i) for i, a, w in FLAGS])
def test_an_absurd_flag_is_refused_with_its_bound(argv: list[str], words: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(argv, capsys)
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert "127.0.0.1:1" not in err[0]  # refused before any request: no connection error


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = CPU_STUDY.read_text(encoding="utf-8")
    assert old in text
    study = tmp_path / "study.toml"
    study.write_text(text.replace(old, new, 1), encoding="utf-8")
    return study


KEYS = [
    ("[sweep] concurrency", "concurrency = [1, 2, 4]", "concurrency = [1, 1000000000]",
     "[sweep] concurrency: expected a list of integers in 1..28232"),
    ("[sweep] requests_per_level", "requests_per_level = 8", "requests_per_level = 2000000",
     "[sweep] requests_per_level: expected an integer in 0..1000000"),
    ("[sweep] rates", "requests_per_level = 8", "requests_per_level = 8\nrates = [1e-300]",
     "[sweep] rates: expected a list of numbers in [0.001, 1000000]"),
    ("parallel", "parallel = 4", "parallel = 1000000000", "parallel: expected an integer in 1..28232"),
    ("parallel above context_len", "parallel = 4", "parallel = 5000",
     "parallel = 5,000: more slots than context_len = 4,096 tokens"),
    ("[gpu] count", 'name = "x86-cpu"', 'name = "x86-cpu"\ncount = 1000000', "[gpu] count: expected an integer in 1..72"),
    ("[eval] kl tokens", "kl = { tokens = 400,", "kl = { tokens = 1000000000,",
     "[eval] kl.tokens: expected an integer in 1..1000000"),
]


@pytest.mark.parametrize(("old", "new", "words"), [pytest.param(o, n, w, id=i) for i, o, n, w in KEYS])
def test_an_absurd_study_key_is_refused_by_preflight(old: str, new: str, words: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    study = _edited(tmp_path, old, new)
    code, err = _run(["preflight", "--study", str(study)], capsys)
    assert code == 2 and len(err) == 1 and words in err[0], err


def test_the_bounds_themselves_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.settings import convert
    from quantrack.study import GpuSpec, SweepSpec

    assert convert(SweepSpec, "concurrency", [28232]) == (28232,)
    assert convert(SweepSpec, "requests_per_level", 1_000_000) == 1_000_000
    assert convert(SweepSpec, "rates", [0.001]) == (0.001,)
    assert convert(GpuSpec, "count", 72) == 72
    shutil.copyfile(CPU_STUDY, tmp_path / "ok.toml")
    code, err = _run(["preflight", "--study", str(tmp_path / "ok.toml")], capsys)
    assert code != 2 or not any("expected" in e for e in err)
