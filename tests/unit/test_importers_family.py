"""lm-eval results of any GSM8K-family task (gsm8k_cot, gsm8k_cot_llama, local copies), both filters kept.

Variants are made from the format sample in tests/data/eval/lm-eval/ by renaming its task the way lm-eval
names the real ones (lm_eval/tasks/gsm8k/gsm8k-cot.yaml ``task: gsm8k_cot``, gsm8k-cot-llama.yaml
``task: gsm8k_cot_llama``); the file names follow lm_eval/loggers/evaluation_tracker.py:L344-L346
(``samples_<task>_<date>.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantrack.accuracy.importers import import_result, is_gsm8k_family
from quantrack.accuracy.records import QuestionRecord, check_resume_meta, load_records
from quantrack.errors import BadInput

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"
LM = DATA / "lm-eval"
DATE = "2026-11-30T10-15-42.123456"
RESULTS = json.loads((LM / f"results_{DATE}.json").read_text())
SAMPLES = (LM / f"samples_gsm8k_{DATE}.jsonl").read_text()


def _renamed(data: Any, old: str, new: str) -> Any:
    """The results dict with task ``old`` called ``new`` (keys of every per-task section)."""
    out = dict(data)
    for section in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "group_subtasks",
                    "task_hashes"):
        if isinstance(out.get(section), dict) and old in out[section]:
            sec = dict(out[section])
            sec[new] = sec.pop(old)
            if isinstance(sec[new], dict) and "alias" in sec[new]:
                sec[new] = {**sec[new], "alias": new}
            out[section] = sec
    return out


def _write(tmp: Path, data: Any, samples: dict[str, str] | None = None) -> Path:
    path = tmp / f"results_{DATE}.json"
    path.write_text(json.dumps(data))
    for task, text in (samples or {}).items():
        (tmp / f"samples_{task}_{DATE}.jsonl").write_text(text)
    return path


@pytest.mark.parametrize("task", ["gsm8k_cot", "gsm8k_cot_llama", "gsm8k_local_firstn"])
def test_gsm8k_variant_with_samples(tmp_path: Path, task: str) -> None:
    path = _write(tmp_path, _renamed(RESULTS, "gsm8k", task), {task: SAMPLES})
    res, recs = import_result(path)
    assert res.task == task and res.settings["lm_eval_task"] == task
    assert recs is not None and sorted(recs) == list(range(6)) and res.correct == 3
    assert res.records_path == str(tmp_path / f"samples_{task}_{DATE}.jsonl")


def test_both_filters_are_kept(tmp_path: Path) -> None:
    res, recs = import_result(LM / f"results_{DATE}.json")
    assert recs is not None
    flexible = {json.loads(x)["doc_id"]: json.loads(x) for x in SAMPLES.splitlines()
                if json.loads(x)["filter"] == "flexible-extract"}
    for doc, rec in recs.items():
        assert rec.extra["correct_flexible"] is bool(flexible[doc]["exact_match"])
        want = flexible[doc]["filtered_resps"][0]
        assert rec.extra["extracted_flexible"] == (None if want == "[invalid]" else want)
    assert res.extra["accuracy_flexible"] == RESULTS["results"]["gsm8k"]["exact_match,flexible-extract"]
    # the other way round: flexible is the headline, strict rides along
    res2, recs2 = import_result(LM / f"results_{DATE}.json", lm_eval_filter="flexible-extract")
    assert recs2 is not None and all("correct_strict" in r.extra for r in recs2.values())
    assert res2.extra["accuracy_strict"] == RESULTS["results"]["gsm8k"]["exact_match,strict-match"]


def test_both_filters_kept_without_samples(tmp_path: Path) -> None:
    path = _write(tmp_path, _renamed(RESULTS, "gsm8k", "gsm8k_cot"))
    res, recs = import_result(path)
    assert recs is None and res.task == "gsm8k_cot" and res.accuracy == 0.5
    assert res.extra == {"accuracy_flexible": 0.5}


def test_several_gsm8k_tasks_need_task_name(tmp_path: Path) -> None:
    data = _renamed(RESULTS, "gsm8k", "gsm8k_cot_llama")
    for section in ("results", "configs", "n-shot", "n-samples"):
        data[section] = {**data[section], "gsm8k": RESULTS[section]["gsm8k"]}
    path = _write(tmp_path, data, {"gsm8k": SAMPLES})
    with pytest.raises(BadInput, match=r"several GSM8K tasks in results \(gsm8k, gsm8k_cot_llama\); "
                                       r"pass --task-name$"):
        import_result(path)
    res, recs = import_result(path, task_name="gsm8k")
    assert res.task == "gsm8k" and recs is not None
    res, recs = import_result(path, task_name="gsm8k_cot_llama")  # no samples file for this one: accuracy only
    assert res.task == "gsm8k_cot_llama" and recs is None and res.n == 6
    with pytest.raises(BadInput, match=r"--task-name 'gsm8k_cot': not in results_.*\(did you mean "
                                       r"'gsm8k_cot_llama'\?\) \(found: gsm8k, gsm8k_cot_llama\)$"):
        import_result(path, task_name="gsm8k_cot")


def test_local_copy_recognised_by_its_dataset(tmp_path: Path) -> None:
    data = _renamed(RESULTS, "gsm8k", "my_math")
    data["configs"]["my_math"] = {"task": "my_math", "dataset_path": "json",
                                  "dataset_kwargs": {"data_files": {"test": "data/gsm8k/test.jsonl"}}}
    res, _ = import_result(_write(tmp_path, data))
    assert res.task == "my_math"
    assert is_gsm8k_family("gsm8k_cot_zeroshot", None) and not is_gsm8k_family("mmlu", {"dataset_path": "cais/mmlu"})


def test_no_gsm8k_task_and_non_gsm8k_task_name(tmp_path: Path) -> None:
    data = _renamed(RESULTS, "gsm8k", "arc_easy")
    data["configs"]["arc_easy"] = {"task": "arc_easy", "dataset_path": "allenai/ai2_arc"}
    path = _write(tmp_path, data)
    with pytest.raises(BadInput, match=r": no GSM8K task in results \(found: arc_easy\)$"):
        import_result(path)
    with pytest.raises(BadInput, match=r"^--task-name 'arc_easy': not a GSM8K task \(neither its name nor its "
                                       r"dataset says gsm8k\); GSM8K tasks in results_.*: none$"):
        import_result(path, task_name="arc_easy")


def test_group_is_not_a_task(tmp_path: Path) -> None:
    data = _renamed(RESULTS, "gsm8k", "gsm8k_cot")
    data["results"] = {**data["results"], "gsm8k_group": dict(data["results"]["gsm8k_cot"])}
    data["group_subtasks"] = {"gsm8k_group": ["gsm8k_cot"], "gsm8k_cot": []}
    res, _ = import_result(_write(tmp_path, data))
    assert res.task == "gsm8k_cot"


def test_task_name_refused_for_other_formats() -> None:
    with pytest.raises(BadInput, match=r"^--task-name applies to lm-eval results, not --format vllm$"):
        import_result(DATA / "vllm-save-results.json", "vllm", task_name="gsm8k")
    with pytest.raises(BadInput, match=r"^--task-name applies to lm-eval results; .* is a vllm file$"):
        import_result(DATA / "vllm-save-results.json", task_name="gsm8k")


def test_filter_lines_must_pair(tmp_path: Path) -> None:
    lines = [x for x in SAMPLES.splitlines() if not (json.loads(x)["doc_id"] == 4
                                                      and json.loads(x)["filter"] == "flexible-extract")]
    path = tmp_path / f"samples_gsm8k_{DATE}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput, match=r"doc 4 has a line for one filter but not the other"):
        import_result(path)


def test_samples_file_names_its_task(tmp_path: Path) -> None:
    path = tmp_path / f"samples_gsm8k_cot_llama_{DATE}.jsonl"
    path.write_text(SAMPLES)
    res, _ = import_result(path)
    assert res.task == "gsm8k_cot_llama"


# ---------------------------------------------------------------- records keep the exemplar ids


def test_records_keep_fewshot_ids(tmp_path: Path) -> None:
    rec = QuestionRecord(id=3, prompt_sha256="h", response="r", extracted=None, gold="1", correct=False,
                         fewshot_ids=[6374, 3610, 957, 61, 742])
    path = tmp_path / "r.jsonl"
    path.write_text(rec.to_json() + "\n")
    assert load_records(path)[3].fewshot_ids == [6374, 3610, 957, 61, 742]
    path.write_text(json.dumps({"id": 3, "correct": False, "fewshot_ids": ["a"]}) + "\n")
    with pytest.raises(BadInput, match=r"'fewshot_ids' must be a list of integers, got \['a'\]$"):
        load_records(path)


def test_resume_of_a_file_from_before_the_sampler_setting(tmp_path: Path) -> None:
    # real sidecar written before fewshot_sampler existed: its exemplars were train rows 0-4 (first_n)
    out = tmp_path / "r.jsonl"
    out.write_text((DATA / "smol-q41-lmeval.jsonl").read_text())
    meta = json.loads((DATA / "smol-q41-lmeval.jsonl.meta.json").read_text())
    out.with_name(out.name + ".meta.json").write_text(json.dumps(meta))
    same = {**meta, "fewshot_sampler": "first_n", "fewshot_seed": None, "order": "natural"}
    check_resume_meta(out, same)
    with pytest.raises(BadInput, match=r"was written with fewshot_sampler='first_n', this run has "
                                       r"fewshot_sampler='lm-eval'"):
        check_resume_meta(out, {**same, "fewshot_sampler": "lm-eval", "fewshot_seed": 1234})
