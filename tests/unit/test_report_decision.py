"""`quantrack report`: verdicts on a constructed store (tests/report_fixtures.py), the constraint grammar, the
[decision] table, the pages, and bad input as one line + exit 2 with nothing written."""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import pytest

from quantrack.accuracy.stats import (
    compare_counts,
    detectable_multiplier,
    newcombe_paired_ci,
    proportion,
)
from quantrack.constraints import Constraints, parse_accuracy_drop, parse_max_kl, parse_slo
from quantrack.errors import BadInput
from quantrack.report.decision import build_report, decision_report
from quantrack.report.judge import V_CANNOT, V_CLEAR, V_MISSES, V_NOT_MEASURED, questions_needed, unpaired_interval
from quantrack.report.page import to_html, write_report
from quantrack.store.records import RunRow
from quantrack.store.tracking import load_runs
from quantrack.study import load_study
from tests.report_fixtures import EXPERIMENT, SLO, build_store

C = Constraints(slos=(parse_slo(SLO),), max_accuracy_drop=parse_accuracy_drop("1pp"), sources=("test",))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("report-store")
    uri = f"sqlite:///{d}/mlflow.db"
    return uri, build_store(uri)


@pytest.fixture(scope="module")
def report(store: tuple[str, dict[str, str]]):  # type: ignore[no-untyped-def]
    uri, _ = store
    return decision_report(EXPERIMENT, C, uri=uri)


def _arms(rep):  # type: ignore[no-untyped-def]
    assert len(rep.sections) == 1
    return {a.arm: a for a in rep.sections[0].arms}


def test_meets_slo_but_interval_crosses_the_budget(report) -> None:  # type: ignore[no-untyped-def]
    a = _arms(report)["fp8"]
    assert [k.status for k in a.slo_checks] == ["meets"]
    # b = 20, c = 12 of 1,319 paired: the figures of quantrack.accuracy.stats, not re-derived here
    pc = compare_counts(1000, 20, 12, 1319 - 1032)
    assert a.acc.paired and a.acc.delta.value == pytest.approx(pc.delta)
    assert a.acc.delta_ci == pytest.approx((pc.delta_ci_low, pc.delta_ci_high))
    assert pc.delta_ci_low < -0.01 < pc.delta_ci_high  # the point estimate (-0.61 pp) is inside the budget ...
    assert a.acc.budget_status == "crosses" and a.verdict == V_CANNOT  # ... the interval is not
    assert a.acc.distinguishable is False
    assert a.acc.n_needed is not None and a.acc.n_needed > 1319
    assert any("with 1,319 paired questions Δ is -0.6 pp [-1.5, +0.3]" in r for r in a.reasons)
    changes = " ".join(report.sections[0].changes)
    assert "fp8 (1.05× fp8-good's throughput): with 1,319 paired questions" in changes
    assert f"about {a.acc.n_needed_budget:,} questions per arm would resolve it" in changes


def test_misses_an_slo_with_its_goodput(report) -> None:  # type: ignore[no-untyped-def]
    a = _arms(report)["slow"]
    (k,) = a.slo_checks
    assert k.status == "misses" and k.value.value == 35.0 and k.goodput_c == 16
    assert a.verdict == V_MISSES
    assert a.slo_level == 16 and a.throughput.value == 1500  # throughput at the SLO = at its goodput level
    assert "misses TPOT p50 ≤ 20 ms @ c64: tpot_p50 35.0 ms > 20 ms at c64 (by 15.0 ms); meets it up to c16" \
        in a.reasons


def test_fallback_and_rulebook_warning_are_reasons(report) -> None:  # type: ignore[no-untyped-def]
    a = _arms(report)["marlin"]
    assert a.warnings == ["rulebook warn: vllm-fp8-marlin-forced"]
    assert len(a.fallbacks) == 1 and "fp8_marlin" in a.fallbacks[0]
    assert "Your GPU does not have native support for FP8 computation" in a.fallbacks[0]
    assert any(r.startswith("warning: fallback fp8_marlin") for r in a.reasons)
    # the rule's message, from the run's preflight/verdicts.json artifact
    assert ("warning: rulebook warn: vllm-fp8-marlin-forced — This arm measures the fallback, not native FP8."
            in a.reasons)
    assert a.run_id in a.fallbacks[0]
    html = to_html(report)
    assert "⚠ warnings" in html and "vllm-fp8-marlin-forced" in html


