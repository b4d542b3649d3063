"""Task files (quantrack.accuracy.tasks): the format's checks, the scorers, string-id records paired by eval compare."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from quantrack.accuracy.gsm8k import prompt_sha256
from quantrack.accuracy.records import QuestionRecord, RecordWriter, load_records, write_meta
from quantrack.accuracy.scorers import extract_choice, get_scorer, normalize
from quantrack.accuracy.tasks import build_request, item_prompt_text, load_task
from quantrack.errors import BadInput


@pytest.fixture
def invoke(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    from quantrack.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


GOOD = {"id": "q1", "prompt": "2+2=", "reference": 4}


@pytest.mark.parametrize(("lines", "message"), [
    ([GOOD, {"prompt": "x", "reference": "y"}], ":2: no 'id'"),
    ([GOOD, {**GOOD}], ":2: duplicate id 'q1' (first on line 1)"),
    ([GOOD, {"id": "q2", "prompt": "x"}], ":2: item 'q2': no 'reference'"),
    ([GOOD, "{not json"], ":2: not valid JSON (Expecting property name enclosed in double quotes)"),
    ([{"id": 3, "prompt": "x", "reference": "y"}], ":1: 'id' must be a non-empty string, got 3"),
    ([{"id": "a", "reference": "y"}], ":1: item 'a': give exactly one of 'prompt' (text) and 'messages' (chat)"),
])
def test_bad_task_file_one_line_exit_2_nothing_created(tmp_path: Path, invoke: Callable[..., tuple[int, str, str]],
                                                        lines: list, message: str) -> None:
    task = tmp_path / "mine.jsonl"
    task.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    out = tmp_path / "records.jsonl"
    code, _out, err = invoke("eval", "--task", str(task), "--scorer", "exact", "--base-url", "http://127.0.0.1:9",
                               "--output", str(out))
    assert code == 2
    assert err.strip().splitlines() == [f"quantrack: error: {task}{message}"], err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl"]


@pytest.mark.parametrize(("args", "message"), [
    (["--num-shots", "3"], "--num-shots applies to the GSM8K tasks, not to --task"),
    (["--style", "lm-eval"], "--style applies to the GSM8K tasks, not to --task"),
    (["--fewshot-seed", "7"], "--fewshot-seed applies to the GSM8K tasks, not to --task"),
    (["--order", "sideways"], "--order: expected one of natural, shuffled"),
])
def test_gsm8k_options_on_a_task_file_are_refused(tmp_path: Path, invoke: Callable[..., tuple[int, str, str]],
                                                  args: list[str], message: str) -> None:
    """Every option takes effect or is refused: a task file is not asked with GSM8K's exemplars or styles."""
    task = tmp_path / "mine.jsonl"
    task.write_text(json.dumps({"id": "a", "prompt": "p", "reference": "r"}) + "\n")
    out = tmp_path / "records.jsonl"
    code, _out, err = invoke("eval", "--task", str(task), "--scorer", "exact", "--base-url", "http://127.0.0.1:9",
                             "--output", str(out), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_task_sha256_and_items(tmp_path: Path) -> None:
    import hashlib

    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({"id": "c", "messages": [{"role": "user", "content": "hi"}],
                                                            "reference": ["hello", "hi"]}) + "\n")
    t = load_task(task)
    assert t.name == "t" and [i["id"] for i in t.items] == ["q1", "c"]
    assert t.sha256 == hashlib.sha256(task.read_bytes()).hexdigest()
    ep, payload = build_request(t.items[1], chat=False, max_tokens=8, temperature=0.0, seed=1, stop=[], model="m")
    assert ep == "/v1/chat/completions" and payload["messages"] == [{"role": "user", "content": "hi"}]
    ep, payload = build_request(t.items[0], chat=False, max_tokens=8, temperature=0.0, seed=1, stop=["\n"], model=None)
    assert ep == "/v1/completions" and payload["prompt"] == "2+2=" and payload["stop"] == ["\n"]
    ep, payload = build_request(t.items[0], chat=True, max_tokens=8, temperature=0.0, seed=1, stop=[], model=None)
    assert ep == "/v1/chat/completions" and payload["messages"] == [{"role": "user", "content": "2+2="}]
    assert item_prompt_text(t.items[0]) == "2+2="


def test_exact_normalisation() -> None:
    s = get_scorer("exact")
    assert normalize("  Paris. ") == "paris" and normalize('"Paris"') == "paris"
    assert s("  PARIS.\n", {"reference": "Paris"}).correct
    assert s("Lyon", {"reference": ["Paris", "Lyon"]}).correct
    assert not s("Paris, France", {"reference": "Paris"}).correct


