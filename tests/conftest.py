"""Shared fixtures: every test gets its own temporary MLflow store; paths to shared real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (tests and CI only; the package never reads it)
SHARED = Path(os.environ.get("QUANTRACK_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test writes into the repository's mlruns/: each gets its own store and cache dir."""
    store = tmp_path_factory.mktemp("mlruns")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(store / "spool"))
    return store


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
