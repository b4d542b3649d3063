"""Prompt construction, shipped data and payloads (vLLM gsm8k_eval.py, engine-facts.md §5.1)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quantrack.accuracy import gsm8k
from quantrack.errors import BadInput
from quantrack.resources import data_dir

SHIPPED = data_dir() / "gsm8k"


def test_shipped_test_split_is_byte_identical_to_upstream() -> None:
    # upstream openai/grade-school-math grade_school_math/data/test.jsonl (1319 lines, 749,738 bytes)
    shipped = (SHIPPED / "test.jsonl").read_bytes()
    assert len(shipped) == 749_738 and shipped.count(b"\n") == 1319
    assert hashlib.sha256(shipped).hexdigest() == gsm8k.TEST_SHA256


def test_shipped_train_split_is_byte_identical_to_upstream(shared_data: Path) -> None:
    # the whole split: lm-eval's sampler draws exemplars from all 7,473 rows
    shipped = (SHIPPED / "train.jsonl").read_bytes()
    assert shipped == (shared_data / "gsm8k" / "train.jsonl").read_bytes()
    assert hashlib.sha256(shipped).hexdigest() == gsm8k.TRAIN_SHA256


def test_sha256sums_file_matches_shipped_files() -> None:
    lines = (SHIPPED / "SHA256SUMS").read_text().split("\n")
    entries = dict(reversed(line.split("  ", 1)) for line in lines if line.strip())
    assert set(entries) == {"test.jsonl", "train.jsonl", "LICENSE"}
    for name, digest in entries.items():
        assert hashlib.sha256((SHIPPED / name).read_bytes()).hexdigest() == digest
    assert "MIT License" in (SHIPPED / "LICENSE").read_text()


def test_prompt_layout_matches_vllm_gsm8k_eval() -> None:
    # vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py:L175-L203 (quoted in engine-facts.md §5.1)
    data = gsm8k.load_data(5)
    assert len(data.test) == 1319 and len(data.shots) == 5
    fewshot = gsm8k.build_fewshot(data.shots)
    prompt = gsm8k.build_prompt(fewshot, data.test[0]["question"])
    first = data.shots[0]
    assert prompt.startswith(f"Question: {first['question']}\nAnswer: {first['answer']}\n\nQuestion: ")
    assert prompt.endswith(f"Question: {data.test[0]['question']}\nAnswer:")
    assert prompt.count("Question: ") == 6 and prompt.count("\n\n") == 5
    assert gsm8k.build_prompt(gsm8k.build_fewshot([]), "Q?") == "Question: Q?\nAnswer:"


def test_prompt_hash_is_lm_eval_prompt_hash() -> None:
    # lm-eval logs prompt_hash = sha256(prompt.encode("utf-8")).hexdigest()
    # (EleutherAI/lm-evaluation-harness@4e7e0d4:lm_eval/utils.py:L129-L130)
    assert gsm8k.prompt_sha256("Question: x\nAnswer:") == hashlib.sha256(b"Question: x\nAnswer:").hexdigest()


def test_shipped_data_gives_any_number_of_shots() -> None:
    data = gsm8k.load_data(8)
    assert len(data.train) == 7473 and len(data.shots) == 8 and data.shots == data.train[:8]
    with pytest.raises(BadInput, match=r"^--num-shots 7474: the train split has only 7473 examples$"):
        gsm8k.load_data(7474)


def test_damaged_shipped_file_is_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import quantrack.resources

    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_bytes((SHIPPED / "test.jsonl").read_bytes())
    (tmp_path / "gsm8k" / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    monkeypatch.setattr(quantrack.resources, "data_dir", lambda: tmp_path)
    with pytest.raises(BadInput, match=r"^shipped GSM8K train.jsonl is damaged \(sha256 [0-9a-f]{12}\.\.\., "
                                       r"expected 17f347dc5147\.\.\.\); reinstall quantrack or pass --data-dir$"):
        gsm8k.load_data(5)


def test_data_dir_is_hash_checked(tmp_path: Path, shared_data: Path) -> None:
    (tmp_path / "test.jsonl").write_bytes((shared_data / "gsm8k" / "test.jsonl").read_bytes())
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(BadInput, match=r"train.jsonl sha256 [0-9a-f]{12}\.\.\. does not match upstream 17f347dc5147"):
        gsm8k.load_data(5, tmp_path)


def test_full_data_dir_gives_more_shots(shared_data: Path) -> None:
    data = gsm8k.load_data(8, shared_data / "gsm8k")
    assert len(data.shots) == 8 and data.source == str(shared_data / "gsm8k")
    head = (SHIPPED / "train.jsonl").read_text().splitlines()[:8]
    assert data.shots == [json.loads(x) for x in head]


def test_first_n_exemplars_are_train_rows_in_order() -> None:
    # vLLM gsm8k_eval.py range(num_shots); lm-eval FirstNSampler pool[:n]
    assert gsm8k.fewshot_ids("first_n", num_questions=3, num_shots=5, pool_size=7473) == [[0, 1, 2, 3, 4]] * 3
    assert gsm8k.fewshot_ids("lm-eval", num_questions=2, num_shots=0, pool_size=7473) == [[], []]


def test_lm_eval_sampler_is_one_seeded_stream_over_questions() -> None:
    import random

    ids = gsm8k.fewshot_ids("lm-eval", num_questions=1319, num_shots=5, pool_size=7473)
    rnd = random.Random(1234)  # what lm-eval does: one Random(fewshot seed), rnd.sample(train, 5) per document
    assert ids == [rnd.sample(range(7473), 5) for _ in range(1319)]
    assert all(len(set(x)) == 5 and all(0 <= i < 7473 for i in x) for x in ids)
    # the first N questions draw the same exemplars as the first N of a full run (lm-eval --limit N)
    assert gsm8k.fewshot_ids("lm-eval", num_questions=5, num_shots=5, pool_size=7473) == ids[:5]
    assert ids[0] != [0, 1, 2, 3, 4] and len({tuple(x) for x in ids}) == 1319
    other = gsm8k.fewshot_ids("lm-eval", num_questions=5, num_shots=5, pool_size=7473, seed=7)
    assert other != ids[:5]


def test_unknown_sampler_lists_choices() -> None:
    with pytest.raises(BadInput, match=r"^unknown few-shot sampler .random."):
        gsm8k.fewshot_ids("random", num_questions=1, num_shots=5, pool_size=10)


def test_default_sampler_follows_the_style() -> None:
    assert gsm8k.default_sampler("vllm") == "first_n" and gsm8k.default_sampler("lm-eval") == "lm-eval"


def test_payload_vllm_style() -> None:
    # completions payload and stop strings: gsm8k_eval.py L100-L110, L303
    p = gsm8k.build_payload("P", style="vllm", max_tokens=256, temperature=0.0, seed=42, model="m")
    assert p == {"prompt": "P", "max_tokens": 256, "stop": ["Question", "Assistant:", "<|separator|>"],
                 "temperature": 0.0, "seed": 42, "model": "m"}
    lm = gsm8k.build_payload("P", style="lm-eval", max_tokens=8, temperature=0.0, seed=1, model=None)
    assert lm["stop"] == ["Question:", "</s>", "<|im_end|>"] and "model" not in lm


def test_parse_completion_from_real_llamacpp_response(shared_data: Path) -> None:
    body = json.loads((shared_data / "llamacpp-cpu" / "resp-Q4_0-kvf16.json").read_text())
    text, pt, ct = gsm8k.parse_completion(body)
    assert text == body["choices"][0]["text"] and isinstance(text, str)
    assert pt == body["usage"]["prompt_tokens"] and ct == body["usage"]["completion_tokens"]


@pytest.mark.parametrize("body", [[], {"choices": []}, {"choices": [{"text": None}]}])
def test_parse_completion_rejects_malformed(body: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        gsm8k.parse_completion(body)


@pytest.mark.parametrize(("given", "want"), [
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
])
def test_base_url(given: str, want: str) -> None:
    assert gsm8k.normalize_base_url(given) == want


def test_base_url_errors() -> None:
    with pytest.raises(BadInput, match=r"^--base-url '127.0.0.1:8000': expected http://HOST:PORT$"):
        gsm8k.normalize_base_url("127.0.0.1:8000")
    with pytest.raises(BadInput, match="put no credentials in the URL"):
        gsm8k.normalize_base_url("http://user:pw@127.0.0.1:8000")
