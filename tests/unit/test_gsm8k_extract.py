"""Answer extraction and scoring.

vLLM style: ``get_answer_value`` in vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py:L67-L76 (quoted in
engine-facts.md §5.1): commas removed, last ``\\d+``, ``ast.literal_eval``, INVALID = -9999999.
lm-eval style: EleutherAI/lm-evaluation-harness@4e7e0d4:lm_eval/tasks/gsm8k/gsm8k.yaml L13-L43
(strict-match ``#### (\\-?[0-9\\.\\,]+)`` first match; flexible-extract ``(-?[$0-9.,]{2,})|(-?[0-9]+)``
last match; exact_match ignore_case with regexes_to_ignore ``, \\$ (?s).*####  \\.$``).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from quantrack.accuracy import gsm8k

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"


def vllm_reference(answer_str: str) -> int:
    """The quoted vLLM function, verbatim in behaviour (stdlib re instead of the regex module)."""
    answer_str = answer_str.replace(",", "")
    numbers = re.findall(r"\d+", answer_str)
    if len(numbers) < 1:
        return gsm8k.INVALID
    try:
        return ast.literal_eval(numbers[-1])
    except SyntaxError:
        return gsm8k.INVALID


CASES = [
    " 15\nCatch 20: A catch 20 is a game where two people play against each other.",  # shared llamacpp resp
    "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18",
    "The total is 1,234,567 dollars.",
    "It costs -5 degrees",  # negatives are not captured by vLLM
    "3.75 hours",  # decimals: last run of digits wins
    "no number here",
    "answer: 05",  # literal_eval('05') is a SyntaxError -> INVALID
    "answer: 00",
    "",
]


@pytest.mark.parametrize("text", CASES)
def test_vllm_extraction_matches_reference(text: str) -> None:
    assert gsm8k.extract_vllm(text) == vllm_reference(text)


def test_vllm_extraction_values() -> None:
    assert gsm8k.extract_vllm("The total is 1,234,567 dollars.") == 1234567
    assert gsm8k.extract_vllm("It costs -5 degrees") == 5
    assert gsm8k.extract_vllm("3.75 hours") == 75
    assert gsm8k.extract_vllm("no number here") == gsm8k.INVALID
    assert gsm8k.extract_vllm("answer: 05") == gsm8k.INVALID


def test_gold_answers_all_parse(shared_data: Path) -> None:
    rows = [json.loads(x) for x in (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()]
    golds = [gsm8k.extract_vllm(r["answer"]) for r in rows]
    assert gsm8k.INVALID not in golds
    assert golds[0] == 18  # "... #### 18"


def test_score_vllm_invalid_is_wrong_and_has_no_extraction() -> None:
    s = gsm8k.score("vllm", "I cannot say", "#### 18")
    assert s.extracted is None and s.correct is False and s.gold == 18
    assert gsm8k.score("vllm", " 9 * 2 = 18\n#### 18", "x\n#### 18").correct is True


@pytest.mark.parametrize(("response", "strict", "flexible"), [
    ("He pays 2 * 3 = $6\n#### 6", "6", "6"),
    ("so 1,000 people.\n#### 1,000.", "1,000.", "1,000."),
    ("The answer is $12.50 in total", "[invalid]", "$12.50"),
    ("We get 7", "[invalid]", "7"),
    ("nothing", "[invalid]", "[invalid]"),
])
def test_lm_eval_filters(response: str, strict: str, flexible: str) -> None:
    assert gsm8k.lm_eval_filter(response, gsm8k.LM_EVAL_STRICT, 0) == strict
    assert gsm8k.lm_eval_filter(response, gsm8k.LM_EVAL_FLEXIBLE, -1) == flexible


def test_lm_eval_exact_match_normalization() -> None:
    gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    assert gsm8k.lm_eval_normalize(gold) == "72"
    assert gsm8k.lm_eval_normalize("1,000.") == "1000"
    assert gsm8k.lm_eval_normalize("$12") == "12"


def test_score_lm_eval_strict_and_flexible() -> None:
    gold = "... #### 1000"
    s = gsm8k.score("lm-eval", "so 1,000 people.\n#### 1,000.", gold)
    assert s.correct is True and s.extracted == "1,000." and s.extra["correct_flexible"] is True
    s = gsm8k.score("lm-eval", "The answer is 1000", gold)
    assert s.correct is False and s.extracted is None and s.extra == {"extracted_flexible": "1000",
                                                                      "correct_flexible": True}


def test_real_llamacpp_records_rescore_identically() -> None:
    """Records captured from a real SmolLM2-135M run (tests/data/eval/README.md) re-score the same."""
    data = gsm8k.load_data(5)
    for name in ("smol-q41-max64.jsonl", "smol-q41-lmeval.jsonl"):
        for line in (DATA / name).read_text().splitlines():
            rec = json.loads(line)
            assert rec["error"] is None
            s = gsm8k.score(rec["style"], rec["response"], data.test[rec["id"]]["answer"])
            assert (s.extracted, s.gold, s.correct) == (rec["extracted"], rec["gold"], rec["correct"])