def test_fill_in_accuracy_cannot_be_cleared(report) -> None:  # type: ignore[no-untyped-def]
    a = _arms(report)["fp8-kv"]
    assert a.acc.accuracy.value is None and a.acc.accuracy.show() == "FILL IN"
    assert a.acc.delta.show() == "FILL IN"
    assert a.verdict == V_CANNOT
    assert "accuracy cannot be cleared: GSM8K not measured for this arm: FILL IN" in a.reasons
    # the fastest arm, so the page says what would change the answer
    assert any(c.startswith("fp8-kv (1.10× fp8-good's throughput): GSM8K is FILL IN") for c in report.sections[0].changes)
    # contention recorded on this run only; the others say "not recorded", never "none"
    assert a.contention == ["latency: host load 7.2 on 2 cores"]
    assert _arms(report)["fp8"].contention is None


def test_recommendation_and_frontier(report) -> None:  # type: ignore[no-untyped-def]
    arms = _arms(report)
    sec = report.sections[0]
    assert arms["fp8-good"].verdict == V_CLEAR and arms["bf16"].verdict == V_CLEAR
    assert arms["marlin"].verdict == V_CLEAR  # cleared, its warnings listed
    # H100 is priced in the shipped rules/prices.toml: cleared arms all priced -> lowest cost wins
    assert sec.recommended == "fp8-good"
    assert sec.recommendation.startswith("Deploy fp8-good: of the 3 arms that clear every constraint it has the lowest "
                                         "cost per 1M output tokens at the SLO ($")
    from quantrack.hardware.pricing import cost_per_million_tokens, load_prices

    assert arms["fp8-good"].cost.value == pytest.approx(cost_per_million_tokens("H100", 4100, load_prices()))
    # (throughput at the SLO, accuracy): fp8 (fastest with accuracy), fp8-good, bf16 (most accurate)
    assert sec.frontier == ["fp8", "fp8-good", "bf16"]
    assert "fp8-kv" in sec.frontier_note  # FILL IN accuracy: not placed, and said so


def test_every_figure_names_its_run_and_kind(report) -> None:  # type: ignore[no-untyped-def]
    for a in report.sections[0].arms:
        figs = [a.capacity, a.throughput, a.acc.accuracy, a.kl, a.cost]
        figs += [f for lv in a.levels.values() for f in lv.values()]
        for f in figs:
            assert f.run_id == a.run_id
            assert f.kind in ("measured", "derived", "imported", "FILL IN", "unknown")
        assert a.throughput.kind == "measured" and a.cost.kind == "derived" and a.capacity_x.kind == "derived"


def test_p99_slo_reads_the_sweep_artifact_or_says_not_recorded(store: tuple[str, dict[str, str]]) -> None:
    uri, ids = store
    c = Constraints(slos=(parse_slo("tpot_p99<=20ms@64"),), max_accuracy_drop=0.01)
    arms = _arms(decision_report(EXPERIMENT, c, uri=uri))
    (k,) = arms["fp8-kv"].slo_checks
    assert k.status == "meets" and k.value.value == pytest.approx(12.6 * 1.3)
    assert k.value.source == "artifact sweep/sweep.json (c64 tpot_ms.p99)" and k.value.run_id == ids["fp8-kv"]
    (k,) = arms["fp8"].slo_checks
    assert k.status == "unknown" and k.value.show() == "not recorded"
    assert "sweep/sweep.json artifact could not be read" in k.reason
    assert arms["fp8"].verdict == V_CANNOT


def test_unmeasured_level_is_unknown_not_interpolated(store: tuple[str, dict[str, str]]) -> None:
    uri, _ = store
    c = Constraints(slos=(parse_slo("tpot_p50<=20ms@32"),), max_accuracy_drop=0.01)
    a = _arms(decision_report(EXPERIMENT, c, uri=uri))["fp8"]
    (k,) = a.slo_checks
    assert k.status == "unknown" and "concurrency 32 was not measured (levels: c1, c16, c64)" in k.reason


