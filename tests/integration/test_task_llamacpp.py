"""A user's JSONL task against a real llama.cpp server (SmolLM2-135M-Instruct via xllamacpp), every built-in scorer
and a module:function one, through the real CLI; two runs paired by `eval compare`.

A 135M model answers these badly: the point is the pipeline (requests, records with string ids, the task's SHA-256
in the meta, the metric named after the task, pairing), not its score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ITEMS: dict[str, list[dict]] = {
    "capitals": [  # exact
        {"id": "fr", "prompt": "Q: What is the capital of France?\nA:", "reference": ["Paris", "Paris."]},
        {"id": "it", "messages": [{"role": "user", "content": "Capital of Italy? One word."}], "reference": "Rome"},
        {"id": "jp", "prompt": "Q: What is the capital of Japan?\nA:", "reference": "Tokyo"},
    ],
    "sums": [  # numeric
        {"id": "s1", "prompt": "Question: 2 + 3 = ?\nAnswer:", "reference": 5},
        {"id": "s2", "prompt": "Question: 10 + 20 = ?\nAnswer:", "reference": "30"},
        {"id": "s3", "messages": [{"role": "user", "content": "What is 7 times 6? Reply with a number."}],
         "reference": 42},
    ],
    "colours": [  # choice
        {"id": "sky", "prompt": "The sky on a clear day is\nA. green\nB. blue\nC. red\nAnswer:", "reference": "B",
         "choices": ["green", "blue", "red"]},
        {"id": "grass", "prompt": "Grass is usually\nA. green\nB. blue\nC. red\nAnswer:", "reference": "A",
         "choices": ["green", "blue", "red"]},
    ],
    "yesno": [  # regex
        {"id": "y1", "prompt": "Is water wet? Answer yes or no.\nAnswer:", "reference": "yes"},
        {"id": "y2", "prompt": "Is fire cold? Answer yes or no.\nAnswer:", "reference": "no"},
    ],
    "pycode": [  # code
        {"id": "add", "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"Return a + b.\"\"\"\n",
         "reference": "def check(f):\n    assert f(2, 3) == 5\n    assert f(-1, 1) == 0\n", "entry_point": "add"},
        {"id": "neg", "prompt": "def negate(x: int) -> int:\n    \"\"\"Return -x.\"\"\"\n",
         "reference": "def check(f):\n    assert f(4) == -4\n", "entry_point": "negate"},
    ],
    "mine": [  # module:function
        {"id": "m1", "prompt": "Say hello.\n", "reference": "hello"},
        {"id": "m2", "prompt": "Name a fruit.\n", "reference": "apple"},
    ],
}
SCORERS = {"capitals": "exact", "sums": "numeric", "colours": "choice", "yesno": r"regex:(?i)\b(yes|no)\b",
           "pycode": "code", "mine": "t38_scorer:contains"}


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


def _task(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in ITEMS[name]))
    return p


@pytest.mark.parametrize("name", list(ITEMS))
def test_task_file_each_scorer_end_to_end(name: str, llamacpp_server: str, tmp_path: Path,
                                          invoke: Callable[..., tuple[int, str, str]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t38_scorer.py").write_text("def contains(response, item):\n"
                                            "    return item['reference'] in response.lower()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = _task(tmp_path, name)
    out = tmp_path / "records.jsonl"
    code, stdout, err = invoke("eval", "--task", str(task), "--scorer", SCORERS[name], "--base-url", llamacpp_server,
                               "--max-tokens", "48" if name == "pycode" else "16", "--concurrency", "2",
                               "--output", str(out), "--json")
    assert code == 0, err
    res = json.loads(stdout)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == sorted(i["id"] for i in ITEMS[name])
    assert all(r["error"] is None and isinstance(r["response"], str) and isinstance(r["correct"], bool) for r in recs)
    assert res["task"] == name and res["n"] == len(ITEMS[name]) and res["correct"] == sum(r["correct"] for r in recs)
    meta = json.loads((tmp_path / "records.jsonl.meta.json").read_text())
    assert meta["task_sha256"] == hashlib.sha256(task.read_bytes()).hexdigest() == res["settings"]["task_sha256"]
    assert meta["scorer"] == SCORERS[name]
    if name == "pycode":
        assert {r["extra"]["sandbox"] for r in recs} <= {"passed", "failed", "timeout"}
    print(name, SCORERS[name], f"{res['correct']}/{res['n']}", [r["response"][:40] for r in recs])


def test_two_runs_of_a_task_pair_with_eval_compare(llamacpp_server: str, tmp_path: Path,
                                                   invoke: Callable[..., tuple[int, str, str]]) -> None:
    task = tmp_path / "arith.jsonl"
    task.write_text("".join(json.dumps({"id": f"a{i}", "prompt": f"Question: {i} + {i + 1} = ?\nAnswer:",
                                        "reference": 2 * i + 1}) + "\n" for i in range(8)))
    runs = {}
    for label, temp in (("greedy", "0"), ("hot", "1.5")):
        runs[label] = tmp_path / f"{label}.jsonl"
        code, _out, err = invoke("eval", "--task", str(task), "--scorer", "numeric", "--base-url", llamacpp_server,
                                 "--max-tokens", "8", "--concurrency", "2", "--temperature", temp, "--seed", "7",
                                 "--output", str(runs[label]))
        assert code == 0, err
    code, out, err = invoke("eval", "compare", str(runs["greedy"]), str(runs["hot"]), "--format", "json")
    assert code == 0, err
    rep = json.loads(out)
    c = rep["comparison"]
    assert rep["paired"] and c["n"] == 8 and rep["excluded"]["only_in_base"] == 0
    base = {json.loads(x)["id"]: json.loads(x)["correct"] for x in runs["greedy"].read_text().splitlines()}
    arm = {json.loads(x)["id"]: json.loads(x)["correct"] for x in runs["hot"].read_text().splitlines()}
    assert c["base_only"] == sum(base[q] and not arm[q] for q in base)
    assert c["arm_only"] == sum(arm[q] and not base[q] for q in base)
    code, table, _ = invoke("eval", "compare", str(runs["greedy"]), str(runs["hot"]))
    assert code == 0 and "Paired on 8 questions" in table and "arith" in table.splitlines()[1]
    print(table)


def test_humaneval_first_problems_run_in_the_sandbox(llamacpp_server: str, tmp_path: Path,
                                                      invoke: Callable[..., tuple[int, str, str]]) -> None:
    out = tmp_path / "he.jsonl"
    code, stdout, err = invoke("eval", "--task", "humaneval", "--num-questions", "4", "--base-url", llamacpp_server,
                               "--max-tokens", "96", "--concurrency", "2", "--output", str(out), "--json")
    assert code == 0, err
    res = json.loads(stdout)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert res["task"] == "humaneval" and res["n"] == 4 and res["settings"]["scorer"] == "code"
    assert sorted(r["id"] for r in recs) == [f"HumanEval/{i}" for i in range(4)]
    assert res["settings"]["stop"] == ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
    assert all(r["extra"]["sandbox"] in ("passed", "failed", "timeout") for r in recs)
    assert res["correct"] == sum(r["extra"]["sandbox"] == "passed" for r in recs)
    print("humaneval 4:", res["correct"], [r["extra"]["sandbox_detail"][:60] for r in recs])
