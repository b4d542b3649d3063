"""Importers on real lm-evaluation-harness output committed in public repositories.

tests/data/eval/real/README.md gives repo@commit:path and the licence of each file. Expected values are
read from the files themselves (and the few literals below are the files' own numbers, quoted), so each
test checks that quantrack reads what lm-eval wrote; intervals are checked against scipy, not against
quantrack's own formula.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest

from quantrack.accuracy.importers import import_result, load_run, result_json
from quantrack.errors import BadInput

REAL = Path(__file__).resolve().parents[1] / "data" / "eval" / "real"
LLMC_DYNAMIC = REAL / "llmc-awq-fp8-dynamic" / "results_2026-02-10T15-33-52.326056.json"
LLMC_BLOCK = REAL / "llmc-awq-fp8-block" / "results_2026-02-10T17-13-14.667533.json"
OLOT_RESULTS = REAL / "olot-lmeh" / "results_2025-04-30T18-24-41.082644.json"
OLOT_SAMPLES = REAL / "olot-lmeh" / "samples_gsm8k_2025-04-30T18-24-41.082644.jsonl"


def _wilson_scipy(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


@pytest.mark.parametrize(("path", "filt", "k"), [
    (LLMC_DYNAMIC, "strict-match", 1008),    # file: 0.7642153146322972
    (LLMC_DYNAMIC, "flexible-extract", 1005),  # file: 0.7619408642911296
    (LLMC_BLOCK, "strict-match", 992),       # file: 0.7520849128127369
    (LLMC_BLOCK, "flexible-extract", 989),   # file: 0.7498104624715694
])
def test_llm_compressor_results_accuracy_only(path: Path, filt: str, k: int) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    acc = raw["results"]["gsm8k"][f"exact_match,{filt}"]
    n = raw["n-samples"]["gsm8k"]["effective"]
    assert n == 1319 and k / n == acc  # the file's mean is exactly k/1319 (float division gives the same bits)

    res, recs = import_result(path, lm_eval_filter=filt)
    assert recs is None  # no samples file was committed beside it
    assert (res.source, res.style, res.task) == ("imported:lm-eval", "lm-eval", "gsm8k")
    assert res.accuracy == acc
    assert (res.n, res.num_questions, res.correct, res.errors) == (n, n, k, 0)
    assert res.settings["filter"] == filt and res.settings["n-shot"] == raw["n-shot"]["gsm8k"] == 5
    assert res.settings["lm_eval_stderr"] == raw["results"]["gsm8k"][f"exact_match_stderr,{filt}"]
    # lm-eval's stderr is the sample standard deviation over sqrt(n) (n-1 in the variance); quantrack's
    # SE uses n: the two agree exactly once that factor is applied, which pins both k and n.
    assert res.se == pytest.approx(res.settings["lm_eval_stderr"] * math.sqrt((n - 1) / n), rel=1e-12)
    low, high = _wilson_scipy(k, n)
    assert res.ci_low == pytest.approx(low, abs=1e-12) and res.ci_high == pytest.approx(high, abs=1e-12)


def test_llm_compressor_two_arms_compare_unpaired() -> None:
    """Two real arms (FP8 dynamic vs FP8 block): no records, so no paired test; intervals overlap."""
    dyn, dyn_recs = load_run(LLMC_DYNAMIC)
    blk, blk_recs = load_run(LLMC_BLOCK)
    assert dyn_recs is None and blk_recs is None
    assert dyn.correct - blk.correct == 16  # 1008 - 992 strict-match
    assert dyn.ci_low is not None and blk.ci_high is not None and dyn.ci_low < blk.ci_high


def test_llm_compressor_result_json_roundtrip(tmp_path: Path) -> None:
    res, recs = import_result(LLMC_BLOCK)
    out = tmp_path / "block.json"
    out.write_text(result_json(res, recs), encoding="utf-8")
    back, back_recs = load_run(out)
    assert back_recs is None and "records" not in json.loads(out.read_text(encoding="utf-8"))
    assert (back.accuracy, back.n, back.correct, back.source) == (res.accuracy, 1319, 992, "imported:lm-eval")


def test_olot_samples_file_per_question_records() -> None:
    lines = [json.loads(x) for x in OLOT_SAMPLES.read_text(encoding="utf-8").splitlines() if x.strip()]
    res, recs = import_result(OLOT_SAMPLES)
    assert recs is not None and sorted(recs) == [row["doc_id"] for row in lines] == [0, 1, 2]
    assert (res.n, res.correct, res.accuracy, res.source) == (3, 0, 0.0, "imported:lm-eval")
    for row in lines:
        rec = recs[row["doc_id"]]
        assert rec.correct is bool(row["exact_match"]) is False
        assert row["filtered_resps"] == ["[invalid]"] and rec.extracted is None  # strict regex found no "####"
        assert rec.response == row["resps"][0][0]
        # prompt_hash is sha256 of the exact prompt lm-eval sent (arguments.gen_args_0.arg_0)
        prompt = row["arguments"]["gen_args_0"]["arg_0"]
        assert rec.prompt_sha256 == row["prompt_hash"] == hashlib.sha256(prompt.encode()).hexdigest()
        assert rec.gold == row["target"].split("#### ")[-1]
    assert [recs[i].gold for i in range(3)] == ["18", "3", "70000"]  # GSM8K test docs 0-2 ("70,000" normalised)


def test_olot_samples_have_no_flexible_lines() -> None:
    with pytest.raises(BadInput, match=r"no sample lines for filter 'flexible-extract'"):
        import_result(OLOT_SAMPLES, lm_eval_filter="flexible-extract")


def test_olot_cut_down_samples_refused_beside_full_results() -> None:
    """The real pair: results count 1319 questions, the committed samples hold 3. Before the fix the
    importer took the 3 records as the run (n=3, accuracy 0/3 'agreed' with the file's 0.0)."""
    raw = json.loads(OLOT_RESULTS.read_text(encoding="utf-8"))
    assert raw["n-samples"]["gsm8k"]["effective"] == 1319
    with pytest.raises(BadInput, match=r"3 questions for filter 'strict-match' but results_2025-04-30T18-24-41"
                                       r"\.082644\.json says n-samples effective 1319"):
        import_result(OLOT_RESULTS)


def test_olot_results_alone_accuracy_only(tmp_path: Path) -> None:
    only = tmp_path / OLOT_RESULTS.name
    shutil.copyfile(OLOT_RESULTS, only)
    res, recs = import_result(only, lm_eval_filter="flexible-extract")
    assert recs is None and (res.n, res.correct, res.accuracy) == (1319, 0, 0.0)
    low, high = _wilson_scipy(0, 1319)
    assert res.ci_low == pytest.approx(low, abs=1e-12) and res.ci_high == pytest.approx(high, abs=1e-12)
    assert res.settings["lm_eval_stderr"] == 0.0


def test_cli_one_line_error_on_real_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["eval", "import", str(OLOT_RESULTS)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quantrack: error: ") and len(err.splitlines()) == 1
    assert "n-samples effective 1319" in err and "Traceback" not in err


def test_accuracy_only_import_does_not_invent_an_invalid_count(capsys: pytest.CaptureFixture[str]) -> None:
    """lm-eval results files record no invalid count: quantrack must say so, not print 0."""
    from quantrack.cli import main

    res, _ = import_result(LLMC_DYNAMIC)
    assert res.invalid is None and res.invalid_rate is None
    assert main(["eval", "import", str(LLMC_DYNAMIC)]) in (0, None)
    out = capsys.readouterr().out
    assert "not recorded in the imported file" in out and "invalid         0" not in out