def test_no_accuracy_budget_clears_no_candidate(store: tuple[str, dict[str, str]]) -> None:
    uri, _ = store
    arms = _arms(decision_report(EXPERIMENT, Constraints(slos=(parse_slo(SLO),)), uri=uri))
    assert arms["bf16"].verdict == V_CLEAR
    assert {a.verdict for n, a in arms.items() if n not in ("bf16", "slow")} == {V_CANNOT}


def test_kl_budget(store: tuple[str, dict[str, str]]) -> None:
    uri, _ = store
    arms = _arms(decision_report(EXPERIMENT, Constraints(slos=(parse_slo(SLO),), max_kl=0.003), uri=uri))
    assert arms["fp8-good"].kl_status == "within" and arms["fp8"].kl_status == "exceeds"
    assert arms["fp8"].verdict == V_MISSES
    assert arms["fp8-kv"].kl_status == "unknown" and arms["fp8-kv"].verdict == V_CANNOT


def test_failed_run_is_not_measured(store: tuple[str, dict[str, str]]) -> None:
    uri, _ = store
    runs = load_runs(EXPERIMENT, uri)
    failed = [RunRow(**{**r.__dict__, "status": "FAILED"}) if r.arm == "fp8-good" else r for r in runs]
    arms = _arms(build_report(EXPERIMENT, failed, C, uri=uri))
    assert arms["fp8-good"].verdict == V_NOT_MEASURED


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_fleet_gets_one_section_per_gpu_and_the_audit(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    build_store(uri, gpus=("H100", "A100-80GB"))
    rep = decision_report(EXPERIMENT, C, uri=uri)
    assert [s.gpu for s in rep.sections] == ["A100-80GB", "H100"]
    assert rep.audit is not None
    # the marlin arm on each GPU by its warning line; on the A100 (SM80, no FP8 tensor cores) every FP8 arm by the
    # rulebook's gate (vllm-fp8-marlin-fallback), whatever its fallback tag says
    assert sorted((r.gpu, r.arm) for r in rep.audit.fell_back) == [
        ("A100-80GB", a) for a in ("fp8", "fp8-good", "fp8-kv", "marlin", "slow")] + [("H100", "marlin")]
    assert rep.fleet_pick.startswith("Across GPU types, the cheapest cleared choice is fp8-good on H100")
    html = to_html(rep)
    assert html.count('class="verdicts"') == 2 and "Fleet audit" in html


# --- statistics used by the verdicts ------------------------------------------------------------------------

def test_unpaired_interval_is_the_paired_one_without_correlation() -> None:
    # a table whose cross-product ad - bc is within n/2: Newcombe's phi is 0, so both forms agree
    a, b, c, d = 10, 20, 20, 41  # ad - bc = 410 - 400 = 10 <= n/2 = 45.5: phi = 0
    arm, base = proportion(a + c, a + b + c + d), proportion(a + b, a + b + c + d)
    assert arm.p is not None and base.p is not None and arm.ci_low is not None and base.ci_low is not None
    assert arm.ci_high is not None and base.ci_high is not None
    got = unpaired_interval(arm.p, arm.ci_low, arm.ci_high, base.p, base.ci_low, base.ci_high)
    assert got == pytest.approx(newcombe_paired_ci(a, b, c, d))


def test_questions_needed_inverts_the_planning_formula() -> None:
    p, diff = 0.8, 0.02
    n = questions_needed(p, diff)
    assert n is not None
    se = math.sqrt(p * (1 - p) / n)  # stats.min_detectable_difference = 2.80 x sqrt(2) x SE
    assert detectable_multiplier() * math.sqrt(2) * se <= diff
    assert detectable_multiplier() * math.sqrt(2) * math.sqrt(p * (1 - p) / (n - 2)) > diff
    # paired: n = 2.80^2 x ((b+c)/n - Δ^2) / diff^2
    assert questions_needed(p, 0.004, discordant=0.02, delta=-0.006) == math.ceil(
        detectable_multiplier() ** 2 * (0.02 - 0.006 ** 2) / 0.004 ** 2)


# --- the constraint grammar ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("tpot_p99<=30ms@64", ("tpot", "p99", 30.0, 64)),
    ("ttft_p50 <= 0.5s @ c16", ("ttft", "p50", 500.0, 16)),
    ("e2e_mean≤2s@1", ("e2e", "mean", 2000.0, 1)),
    ("tpot_p95<=30ms@64", ("tpot", "p95", 30.0, 64)),  # the sweep records p95 since issue 28
])
def test_parse_slo(text: str, want: tuple[str, str, float, int]) -> None:
    s = parse_slo(text)
    assert (s.metric, s.stat, s.limit_ms, s.concurrency) == want


