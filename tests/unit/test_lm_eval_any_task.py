"""lm-eval per-sample lines of any task: the metric and filter rules, records, pairing, and hostile files.

The sample lines are hand-written in the shape lm-eval 0.4.13 writes them (lm_eval/evaluator.py:644-666,
lm_eval/loggers/evaluation_tracker.py:344-373: ``filtered_resps`` of a multiple-choice line are stringified
``[loglikelihood, is_greedy]`` pairs); the integration test tests/integration/test_lm_eval_any_task.py checks the
same reading on real lm-eval output.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from quantrack.accuracy.importers import import_result
from quantrack.accuracy.paired import compare_runs
from quantrack.errors import BadInput

DATE = "2026-12-03T10-00-00.000000"


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def mc_line(doc_id: int, acc: Any, acc_norm: Any = 1.0, *, prompt: str | None = None,
            lls: tuple[float, ...] = (-1.0, -3.0, -2.0)) -> dict[str, Any]:
    prompt = prompt if prompt is not None else f"Question: capital of country {doc_id}?\nAnswer:"
    return {"doc_id": doc_id, "doc": {"q": doc_id}, "target": "0", "arguments": {}, "resps": [],
            "filtered_resps": [[str(x), "False"] for x in lls], "filter": "none", "metrics": ["acc", "acc_norm"],
            "doc_hash": _h(f"doc{doc_id}"), "prompt_hash": _h(prompt), "target_hash": _h("0"),
            "acc": acc, "acc_norm": acc_norm}


def gen_line(doc_id: int, em: Any, filt: str) -> dict[str, Any]:
    return {"doc_id": doc_id, "doc": {}, "target": str(doc_id), "arguments": {}, "resps": [[f" {doc_id}!"]],
            "filtered_resps": [str(doc_id)], "filter": filt, "metrics": ["exact_match"],
            "doc_hash": _h(f"d{doc_id}"), "prompt_hash": _h(f"p{doc_id}"), "target_hash": _h(str(doc_id)),
            "exact_match": em}


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cli(*argv: str) -> tuple[int, str, str]:
    from quantrack.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- the rules


def test_multiple_choice_metric_rule_and_option(tmp_path: Path) -> None:
    path = write(tmp_path / f"samples_capitals_{DATE}.jsonl",
                 [mc_line(0, 1.0), mc_line(1, 0.0, 1.0), mc_line(2, 1.0, 0.0, lls=(-5.0, -1.0, -2.0))])
    res, recs = import_result(path, "lm-eval")
    assert res.task == "capitals" and res.settings["lm_eval_metric"] == "acc"  # first of 'metrics'
    assert res.settings["metric_rule"].startswith("first metric") and res.settings["filter"] == "none"
    assert (res.n, res.correct) == (3, 2) and res.source == "imported:lm-eval"
    assert sorted(recs) == [0, 1, 2] and recs[1].correct is False
    assert recs[0].prompt_sha256 == _h("Question: capital of country 0?\nAnswer:")
    assert recs[0].extra == {"doc_hash": _h("doc0"), "target_hash": _h("0")}
    assert recs[2].extracted == 1  # the choice with the highest loglikelihood, from lm-eval's string pairs
    res, recs = import_result(path, metric="acc_norm")
    assert (res.correct, res.settings["metric_rule"]) == (2, "--metric") and recs[2].correct is False


def test_generative_filters_need_choosing(tmp_path: Path) -> None:
    rows = [gen_line(i, float(i % 2), f) for f in ("first-number", "whole") for i in range(4)]
    rows[4]["exact_match"] = 1  # doc 0 under 'whole'
    path = write(tmp_path / f"samples_sums_{DATE}.jsonl", rows)
    with pytest.raises(BadInput, match=r"several filters \(first-number, whole\); pass --filter$"):
        import_result(path)
    res, recs = import_result(path, lm_eval_filter="whole")
    assert res.correct == 3 and recs[0].correct is True and recs[0].response == " 0!" and recs[0].extracted == "0"
    res, _ = import_result(path, lm_eval_filter="first-number")
    assert res.correct == 2 and res.settings["lm_eval_filters"] == ["first-number", "whole"]
    with pytest.raises(BadInput, match=r"^--filter 'strict-match': not in samples_sums_.* \(filters: "):
        import_result(path, lm_eval_filter="strict-match")
    with pytest.raises(BadInput, match=r":5: no 'pass@1' \(metrics: exact_match\)$"):
        import_result(path, metric="pass@1", lm_eval_filter="whole")


def test_pass_at_1_and_a_results_file_beside(tmp_path: Path) -> None:
    rows = [{**gen_line(i, 0, "create_test"), "metrics": ["pass@1"], "pass@1": float(i < 2)} for i in range(3)]
    del rows[0]["exact_match"]
    write(tmp_path / f"samples_humaneval_local_{DATE}.jsonl", rows)
    results = {"results": {"humaneval_local": {"pass@1,create_test": 2 / 3}}, "configs": {},
               "n-samples": {"humaneval_local": {"original": 3, "effective": 3}}, "n-shot": {"humaneval_local": 0}}
    rpath = tmp_path / f"results_{DATE}.json"
    rpath.write_text(json.dumps(results))
    res, recs = import_result(rpath)
    assert res.task == "humaneval_local" and res.settings["lm_eval_metric"] == "pass@1" and res.correct == 2
    assert res.settings["n-shot"] == 0 and recs is not None
    results["results"]["humaneval_local"]["pass@1,create_test"] = 1.0
    rpath.write_text(json.dumps(results))
    with pytest.raises(BadInput, match=r"per-sample pass@1,create_test gives 0.66.* says 1.0; .*different runs$"):
        import_result(rpath)


def test_results_without_samples_need_metric(tmp_path: Path) -> None:
    rpath = tmp_path / f"results_{DATE}.json"
    rpath.write_text(json.dumps({"results": {"arc": {"acc,none": 0.5, "acc_norm,none": 0.75}},
                                 "n-samples": {"arc": {"effective": 4}}}))
    res, recs = import_result(rpath, metric="acc_norm")
    assert recs is None and res.task == "arc" and res.correct == 3 and res.ci_low is not None
    code, out, _ = cli("eval", "import", str(rpath), "--metric", "acc")
    assert code == 0 and out.startswith("arc acc (lm-eval, filter none"), out


def test_an_unknown_metric_is_one_line_exit_2(tmp_path: Path) -> None:
    """--metric names a metric the file does not hold: refused, one line, nothing written."""
    rpath = tmp_path / f"results_{DATE}.json"
    rpath.write_text(json.dumps({"results": {"arc": {"acc,none": 0.5}}, "n-samples": {"arc": {"effective": 4}}}))
    out = tmp_path / "imported.json"
    code, _out, err = cli("eval", "import", str(rpath), "--metric", "bleu", "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bleu" in err, err
    assert not out.exists()


# ---------------------------------------------------------------- pairing


def test_compare_pairs_on_same_prompt_hash_and_counts_dropped(tmp_path: Path) -> None:
    base = write(tmp_path / f"base_samples_capitals_{DATE}.jsonl",
                 [mc_line(i, 1.0) for i in range(6)])
    arm_rows = [mc_line(i, 0.0 if i in (1, 2) else 1.0) for i in range(6)]
    arm_rows[3] = mc_line(3, 0.0, prompt="another prompt")  # same doc_id, other prompt: not the same question
    arm_rows[4]["target_hash"] = _h("1")  # same prompt, other gold
    arm = write(tmp_path / f"arm_samples_capitals_{DATE}.jsonl", arm_rows + [mc_line(6, 1.0)])
    rep = compare_runs(str(base), str(arm))
    assert rep["paired"] and rep["metric"] == "acc" and rep["filter"] == "none"
    c = rep["comparison"]
    assert (c["n"], c["base_only"], c["arm_only"]) == (4, 2, 0)
    assert rep["excluded"] == {"only_in_base": 0, "only_in_arm": 1, "errored_in_either": 0,
                               "prompt_hash_differs": 1, "doc_or_target_hash_differs": 1}
    code, out, err = cli("eval", "compare", str(base), str(arm))
    assert code == 0, err
    assert "Paired on 4 questions" in out and f"base_samples_capitals_{DATE}" in out
    assert "dropped: 1 samples whose prompt_hash differs, 1 whose doc or target hash differs" in out
    assert "McNemar p =" in out and "95% CI" in out
    with pytest.raises(BadInput, match=r"^base is scored by acc \(filter none\), arm by exact_match"):
        compare_runs(str(base), str(write(tmp_path / f"samples_sums_{DATE}.jsonl", [gen_line(0, 1, "none")])))


def test_compare_names_task_and_metric(tmp_path: Path) -> None:
    a = write(tmp_path / f"samples_capitals_{DATE}.jsonl", [mc_line(i, 1.0, float(i % 2)) for i in range(4)])
    b = write(tmp_path / "b.jsonl", [mc_line(i, 1.0, 1.0) for i in range(4)])
    code, out, err = cli("eval", "compare", str(a), str(b), "--metric", "acc_norm")
    assert code == 0, err
    assert "capitals / b acc_norm" in out  # b.jsonl names no task: its stem
    rep = compare_runs(str(a), str(b), metric="acc_norm")
    assert rep["comparison"]["arm_only"] == 2 and rep["excluded"]["prompt_hash_differs"] == 0


# ---------------------------------------------------------------- hostile files: one line, exit 2, nothing created


def _refused(tmp_path: Path, path: Path, *args: str) -> str:
    out = tmp_path / "out.json"
    code, _, err = cli("eval", "import", str(path), "--out", str(out), *args)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and "a bug" not in err, err
    assert not out.exists()
    return err


@pytest.mark.parametrize(("edit", "words"), [
    ({"acc": -1.0}, "acc -1.0 is outside [0, 1]"),
    ({"acc": 2}, "acc 2 is outside [0, 1]"),
    ({"acc": 0.5}, "acc 0.5 is not 0 or 1"),
    ({"acc": float("nan")}, "acc is NaN"),
    ({"acc": "1"}, "acc '1' is not a number"),
    ({"doc_id": None}, "doc_id None is not a document index"),
    ({"prompt_hash": None}, "prompt_hash missing; pairing needs"),
    ({"doc_hash": [1]}, "doc_hash [1], not a sha256 hex digest"),
])
def test_bad_sample_values(tmp_path: Path, edit: dict[str, Any], words: str) -> None:
    rows = [mc_line(0, 1.0), {**mc_line(1, 1.0), **edit}]
    path = tmp_path / f"samples_capitals_{DATE}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")  # NaN as lm-eval's json.dumps writes it
    err = _refused(tmp_path, path)
    assert f"samples_capitals_{DATE}.jsonl:2: {words}" in err, err


def test_missing_and_duplicate_doc_id(tmp_path: Path) -> None:
    row = mc_line(0, 1.0)
    del row["doc_id"]
    err = _refused(tmp_path, write(tmp_path / f"samples_capitals_{DATE}.jsonl", [mc_line(1, 1.0), row]))
    assert err.endswith(":2: no doc_id (not an lm-eval sample line)\n"), err
    dup = write(tmp_path / f"samples_capitals_{DATE}.jsonl", [mc_line(0, 1.0), mc_line(0, 1.0, prompt="other")])
    assert "doc_id 0 already on line 1 for filter 'none' with different hashes" in _refused(tmp_path, dup)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    lines = tmp_path / f"samples_capitals_{DATE}.jsonl"
    lines.write_text(json.dumps(mc_line(0, 1.0)) + "\n" + deep + "\n")
    assert "JSON nested too deeply" in _refused(tmp_path, lines)
    first = tmp_path / "x.jsonl"
    first.write_text(deep + "\n")
    assert "JSON nested too deeply" in _refused(tmp_path, first)
    results = tmp_path / f"results_{DATE}.json"
    results.write_text('{"results": ' + deep + "}")
    assert "JSON nested too deeply" in _refused(tmp_path, results)
    code, _, err = cli("eval", "compare", str(lines), str(lines))
    assert code == 2 and err.count("\n") == 1 and "nested too deeply" in err


@pytest.mark.parametrize("value", [[1, 2], "five", {"capitals": [3]}, {"capitals": "3"}])
def test_odd_n_samples_and_n_shot(tmp_path: Path, value: Any) -> None:
    write(tmp_path / f"samples_capitals_{DATE}.jsonl", [mc_line(i, 1.0) for i in range(3)])
    rpath = tmp_path / f"results_{DATE}.json"
    rpath.write_text(json.dumps({"results": {"capitals": {"acc,none": 1.0}}, "n-samples": value, "n-shot": value}))
    res, recs = import_result(rpath)  # neither says anything usable: the count comes from the samples
    assert res.n == 3 and res.settings["n-shot"] is None and recs is not None
    # the GSM8K path reads n-shot too: a list or a string there is no traceback either
    from tests.unit.test_importers_family import RESULTS

    gpath = tmp_path / "g" / f"results_{DATE}.json"
    gpath.parent.mkdir()
    gpath.write_text(json.dumps({**RESULTS, "n-shot": value, "n-samples": value}))
    res, _ = import_result(gpath)
    assert res.task == "gsm8k" and res.settings["n-shot"] is None


def test_bad_count_in_n_samples(tmp_path: Path) -> None:
    write(tmp_path / f"samples_capitals_{DATE}.jsonl", [mc_line(0, 1.0)])
    rpath = tmp_path / f"results_{DATE}.json"
    rpath.write_text(json.dumps({"results": {"capitals": {"acc,none": 1.0}},
                                 "n-samples": {"capitals": {"effective": [1]}}}))
    assert "'n-samples.capitals.effective' is '[1]', not a whole number" in _refused(tmp_path, rpath)


def test_fifo_and_dev_zero_are_not_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / f"samples_capitals_{DATE}.jsonl"
    os.mkfifo(fifo)
    assert _refused(tmp_path, fifo).endswith(f"{fifo}: not a regular file\n")
    assert _refused(tmp_path, Path("/dev/zero"), "--format", "lm-eval").endswith("/dev/zero: not a regular file\n")
    code, _, err = cli("eval", "compare", str(fifo), "/dev/zero")
    assert code == 2 and err.endswith(": not a regular file\n"), err
