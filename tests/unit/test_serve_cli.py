"""`quantrack serve STUDY --arm NAME`: model references (smollm2:F16) resolve like `run` does.

The resolution itself (download, SHA-256, requantization) is quantrack.models.ref's and tested with it
(tests/integration/test_llamacpp_lifecycle.py); here `resolve` is replaced by one that records the call
and points at a file in tmp_path, so the wiring in the command is what is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quantrack.models import ref as models_ref

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def fake_resolve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    asked: list[str] = []

    def resolve(ref: str, *, cache_dir: object = None, progress: object = None) -> models_ref.ResolvedModel:
        models_ref._checked(ref)  # unknown references fail as they would for real
        asked.append(ref)
        path = tmp_path / f"{ref.replace(':', '.')}.gguf"
        path.write_bytes(b"GGUF")
        return models_ref.ResolvedModel(ref=ref, path=path, note="note: derived file")

    monkeypatch.setattr(models_ref, "resolve", resolve)
    return asked


Serve = Callable[..., tuple[int, str, str]]


@pytest.fixture
def serve(capsys: pytest.CaptureFixture[str]) -> Serve:
    """The real entry point (quantrack.cli.main): (exit code, stdout, stderr)."""
    from quantrack.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(["serve", *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_dry_run_resolves_only_the_served_arm(serve: Serve, fake_resolve: list[str], tmp_path: Path) -> None:
    code, out, err = serve(str(EXAMPLES / "cpu-smollm2.toml"), "--arm", "Q8_0-kvq8_0", "--dry-run")
    assert code == 0, err
    assert fake_resolve == ["smollm2:Q8_0"]  # not the other three arms' files
    assert out.startswith("command: ") and f"-m {tmp_path / 'smollm2.Q8_0.gguf'} " in out
    assert "--cache-type-k q8_0 --cache-type-v q8_0" in out and "smollm2:" not in out
    assert err == "note: derived file\n"  # provisioning talk on stderr; stdout stays the command


def test_unknown_arm_is_refused_before_anything_is_provisioned(serve: Serve, fake_resolve: list[str]) -> None:
    code, _, err = serve(str(EXAMPLES / "cpu-smollm2.toml"), "--arm", "Q8", "--dry-run")
    assert code == 2 and fake_resolve == []
    assert err.startswith("quantrack: error: arm 'Q8' is not in study 'cpu-smollm2'")


def test_bad_reference_is_one_line_error(serve: Serve, fake_resolve: list[str], tmp_path: Path) -> None:
    study = tmp_path / "s.toml"
    study.write_text((EXAMPLES / "cpu-smollm2.toml").read_text().replace('model = "smollm2:Q4_0"',
                                                                         'model = "smollm2:Q5_0"'))
    code, _, err = serve(str(study), "--arm", "Q4_0", "--dry-run")
    assert code == 2 and fake_resolve == []
    # refused when the study is read, before anything is fetched
    assert err == (f"quantrack: error: study file {str(study)!r}: [[arms]] 'Q4_0' model: model reference "
                   "'smollm2:Q5_0': no type Q5_0 (did you mean 'Q8_0'?); "
                   f"smollm2 has: {', '.join(models_ref.known_models()['smollm2'].types)}\n")
