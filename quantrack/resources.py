"""Locate data shipped inside the package (rules/ catalogs, GSM8K) — never the project reference folder."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def rules_dir() -> Path:
    """The rulebook and catalogs directory (``rules/`` in the repo, ``quantrack/rules`` when installed)."""
    return Path(str(resources.files("quantrack") / "rules"))


def data_dir() -> Path:
    """Other shipped data (``quantrack/data``): GSM8K split, few-shot exemplars, licences."""
    return Path(str(resources.files("quantrack") / "data"))