@pytest.mark.parametrize("text, msg", [
    ("tpot_p75<=30ms@64", ("--slo 'tpot_p75<=30ms@64': unknown metric 'tpot_p75' (did you mean 'tpot_p95'?); "
                          "the sweep records ttft, tpot, e2e as p50, p90, p95, p99, mean per concurrency level")),
    ("itl_p50<=5ms@4", "--slo 'itl_p50<=5ms@4': unknown metric 'itl_p50'"),
    ("tpot_p99<30ms@64", "--slo 'tpot_p99<30ms@64': expected METRIC<=VALUE(ms|s)@CONCURRENCY"),
    ("tpot_p99<=30@64", "--slo 'tpot_p99<=30@64': the limit needs a unit, ms or s (got 'none')"),
    ("tpot_p99<=30ms", "expected METRIC<=VALUE(ms|s)@CONCURRENCY"),
    ("tpot_p99<=30ms@0", "the concurrency must be >= 1"),
    ("tpot_p99<=0ms@4", "the limit must be a positive number"),
])
def test_bad_slo(text: str, msg: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_slo(text)
    assert str(exc.value).startswith(f"--slo {text!r}: ") and msg in str(exc.value) and "\n" not in str(exc.value)


def test_budgets() -> None:
    assert parse_accuracy_drop("1pp") == 0.01 and parse_accuracy_drop("0.5 pp") == 0.005
    for bad in ("1%", "0.01", "0pp", "pp", 1):
        with pytest.raises(BadInput, match="percentage points|between 0 and 100"):
            parse_accuracy_drop(bad)
    assert parse_max_kl("0.01", from_text=True) == 0.01 and parse_max_kl(0.01) == 0.01
    with pytest.raises(BadInput, match="a number, not a string"):
        parse_max_kl("0.01")  # a study file's max_kl = "0.01"
    for bad in ("-1", "x", True, 0):
        with pytest.raises(BadInput, match="positive number of nats"):
            parse_max_kl(bad, from_text=True)


STUDY = """
name = "s"
[model]
name = "Llama-3-8B"
[[arms]]
name = "bf16"
[[arms]]
name = "fp8"
weights = "fp8"
quantization = "fp8"
"""


def test_study_decision_table(tmp_path: Path) -> None:
    from quantrack.hardware.pricing import default_prices_path

    (tmp_path / "p.toml").write_text(default_prices_path().read_text())  # read at load: it must exist
    p = tmp_path / "s.toml"
    p.write_text(STUDY + '[decision]\nslo = ["tpot_p99<=30ms@64"]\nmax_accuracy_drop = "1pp"\nprices = "p.toml"\n')
    st = load_study(p)
    assert st.decision.slo == ("tpot_p99<=30ms@64",) and st.decision.max_accuracy_drop == "1pp"
    assert st.decision.prices == str(tmp_path / "p.toml")
    assert load_study(_write(tmp_path, STUDY)).decision.slo == ()


@pytest.mark.parametrize("table, msg", [
    ('slo = ["tpot_p75<=30ms@64"]', "[decision] slo 'tpot_p75<=30ms@64': unknown metric 'tpot_p75'"),
    ('max_acuracy_drop = "1pp"', "[decision] unknown key 'max_acuracy_drop' (did you mean 'max_accuracy_drop'?)"),
    ("max_accuracy_drop = 1", "[decision] max_accuracy_drop 1: give the budget in percentage points"),
    ("max_kl = -0.1", "[decision] max_kl -0.1: a positive number"),
    ("slo = 3", "[decision] slo must be a list of strings"),
])
def test_study_decision_errors(tmp_path: Path, table: str, msg: str) -> None:
    p = _write(tmp_path, STUDY + "[decision]\n" + table + "\n")
    with pytest.raises(BadInput) as exc:
        load_study(p)
    assert f"study file {str(p)!r}: " + msg in str(exc.value)


def _write(d: Path, text: str) -> Path:
    p = d / "study.toml"
    p.write_text(text)
    return p


# --- pages and the CLI ----------------------------------------------------------------------------------------

def test_html_is_self_contained(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (path,) = write_report(report, tmp_path / "r.html")
    text = path.read_text()
    assert 'id="verdicts-0"' in text
    assert not re.search(r"""(src|href)=["'](https?:|//)""", text)  # nothing fetched to open it
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(imgs) >= 6
    for b64 in imgs:
        assert base64.b64decode(b64).startswith(b"\x89PNG\r\n\x1a\n")
    for run_id in (a.run_id for a in report.sections[0].arms):
        assert run_id in text


def test_markdown_writes_pngs_beside_it(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = write_report(report, tmp_path / "r.md", "md")
    md = files[0].read_text()
    pngs = files[1:]
    assert pngs and all(p.parent == tmp_path and p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    for p in pngs:
        assert f"]({p.name})" in md
    assert "| **fp8-kv** | **cannot be cleared** |" in md


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from quantrack.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("extra, msg", [
    (["--slo", "tpot_p75<=30ms@64"], "quantrack: error: --slo 'tpot_p75<=30ms@64': unknown metric 'tpot_p75'"),
    (["--slo", "fast please"], "quantrack: error: --slo 'fast please': expected METRIC<=VALUE(ms|s)@CONCURRENCY"),
    (["--max-accuracy-drop", "1%"], "quantrack: error: --max-accuracy-drop '1%': give the budget in percentage"),
    (["--baseline", "fp9"], "quantrack: error: --baseline 'fp9' is not an arm of this experiment"),
    (["--gpu", "H300"], "quantrack: error: no runs on GPU 'H300'"),
])
def test_cli_bad_input(store: tuple[str, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                       extra: list[str], msg: str) -> None:
    uri, _ = store
    out = tmp_path / "r.html"
    code, _, err = _cli(["report", "--experiment", EXPERIMENT, "--tracking-uri", uri, "--out", str(out), *extra],
                        capsys)
    assert code == 2 and err.startswith(msg) and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_cli_experiment_without_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rec = RunRecord(experiment="empty", run_name="study:empty")
    rec.tag("quantrack.role", "study")
    Tracker(uri, "empty").log(rec)  # a parent run only: no arm runs
    capsys.readouterr()  # mlflow's own log lines while the store was made
    out = tmp_path / "r.html"
    code, _, err = _cli(["report", "--experiment", "empty", "--tracking-uri", uri, "--out", str(out)], capsys)
    assert code == 2 and err == ("quantrack: error: experiment 'empty' has no arm runs (log some with `quantrack run` "
                                 "or `quantrack log`)\n")
    code, _, err = _cli(["report", "--experiment", "nope", "--tracking-uri", uri, "--out", str(out)], capsys)
    assert code == 2 and err.startswith("quantrack: error: unknown experiment 'nope'") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_cli_writes_and_logs_to_the_parent_run(store: tuple[str, dict[str, str]], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    uri, ids = store
    out = tmp_path / "page.html"
    code, stdout, err = _cli(["report", "--experiment", EXPERIMENT, "--tracking-uri", uri, "--slo", SLO,
                              "--max-accuracy-drop", "1pp", "--out", str(out), "--log-to-run"], capsys)
    assert code == 0, err
    assert stdout.startswith("H100: Deploy fp8-good:")
    assert f"  fp8\tcannot be cleared\t{ids['fp8']}\n" in stdout
    assert f"logged report/page.html to run {ids['parent']}" in stdout
    db_dir = Path(uri[len("sqlite:///"):]).parent
    logged = db_dir / "artifacts" / ids["parent"] / "artifacts" / "report" / "page.html"
    assert logged.read_text() == out.read_text()


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_cli_reads_the_study_decision_table(store: tuple[str, dict[str, str]], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    uri, _ = store
    study = _write(tmp_path, STUDY + f'[decision]\nslo = ["{SLO}"]\nmax_kl = 0.003\n')
    out = tmp_path / "r.md"
    code, stdout, err = _cli(["report", "--experiment", EXPERIMENT, "--tracking-uri", uri, "--study", str(study),
                              "--out", str(out)], capsys)
    assert code == 0, err
    md = out.read_text()
    assert f"study file {str(study)!r}" in md and "mean KL(baseline ‖ arm) ≤ 0.003 nats/token" in md
    assert "  fp8\tmisses\t" in stdout  # KL 0.004 > 0.003


@pytest.mark.parametrize("alpha, power", [(0.05, 0.80), (0.01, 0.90), (0.10, 0.50)])
def test_planning_multiplier_matches_scipy(alpha: float, power: float) -> None:
    from scipy.stats import norm  # type: ignore[import-untyped]

    assert detectable_multiplier(alpha, power) == pytest.approx(norm.ppf(1 - alpha / 2) + norm.ppf(power), abs=1e-12)


def test_store_credentials_never_reach_the_page() -> None:
    from quantrack.report.decision import display_uri

    assert display_uri("https://bob:s3cret@mlflow.example:5000/?token=hf_abcdefghijklmnopqrstuvwxyz") == \
        "https://[REDACTED]@mlflow.example:5000/"
    assert display_uri("sqlite:////tmp/x/mlflow.db") == "sqlite:////tmp/x/mlflow.db"


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_constraints_from_the_study_file_on_the_parent_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No flags, no --study: the [decision] table of study/study.toml logged on the newest parent run."""
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "with-study")
    parent = RunRecord(experiment="with-study", run_name="study:s", status="RUNNING")
    parent.tag("quantrack.role", "study")
    parent.artifacts["study/study.toml"] = STUDY + '[decision]\nslo = ["tpot_p50<=5ms@1"]\nmax_kl = 0.01\n'
    p = tracker.log(parent)
    arm = RunRecord(experiment="with-study", run_name="bf16", parent_uuid=p.uuid)
    arm.tag("quantrack.role", "arm")
    arm.tag("quantrack.arm", "bf16")
    arm.metric("sweep_output_tps_c1", 200.0)
    arm.metric("sweep_tpot_ms_p50_c1", 4.8)
    tracker.log(arm)
    tracker.finish(p, "FINISHED")
    rep = decision_report("with-study", Constraints(), uri=uri)
    assert rep.constraints.sources == (f"study/study.toml of run {p.run_id}",)
    assert [s.text for s in rep.constraints.slos] == ["tpot_p50<=5ms@1"] and rep.constraints.max_kl == 0.01
    (a,) = rep.sections[0].arms
    assert a.verdict == V_CLEAR and a.slo_checks[0].status == "meets"
    # a flag overrides the study key by key
    rep = decision_report("with-study", Constraints(slos=(parse_slo("tpot_p50<=4ms@1"),), sources=("flags",)), uri=uri)
    assert rep.sections[0].arms[0].verdict == V_MISSES and rep.constraints.max_kl == 0.01
    assert rep.constraints.sources == ("flags", f"study/study.toml of run {p.run_id}")


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_run_hook_logs_the_page_on_the_parent_run(tmp_path: Path) -> None:
    """What `quantrack run` calls at its end (runner.run_study -> page.publish_study_report)."""
    from quantrack.report.page import publish_study_report
    from quantrack.runner import StudyResult
    from quantrack.store.records import Logged

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ids = build_store(uri)
    study = load_study(_write(tmp_path, STUDY + f'[decision]\nslo = ["{SLO}"]\nmax_accuracy_drop = "1pp"\n'))
    result = StudyResult(study=study, experiment=EXPERIMENT, outcomes=[], parent=Logged(uuid="u", run_id=ids["parent"]),
                         logged={})
    said: list[str] = []
    published = publish_study_report(result, uri, tmp_path / "work", said.append)
    assert published is not None
    page = published.path
    assert page == tmp_path / "work" / "report.html"
    logged = tmp_path / "artifacts" / ids["parent"] / "artifacts" / "report" / "report.html"
    assert logged.read_text() == page.read_text()
    assert said[0].startswith("report: H100: Deploy fp8-good:")
    assert said[-1] == f"report: {page} (artifact report/report.html of the parent run {ids['parent']})"
    # the decision `quantrack run` prints under its table: the same sentence (one GPU: no GPU prefix)
    assert published.decision == (f"decision: {said[0].removeprefix('report: H100: ')}",)
    # spooled runs: no page, one line saying how to make it later
    said.clear()
    result.parent = Logged(uuid="u", spooled=tmp_path)
    assert publish_study_report(result, uri, tmp_path / "work", said.append) is None
    assert said == [(f"report: the runs were spooled; after `quantrack sync`, run `quantrack report --experiment "
                    f"{EXPERIMENT} --log-to-run`")]


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_cli_default_page_goes_beside_the_store_not_the_cwd(store: tuple[str, dict[str, str]], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    uri, _ = store
    monkeypatch.chdir(tmp_path)
    code, stdout, err = _cli(["report", "--experiment", EXPERIMENT, "--tracking-uri", uri], capsys)
    assert code == 0, err
    page = Path(uri[len("sqlite:///"):]).parent / "reports" / f"{EXPERIMENT}.html"
    assert page.is_file() and f"wrote {page}" in stdout
    assert list(tmp_path.iterdir()) == []  # nothing in the current folder
    code, _, err = _cli(["report", "--experiment", EXPERIMENT, "--tracking-uri", "http://127.0.0.1:9"], capsys)
    assert code == 2 and err == ("quantrack: error: --out FILE is required with tracking store http://… (no local "
                                 "folder to write the page beside)\n")


def test_outputs_that_are_links_are_refused_never_written_through(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue #30: `report --out LINK` overwrote the link's target. A link (even a dangling one) is refused with
    one line naming it, for the page and for its PNGs; the target is untouched."""
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    for name, fmt in (("r.html", "html"), ("r.md", "md")):
        link = tmp_path / name
        link.symlink_to(target)
        with pytest.raises(BadInput, match=rf"--out {re.escape(str(link))} is a symbolic link"):
            write_report(report, link, fmt)
        assert target.read_text() == "keep me\n" and link.is_symlink()
    probe = tmp_path / "probe"
    probe.mkdir()
    first_png = write_report(report, probe / "p.md", "md")[1].name
    (tmp_path / first_png).symlink_to(target)  # a link where the markdown page's first PNG goes
    with pytest.raises(BadInput, match="symbolic link"):
        write_report(report, tmp_path / "p.md", "md")
    assert target.read_text() == "keep me\n"
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "nowhere" / "x.html")
    with pytest.raises(BadInput, match="symbolic link"):
        write_report(report, dangling)
    assert not list(tmp_path.glob(".*.tmp"))


def test_report_out_device_or_fifo_is_written_through_never_replaced(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue #43: `report --out /dev/full` left the page where the device was. A character device or FIFO is
    written through; a full device is one line (exit 2); Markdown (PNGs beside it) is refused there."""
    import os
    import stat
    import threading

    null, full = tmp_path / "null", tmp_path / "full"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except OSError:
        null, full = Path("/dev/null"), Path("/dev/full")
    assert write_report(report, null, "html") == [null]
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    with pytest.raises(BadInput, match=rf"^cannot write --out {re.escape(str(full))} \(character device\): No space"):
        write_report(report, full, "html")
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    with pytest.raises(BadInput, match="Markdown page's PNGs are written beside it"):
        write_report(report, null, "md")
    pipe = tmp_path / "page.fifo"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    got: list[bytes] = []

    def read() -> None:
        while True:  # until the writer has written and closed (EOF after data)
            chunk = os.read(fd, 1 << 16)
            if chunk:
                got.append(chunk)
            elif got:
                return
            else:
                threading.Event().wait(0.01)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    write_report(report, pipe, "html")
    reader.join(timeout=10)
    os.close(fd)
    assert b"".join(got).startswith(b"<!doctype html>") or b"<html" in b"".join(got)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "null", "page.fifo"] or null == Path("/dev/null")


def test_markdown_escapes_names_and_log_lines(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue #30: names and engine log lines passed into the Markdown page as raw HTML and markup (the HTML page
    escaped them). An arm named like an HTML tag and a log line with markup read as text."""
    import copy

    rep = copy.deepcopy(report)
    arm = rep.sections[0].arms[0]
    object.__setattr__(arm, "arm", "<img src=x onerror=alert(1)>")
    arm.reasons.append("engine log: <b>FP8 Marlin</b> *fallback* [link](http://evil) `x`")
    text = write_report(rep, tmp_path / "r.md", "md")[0].read_text()
    assert "<img" not in text and "<b>" not in text and "[link](http://evil)" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "&lt;b&gt;FP8 Marlin&lt;/b&gt; \\*fallback\\* \\[link\\](http://evil) \\`x\\`" in text
