"""Shared fixtures: every test gets its own temporary MLflow store; the real engine logs, results and GSM8K.

The real data is vendored in ``tests/data/real/`` (provenance and SHA-256 in its README): a clone of the
repository alone runs every test, with or without a ``../shared`` folder beside it."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL_DATA = REPO / "tests" / "data" / "real"


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test writes into the repository's mlruns/: each gets its own store and cache dir."""
    store = tmp_path_factory.mktemp("mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(store / "spool"))
    return store


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
