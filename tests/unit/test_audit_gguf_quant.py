"""audit's quantization column for llama.cpp runs: the GGUF type (the run's ``weights``, else the log's file
type), not the ``quantization = none`` param a GGUF arm logs (llama.cpp has no --quantization). The run is built
by the runner's own writer (record_for_arm) from the CPU study's arm and a real llama.cpp startup log
(tests/data/logs/README.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from quantrack.engines import get_adapter
from quantrack.report.audit import AuditReport, AuditRow, render, rows_from_runs
from quantrack.run.outcome import ArmOutcome
from quantrack.run.record import record_for_arm
from quantrack.store.records import RunRow
from quantrack.study import load_study

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "tests" / "data" / "logs" / "xllamacpp-SmolLM2-Q8_0-np1.log"


def _row(study_path: Path, arm_name: str, with_log: bool, weights: str | None = None) -> RunRow:
    study = load_study(study_path)
    arm = study.arm(arm_name)
    out = ArmOutcome(arm=arm, node={"hostname": "n1"}, status="FINISHED")
    if with_log:
        out.log_report = get_adapter(study.engine.kind).parse_log_file(LOG)
    rec = record_for_arm(study, out, experiment="x")
    params = dict(rec.params)
    if weights is not None:
        params["weights"] = weights
    return RunRow(run_id="r-" + arm_name, experiment_id="1", run_name=arm_name, status="FINISHED", start_time=0,
                  end_time=None, params=params, metrics={}, tags=dict(rec.tags))


def test_gguf_arm_shows_its_type_not_none() -> None:
    row = _row(REPO / "examples" / "cpu-smollm2.toml", "Q8_0", with_log=True)
    assert row.params["quantization"] == "none" and row.params["weights"] == "q8_0"  # what the run logs
    (audit_row,) = rows_from_runs([row])
    assert audit_row.quantization == "Q8_0"
    assert _quant_cell(audit_row) == "Q8_0"  # the table's Quant. column


def test_kv_arm_shows_its_weights_type() -> None:
    (audit_row,) = rows_from_runs([_row(REPO / "examples" / "cpu-smollm2.toml", "Q8_0-kvq8_0", with_log=True)])
    assert _quant_cell(audit_row) == "Q8_0"


def test_without_weights_the_log_file_type() -> None:
    row = _row(REPO / "examples" / "cpu-smollm2.toml", "Q8_0", with_log=True)
    row = replace(row, params={k: v for k, v in row.params.items() if k != "weights"})
    assert rows_from_runs([row])[0].quantization == "Q8_0"  # quantrack.log_quantization (print_info file type)


def test_vllm_runs_keep_their_quantization_param() -> None:
    study = REPO / "examples" / "gpu" / "h200-smollm2-vllm.toml"
    assert rows_from_runs([_row(study, "bf16", with_log=False)])[0].quantization == "none"
    assert rows_from_runs([_row(study, "fp8", with_log=False)])[0].quantization == "fp8"


def _quant_cell(row: AuditRow) -> str:
    lines = render(AuditReport(rows=[row]), "table").splitlines()
    col = lines[0].index("Quant.")
    return lines[2][col:].split()[0]
