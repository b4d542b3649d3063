"""Issue #31: a ratio, plot, CSV row or audit row built on a figure taken under contention carries the flag, and
the report does not decide on flagged latency without saying it cannot be judged here. Runs are built as the
store returns them (RunRow with the tags quantrack.measure.hygiene writes); no store is needed."""

from __future__ import annotations

import csv
import io
import json

from quantrack.constraints import Constraints, parse_accuracy_drop, parse_slo
from quantrack.report.audit import build_audit
from quantrack.report.audit import render as render_audit
from quantrack.report.compare import build_table, render
from quantrack.report.decision import build_report
from quantrack.report.judge import CANNOT_JUDGE, V_CANNOT
from quantrack.report.plots import CONTENTION_UNKNOWN, contention_note
from quantrack.store.records import RunRow

WHY = "other processes used 1.0 of 2 cores"


def _run(arm: str, tps: float, tpot: float, *, sweep: str = "no", latency: str = "no", base: bool = False,
         start: int = 0) -> RunRow:
    tags = {"quantrack.arm": arm, "quantrack.role": "arm", "quantrack.latency_contention": latency,
            "quantrack.sweep_contention": sweep}
    if sweep == "yes":
        tags["quantrack.sweep_contention_reasons"] = WHY
    if latency == "yes":
        tags["quantrack.latency_contention_reasons"] = WHY
    if base:
        tags["quantrack.baseline"] = "true"
    metrics = {"sweep_output_tps_c4": tps, "sweep_tpot_ms_p50_c4": tpot, "tpot_ms_p50": tpot / 2,
               "kv_tokens_reported": 4096.0, "gsm8k_accuracy": 0.5, "kl_mean": 0.0 if base else 0.01}
    return RunRow(run_id=f"run-{arm}", experiment_id="1", run_name=arm, status="FINISHED", start_time=start,
                  end_time=start + 1, params={"engine": "llamacpp", "gpu_catalog": "CPU", "weights": arm.lower()},
                  metrics=metrics, tags=tags)


RUNS = [_run("F16", 100.0, 40.0, base=True), _run("Q4_0", 3520.0, 10.0, sweep="yes", latency="yes", start=1),
        _run("Q8_0", 200.0, 20.0, start=2)]


def _arms(c: Constraints) -> dict[str, object]:
    rep = build_report("cpu", RUNS, c, baseline="F16")
    return {a.arm: a for a in rep.sections[0].arms} | {"_section": rep.sections[0]}


def test_throughput_ratio_and_its_source_carry_the_flag() -> None:
    a = _arms(Constraints(max_accuracy_drop=parse_accuracy_drop("50pp")))["Q4_0"]
    assert a.throughput_x.show() == "35.20× ⚠" and WHY in a.throughput_x.source  # type: ignore[attr-defined]
    assert a.throughput.show().endswith("⚠") and a.tpot_b1.show().endswith("⚠")  # type: ignore[attr-defined]
    q8 = _arms(Constraints(max_accuracy_drop=parse_accuracy_drop("50pp")))["Q8_0"]
    assert "⚠" not in q8.throughput_x.show()  # type: ignore[attr-defined]


def test_an_slo_on_a_contended_sweep_cannot_be_judged_here() -> None:
    a = _arms(Constraints(slos=(parse_slo("tpot_p50<=30ms@4"),), max_kl=0.1))["Q4_0"]
    (k,) = a.slo_checks  # type: ignore[attr-defined]
    assert k.status == "unknown" and k.reason.startswith(CANNOT_JUDGE)
    assert a.verdict == V_CANNOT  # type: ignore[attr-defined]


def test_no_ranking_on_flagged_throughput() -> None:
    sec = _arms(Constraints(max_kl=0.1))["_section"]
    assert sec.recommended is None  # type: ignore[attr-defined]
    assert sec.recommendation.startswith(f"Throughput {CANNOT_JUDGE}")  # type: ignore[attr-defined]


def test_no_constraint_is_said_so() -> None:
    sec = _arms(Constraints())["_section"]
    assert sec.recommendation.startswith("No constraint was given")  # type: ignore[attr-defined]
    assert "clears every constraint" not in sec.recommendation  # type: ignore[attr-defined]


def test_compare_csv_json_md_carry_the_flag() -> None:
    table = build_table("cpu", RUNS, "F16")
    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(render(table, "csv")))}
    # the csv is for machines: the figure a number, the flag its own column
    assert rows["Q4_0"]["tpot_ms"] == "5.0" and rows["Q4_0"]["tpot_contended"] == "True"
    assert rows["Q4_0"]["latency_contended"] == rows["Q4_0"]["sweep_contended"] == "True"
    assert rows["Q8_0"]["tpot_ms"] == "10.0" and rows["Q8_0"]["tpot_contended"] == "False"
    assert rows["Q8_0"]["latency_contended"] == rows["Q8_0"]["sweep_contended"] == "False"
    js = json.loads(render(table, "json"))
    assert {r["arm"]: r["contention"] for r in js["rows"]}["Q4_0"] == "latency ⚠, sweep ⚠"
    assert "| Q4_0 " in render(table, "md") and "5.00 ms ⚠" in render(table, "md")


def test_audit_tpot_and_its_median_carry_the_flag() -> None:
    runs = [_run("Q4_0", 1.0, 10.0, latency="yes"), _run("Q4_0", 1.0, 12.0, start=1)]
    runs[1].run_id, runs[1].params["hostname"] = "run-b", "node-b"
    runs[0].params["hostname"] = "node-a"
    text = render_audit(build_audit(runs))
    a_line = next(ln for ln in text.splitlines() if ln.startswith("node-a"))
    b_line = next(ln for ln in text.splitlines() if ln.startswith("node-b"))
    assert "5.00 ms ⚠" in a_line and "(of 2) ⚠" in a_line
    assert "6.00 ms ⚠" not in b_line and "(of 2) ⚠" in b_line  # compared against a median that holds a flagged TPOT
    assert f"⚠ CONTENTION node-a arm Q4_0 (llamacpp): TPOT measured under contention ({WHY})" in text  # which arm it is about


def test_speedup_plot_titles_say_the_host_state() -> None:
    assert contention_note({"F16": False, "Q4_0": True}) == "⚠ contention during Q4_0's sweep"
    assert contention_note({"F16": False, "Q4_0": False}) == "quiet host"
    assert contention_note({"F16": None, "Q4_0": False}) == CONTENTION_UNKNOWN
