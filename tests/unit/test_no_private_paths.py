"""Issue #31: nothing a user sees names the development machine's private folders (``../data``, ``../shared``)
or a temporary path: not a rule's source or notes (preflight prints them), not a message of the package, not a
committed document or page (the decision pages once showed their temporary store, sqlite:////tmp/...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRIVATE = re.compile(r"\.\./(?:data|shared)\b|/work/shared\b")
# a temporary store or folder as mkdtemp / pytest / the docs scripts name them (user-typed example paths such as
# `eval import /tmp/results.json` in a command line are not output and are not matched)
TEMP = re.compile(r"sqlite:////tmp/|file:///tmp/|/tmp/pytest-of-|/tmp/tmp[a-z0-9_]{6,}|qt-docs-reports\.|"
                  r"/tmp/qt-[a-z0-9-]*\.[A-Za-z0-9]{6}\b")


def _committed_docs() -> list[Path]:
    out = [REPO / "README.md"]
    for ext in ("md", "txt", "html", "json", "toml"):
        out += sorted((REPO / "docs").rglob(f"*.{ext}"))
    out += sorted((REPO / "examples").rglob("*.toml"))
    return out


def _hits(pattern: re.Pattern[str], paths: list[Path]) -> list[str]:
    hits = []
    for p in paths:
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = pattern.search(line)
            if m:
                hits.append(f"{p.relative_to(REPO)}:{i}: {m.group(0)}")
    return hits


@pytest.mark.parametrize("folder", ["quantrack/rules", "rules"])
def test_rule_sources_cite_what_the_repository_holds(folder: str) -> None:
    files = sorted((REPO / folder).glob("*.toml"))
    assert files
    assert _hits(PRIVATE, files) == [] and _hits(TEMP, files) == []


def test_package_messages_name_no_private_folder() -> None:
    assert _hits(PRIVATE, sorted((REPO / "quantrack").rglob("*.py"))) == []


def test_committed_docs_and_pages_name_no_private_folder_or_temporary_path() -> None:
    docs = _committed_docs()
    assert len(docs) > 10
    assert _hits(PRIVATE, docs) == []
    assert _hits(TEMP, docs) == []


def test_preflight_prints_no_private_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    try:
        main(["preflight", "--study", str(REPO / "examples" / "cpu-smollm2.toml")])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    assert code in (0, 3), out.err
    assert "source:" in out.out  # the rule sources are printed ...
    assert not PRIVATE.search(out.out + out.err) and not TEMP.search(out.out + out.err)  # ... and name none