def test_numeric_last_number_gsm8k_rule() -> None:
    s = get_scorer("numeric")
    assert s("so 1,234 apples", {"reference": 1234}).correct
    assert s("first 3 then -7.", {"reference": -7}).correct
    assert s("The answer is $18.00", {"reference": "18"}).correct
    assert not s("3 then 4", {"reference": 3}).correct  # the last number counts
    v = s("no number here", {"reference": 3})
    assert not v.correct and v.extracted is None


def test_choice_letter_or_text() -> None:
    s = get_scorer("choice")
    item = {"reference": "B", "choices": ["red", "blue", "green"]}
    assert s("B", item).correct and s("(B) blue", item).correct and s("The answer is B.", item).correct
    assert s("Blue", item).correct
    assert not s("A", item).correct
    assert extract_choice("D", ["a", "b"]) is None  # not one of two choices
    assert not s("nothing", item).correct


def test_regex_first_group() -> None:
    s = get_scorer(r"regex:Answer:\s*(\w+)")
    assert s("thinking... Answer: Yes", {"reference": "yes"}).correct
    assert not s("Answer: no", {"reference": "yes"}).correct
    with pytest.raises(BadInput, match="not a regular expression"):
        get_scorer("regex:(")


def test_code_scorer_runs_tests_in_the_sandbox() -> None:
    s = get_scorer("code", code_timeout_s=5)
    item = {"prompt": "def add(a, b):\n", "reference": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    ok = s("    return a + b\n", item)
    assert ok.correct and ok.extra["sandbox"] == "passed"
    assert not s("    return a - b\n", item).correct
    assert s("```python\ndef add(a, b):\n    return b + a\n```", item).correct


def test_user_scorer_and_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myscore_t38.py").write_text("def judge(response, item):\n    return item['reference'] in response\n"
                                             "def bad(response, item):\n    return 'yes'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_scorer("myscore_t38:judge")("it is 42", {"reference": "42"}).correct
    with pytest.raises(TypeError, match="returned str"):
        get_scorer("myscore_t38:bad")("x", {"reference": "x"})
    with pytest.raises(BadInput, match="has no function 'nope'"):
        get_scorer("myscore_t38:nope")
    with pytest.raises(BadInput, match="unknown scorer 'fuzzy'; known: exact, numeric, choice"):
        get_scorer("fuzzy")


def _write_run(path: Path, outcomes: dict[str, bool], task_sha: str) -> None:
    write_meta(path, {"task": "mine", "style": "scorer:exact", "task_sha256": task_sha, "data_sha256": task_sha})
    with RecordWriter(path, resume=False) as w:
        for qid, ok in outcomes.items():
            w.write(QuestionRecord(id=qid, prompt_sha256=prompt_sha256(f"prompt {qid}"), response="r", extracted="r",
                                   gold="g", correct=ok, style="scorer:exact"))


def test_eval_compare_pairs_string_ids(tmp_path: Path, invoke: Callable[..., tuple[int, str, str]]) -> None:
    base, arm = tmp_path / "base.jsonl", tmp_path / "arm.jsonl"
    ids = [f"item-{i}" for i in range(30)]
    _write_run(base, {q: True for q in ids}, "ab" * 32)
    _write_run(arm, {q: i % 3 != 0 for i, q in enumerate(ids[:29])}, "ab" * 32)  # 10 losses, one id missing
    assert set(load_records(base)) == set(ids)
    code, out, err = invoke("eval", "compare", str(base), str(arm), "--format", "json")
    assert code == 0, err
    rep = json.loads(out)
    c = rep["comparison"]
    assert rep["paired"] and c["n"] == 29 and c["base_only"] == 10 and c["arm_only"] == 0
    assert rep["excluded"] == {"only_in_base": 1, "only_in_arm": 0, "errored_in_either": 0}
    assert rep["base"]["accuracy"] == 1.0


def test_mixed_id_types_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"id": 1, "correct": True}) + "\n" + json.dumps({"id": "a", "correct": True}) + "\n")
    with pytest.raises(BadInput, match=":2: record id 'a' mixes integer"):
        load_records(p)


def test_resume_refuses_a_changed_task_file(tmp_path: Path) -> None:
    from quantrack.accuracy.tasks import run_task

    task = tmp_path / "mine.jsonl"
    task.write_text(json.dumps(GOOD) + "\n")
    out = tmp_path / "r.jsonl"
    _write_run(out, {"q1": True}, "00" * 32)
    # the settings run_task writes, from another version of the file
    write_meta(out, {"task": "mine", "order": "natural", "style": "scorer:exact", "num_shots": 0, "max_tokens": 256,
                     "temperature": 0.0, "seed": 42, "data_sha256": "00" * 32, "fewshot_sampler": None,
                     "fewshot_seed": None})
    with pytest.raises(BadInput, match=r"--resume: .* was written with data_sha256='0000"):
        run_task("http://127.0.0.1:9", load_task(task), scorer="exact", records_path=out, resume=True)
