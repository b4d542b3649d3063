"""Real lm-eval 0.4.13 output beside quantrack's on the same server (tests/data/eval/lm-eval-0.4.13-smollm2/).

Captured by tests/integration/test_lm_eval_parity.py (its README gives the command): lm-eval's stock gsm8k on
the shipped files, then `quantrack eval --style lm-eval`, 5 questions, one llama.cpp server, a recording
proxy. These checks need no server, so they guard the importer and the scorer on a real lm-eval file.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantrack.accuracy.gsm8k import fewshot_ids, prompt_sha256, score
from quantrack.accuracy.importers import import_result, result_json
from quantrack.accuracy.paired import compare_runs
from quantrack.accuracy.records import load_records

CAP = Path(__file__).resolve().parents[1] / "data" / "eval" / "lm-eval-0.4.13-smollm2"
RESULTS = next(CAP.glob("results_*.json"))
SAMPLES = [json.loads(x) for x in next(CAP.glob("samples_gsm8k_local_*.jsonl")).read_text().splitlines() if x]
OURS = CAP / "quantrack.jsonl"


def test_real_lm_eval_file_imports_with_both_filters() -> None:
    res, recs = import_result(RESULTS)
    data = json.loads(RESULTS.read_text())
    assert data["lm_eval_version"] == "0.4.13"
    assert res.task == "gsm8k_local" and res.source == "imported:lm-eval" and recs is not None
    assert sorted(recs) == list(range(5)) and res.n == 5
    assert res.accuracy == data["results"]["gsm8k_local"]["exact_match,strict-match"]
    assert res.extra["accuracy_flexible"] == data["results"]["gsm8k_local"]["exact_match,flexible-extract"]
    assert (res.settings["fewshot_sampler"], res.settings["fewshot_seed"]) == ("default", 1234)


def test_quantrack_scorer_reproduces_lm_evals_verdicts_on_its_responses() -> None:
    for row in SAMPLES:
        sc = score("lm-eval", row["resps"][0][0], row["target"])
        if row["filter"] == "strict-match":
            assert (sc.extracted or "[invalid]") == row["filtered_resps"][0]
            assert sc.correct is bool(row["exact_match"])
        else:
            assert (sc.extra["extracted_flexible"] or "[invalid]") == row["filtered_resps"][0]
            assert sc.extra["correct_flexible"] is bool(row["exact_match"])


def test_same_prompts_exemplars_and_responses_as_quantrack() -> None:
    recs = load_records(OURS)
    shots = fewshot_ids("lm-eval", num_questions=5, num_shots=5, pool_size=7473)
    for row in (r for r in SAMPLES if r["filter"] == "strict-match"):
        rec = recs[row["doc_id"]]
        assert row["prompt_hash"] == prompt_sha256(row["arguments"]["gen_args_0"]["arg_0"]) == rec.prompt_sha256
        assert row["resps"][0][0] == rec.response and rec.fewshot_ids == shots[row["doc_id"]]
    log = json.loads((CAP / "proxy-log.json").read_text())
    for side in ("lm-eval", "quantrack"):
        assert len(log[side]) == 5 and {e["request"]["seed"] for e in log[side]} == {1234}


def test_paired_comparison_has_no_discordant_question(tmp_path: Path) -> None:
    res, recs = import_result(RESULTS)
    imported = tmp_path / "imported.json"
    imported.write_text(result_json(res, recs))
    report = compare_runs(str(OURS), str(imported))
    assert report["paired"] is True and report["comparison"]["n"] == 5
    assert report["comparison"]["base_only"] == report["comparison"]["arm_only"] == 0
