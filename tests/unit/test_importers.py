"""Importers: vLLM --save-results, SGLang run_eval, lm-eval results (+ samples).

The files under tests/data/eval/ are format samples built from the documented formats
(tests/data/eval/README.md cites each source); their numbers are placeholders, not measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.accuracy.importers import import_result, load_run, result_json
from quantrack.errors import BadInput

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"
LM_RESULTS = next((DATA / "lm-eval").glob("results_*.json"))


def test_vllm_save_results() -> None:
    res, recs = import_result(DATA / "vllm-save-results.json")
    assert recs is None
    assert res.source == "imported:vllm" and res.style == "vllm"
    assert (res.n, res.correct, res.invalid, res.errors) == (1319, 660, 3, 0)
    assert res.accuracy == pytest.approx(660 / 1319)
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low < res.accuracy < res.ci_high and res.ci_high - res.ci_low == pytest.approx(0.054, abs=0.002)
    assert res.settings["num_shots"] == 5


def test_sglang_needs_count_for_interval() -> None:
    res, recs = import_result(DATA / "sglang-run-eval-gsm8k.json")
    assert recs is None and res.source == "imported:sglang"
    assert res.accuracy == pytest.approx(660 / 1319) and res.ci_low is None and res.se is None
    res, _ = import_result(DATA / "sglang-run-eval-gsm8k.json", num_questions=1319)
    assert res.correct == 660 and res.ci_low is not None


def test_sglang_count_inconsistent_with_score() -> None:
    with pytest.raises(BadInput, match=r"accuracy 0\.500379\d* is not a count out of 7 questions"):
        import_result(DATA / "sglang-run-eval-gsm8k.json", num_questions=7)


def test_lm_eval_with_samples_gives_records() -> None:
    res, recs = import_result(LM_RESULTS)
    assert recs is not None and sorted(recs) == [0, 1, 2, 3, 4, 5]
    assert res.source == "imported:lm-eval" and res.style == "lm-eval"
    assert (res.n, res.correct) == (6, 3)
    assert [recs[i].correct for i in range(6)] == [True, True, True, False, False, False]
    assert recs[0].gold == "18" and recs[0].extracted == "18"
    assert res.settings["filter"] == "strict-match"


def test_lm_eval_flexible_filter() -> None:
    res, recs = import_result(LM_RESULTS, lm_eval_filter="flexible-extract")
    assert recs is not None and res.correct == 3
    assert recs[3].extracted == "18"  # real SmolLM2 response "... #### 18", flexible = last number


def test_lm_eval_without_samples_is_accuracy_only() -> None:
    res, recs = import_result(next((DATA / "lm-eval-nosamples").glob("results_*.json")))
    assert recs is None and (res.n, res.correct) == (1319, 660)


def test_lm_eval_samples_file_directly() -> None:
    res, recs = import_result(next((DATA / "lm-eval").glob("samples_gsm8k_*.jsonl")))
    assert recs is not None and res.correct == 3


def test_auto_detect_rejects_unknown(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(BadInput, match=r"not a vLLM --save-results, SGLang run_eval or lm-eval results file"):
        import_result(p)


def test_unknown_format_lists_choices() -> None:
    with pytest.raises(BadInput, match=r"^unknown format 'vlm' \(did you mean 'vllm'\?\)$"):
        import_result(DATA / "vllm-save-results.json", "vlm")


def test_result_json_roundtrip(tmp_path: Path) -> None:
    res, recs = import_result(LM_RESULTS)
    out = tmp_path / "r.json"
    out.write_text(result_json(res, recs))
    back, back_recs = load_run(out)
    assert back.accuracy == res.accuracy and back.source == "imported:lm-eval"
    assert back_recs is not None and {k: v.correct for k, v in back_recs.items()} == {
        k: v.correct for k, v in recs.items()}
    assert json.loads(out.read_text())["records"][0]["id"] == 0


def test_load_run_reads_real_records() -> None:
    res, recs = load_run(DATA / "smol-q41-max64.jsonl")
    assert recs is not None and len(recs) == 8 and res.style == "vllm"
    assert res.n == 8 and res.correct == sum(1 for r in recs.values() if r.correct)


# --- issue #30: every imported field validated; nonsense is one line, exit 2 --------------------------------


def _import_cli(path: Path, *args: str) -> tuple[int, str]:
    import contextlib
    import io

    from quantrack.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["eval", "import", str(path), *args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue()


def _edited(tmp_path: Path, src: Path, edit: dict[str, object], name: str = "f.json") -> Path:
    data = json.loads(src.read_text())
    data.update(edit)
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(("src", "edit", "args", "words"), [
    ("sglang-run-eval-gsm8k.json", {"score": 2}, (), "score 2.0 is not a fraction in [0, 1]"),
    ("sglang-run-eval-gsm8k.json", {"score": -0.1}, (), "not a fraction"),
    ("sglang-run-eval-gsm8k.json", {"score": [0.5]}, (), "'score' missing or not a number"),
    ("sglang-run-eval-gsm8k.json", {"score": "0.5"}, (), "not a number"),
    ("sglang-run-eval-gsm8k.json", {}, ("--num-questions", "100000000000"), "--num-questions"),
    ("vllm-save-results.json", {"num_questions": 1e300}, (), "'num_questions' is 1"),
    ("vllm-save-results.json", {"num_questions": [1319]}, (), "not a whole number"),
    ("vllm-save-results.json", {"num_questions": 13.5}, (), "not a whole number"),
    ("vllm-save-results.json", {"accuracy": [0.5]}, (), "'accuracy' missing or not a number"),
    ("vllm-save-results.json", {"accuracy": 7}, (), "not a fraction"),
])
def test_nonsense_in_an_imported_file_is_one_line(tmp_path: Path, src: str, edit: dict[str, object],
                                                  args: tuple[str, ...], words: str) -> None:
    path = _edited(tmp_path, DATA / src, edit)
    code, err = _import_cli(path, *args)
    assert code == 2 and err.count("\n") == 1 and "a bug" not in err, err
    assert words in err, err


def test_inf_counts_and_bad_sample_lines_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "vllm.json"
    bad.write_text(DATA.joinpath("vllm-save-results.json").read_text().replace(
        '"num_questions": ', '"num_questions": Infinity, "x": '))
    code, err = _import_cli(bad)
    assert code == 2 and "not a whole number" in err, err
    samples = next((DATA / "lm-eval").glob("samples_*.jsonl")).read_text().splitlines()
    for i, (key, value, words) in enumerate((("doc_id", "seven", "doc_id 'seven'"), ("doc_id", [1], "doc_id"),
                                              ("doc_id", -1, "doc_id"), ("exact_match", "yes", "exact_match 'yes'"),
                                              ("exact_match", 0.5, "exact_match '0.5'"),
                                              ("exact_match", [1], "exact_match"))):
        d = tmp_path / f"case{i}"
        d.mkdir()
        row = json.loads(samples[0])
        row[key] = value
        f = d / "samples_gsm8k_2026-11-30T10-15-42.123456.jsonl"
        f.write_text("\n".join([json.dumps(row), *samples[1:]]) + "\n")
        code, err = _import_cli(f, "--format", "lm-eval")
        assert code == 2 and err.count("\n") == 1 and "a bug" not in err and words in err, (key, value, err)
