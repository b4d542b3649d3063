"""The git state tag (quantrack.git_revision): dirty for a change to any tracked file of the repository."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from quantrack.store.tracking import git_state


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_change_outside_the_package_makes_the_state_dirty(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "quantrack" / "store").mkdir(parents=True)
    (repo / "examples").mkdir()
    (repo / "quantrack" / "store" / "tracking.py").write_text("x = 1\n")
    (repo / "examples" / "study.toml").write_text("name = 'a'\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = _git(repo, "rev-parse", "HEAD")
    inside = repo / "quantrack" / "store"
    assert git_state(inside) == sha
    (repo / "untracked.txt").write_text("not tracked\n")  # untracked files do not count
    assert git_state(inside) == sha
    (repo / "examples" / "study.toml").write_text("name = 'b'\n")  # outside quantrack/
    assert git_state(inside) == f"{sha}-dirty"


def test_outside_a_checkout_the_state_is_unknown(tmp_path: Path) -> None:
    assert git_state(tmp_path) == "unknown"


def test_the_study_file_hash_is_of_its_bytes(tmp_path: Path) -> None:
    import hashlib

    from quantrack.run.record import study_sha256
    from quantrack.study import load_study

    src = Path(__file__).resolve().parents[2] / "examples" / "cpu-smollm2.toml"
    study = load_study(src)
    assert study_sha256(study) == hashlib.sha256(src.read_bytes()).hexdigest()


def test_the_torch_version_comes_from_metadata_without_importing_torch() -> None:
    import sys
    from importlib.metadata import PackageNotFoundError, version

    from quantrack.store.tracking import torch_version

    had = "torch" in sys.modules
    try:
        want = version("torch")
    except PackageNotFoundError:
        want = "unknown (torch is not installed here)"
    assert torch_version() == want
    assert ("torch" in sys.modules) == had


def test_the_cuda_runtime_from_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #39: the CUDA runtime is read from package metadata: the runtime wheel, else torch's +cuXYZ build."""
    import importlib.metadata as md

    import quantrack.store.tracking as tr

    def fake_version(pkgs: dict[str, str]) -> Any:
        def version(name: str) -> str:
            if name in pkgs:
                return pkgs[name]
            raise md.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(md, "version", fake_version({"nvidia-cuda-runtime-cu12": "12.8.90", "torch": "2.11.0"}))
    assert tr.cuda_runtime() == "12.8.90 (nvidia-cuda-runtime-cu12)"
    monkeypatch.setattr(md, "version", fake_version({"torch": "2.11.0+cu128"}))
    assert tr.cuda_runtime() == "12.8 (torch build 2.11.0+cu128)"
    monkeypatch.setattr(md, "version", fake_version({"torch": "2.11.0+cpu"}))
    assert tr.cuda_runtime().startswith("unknown (no CUDA runtime wheel; torch 2.11.0+cpu")
    monkeypatch.setattr(md, "version", fake_version({}))
    assert tr.cuda_runtime() == "unknown (torch is not installed here)"
