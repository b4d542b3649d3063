"""`quantrack log`: results measured elsewhere, through the one importer (quantrack.accuracy.importers), and
server logs refused when they are not a startup log of the study's engine (never logged as "no fallback")."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines.base import LogReport
from quantrack.store.tracking import load_runs

DATA = Path(__file__).resolve().parents[1] / "data"
STUDY = DATA / "tracking" / "vllm-h200.toml"
VLLM_RESULT = DATA / "eval" / "vllm-save-results.json"
LLAMACPP_LOG = DATA / "logs" / "xllamacpp-SmolLM2-Q4_0-np2-kvq8_0.log"
EXPERIMENT = "vllm-h200-llama8b"


def _gsm8k(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("gsm8k_")}


def test_log_eval_and_eval_import_of_one_vllm_file_log_the_same_metrics(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    main(["log", "--study", str(STUDY), "--arm", "bf16", "--eval", str(VLLM_RESULT), "--tracking-uri", uri])
    out = tmp_path / "imported.json"
    main(["eval", "import", str(VLLM_RESULT), "--out", str(out)])
    main(["log", "--study", str(STUDY), "--arm", "fp8", "--eval", str(out), "--tracking-uri", uri])
    capsys.readouterr()
    runs = {r.arm: r for r in load_runs(EXPERIMENT, uri)}
    raw, via_import = _gsm8k(runs["bf16"].metrics), _gsm8k(runs["fp8"].metrics)
    via_import.pop("gsm8k_delta_vs_baseline", None)  # fp8 is a candidate: its Δ against bf16 is derived
    assert raw == via_import
    # the importer's figures: 660/1319 correct, the 95% Wilson interval, 3 invalid (0.002274 x 1319)
    from quantrack.accuracy.importers import import_result

    res, _ = import_result(VLLM_RESULT)
    assert raw == {"gsm8k_accuracy": res.accuracy, "gsm8k_se": res.se, "gsm8k_ci_low": res.ci_low,
                   "gsm8k_ci_high": res.ci_high, "gsm8k_n": 1319.0, "gsm8k_correct": 660.0,
                   "gsm8k_invalid": 3.0, "gsm8k_errors": 0.0}
    assert runs["bf16"].tags["quantrack.gsm8k_source"] == runs["fp8"].tags["quantrack.gsm8k_source"] == \
        "imported:vllm"


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8), "a binary file"),
    (lambda p: p.write_text("hello\nnot a log\n", encoding="utf-8"), "no vllm startup-log lines found"),
    (lambda p: p.write_bytes(LLAMACPP_LOG.read_bytes()), "this is a llamacpp log, the study's engine is vllm"),
])
def test_bad_server_log_is_one_line_exit_2_and_nothing_logged(tmp_path: Path, make: object, message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    make(log)  # type: ignore[operator]
    store = tmp_path / "store"
    with pytest.raises(SystemExit) as exc:
        main(["log", "--study", str(STUDY), "--arm", "bf16", "--server-log", str(log),
              "--tracking-uri", f"sqlite:///{store}/mlflow.db"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]
    assert not store.exists()  # nothing created


def test_binary_eval_and_latency_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob = tmp_path / "blob.json"
    blob.write_bytes(b"\xff\xfe\x00\x01" * 64)
    for flag in ("--eval", "--latency"):
        with pytest.raises(SystemExit) as exc:
            main(["log", "--study", str(STUDY), "--arm", "bf16", flag, str(blob)])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"quantrack: error: {flag} "), err
        assert "not a text file" in err[0] or "not valid JSON" in err[0], err


def test_fallback_is_unknown_when_the_log_cannot_say() -> None:
    """A log that never reached loading the weights says nothing about a fallback: "unknown", not "no"."""
    from quantrack.run.record import fallback_state

    assert fallback_state(LogReport(engine="vllm")) == "unknown"
    assert fallback_state(LogReport(engine=None, weights_gib=1.0)) == "unknown"
    assert fallback_state(LogReport(engine="vllm", weights_gib=14.9)) == "no"


def test_record_schema_names_match_the_tracking_identity_tags() -> None:
    from quantrack.run.schema import Tag
    from quantrack.store import tracking

    assert (Tag.ROLE, Tag.STUDY, Tag.ARM) == (tracking.TAG_ROLE, tracking.TAG_STUDY, tracking.TAG_ARM)
