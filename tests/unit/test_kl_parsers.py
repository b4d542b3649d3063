"""Request builders and response parsers of quantrack.accuracy.kl, the texts loader and the `eval kl` command.

llama.cpp shapes are real responses (tests/data/kl/, captured from the xllamacpp 2026.10.11549 server).
vLLM and SGLang shapes are built from their source, cited at each builder below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.accuracy import kl
from quantrack.accuracy.texts import default_texts, gsm8k_pair, load_texts
from quantrack.engines import llamacpp, sglang, vllm
from quantrack.errors import BadInput, EnvironmentMissing, NotFound

DATA = Path(__file__).resolve().parents[1] / "data" / "kl"


# --------------------------------------------------------------------------------------------- llama.cpp


def test_llamacpp_real_response_parses_to_top_k_with_greedy_token_first() -> None:
    cap = json.loads((DATA / "llamacpp-completion-nprobs.json").read_text())
    top = llamacpp.parse_llamacpp(cap["response"], 20)
    assert len(top) == 20 and all(isinstance(t, int) for t in top)
    assert all(lp <= 0.0 for lp in top.values())
    # temperature 0: the sampled token is the argmax of the (pre-sampling) distribution
    assert kl.argmax(top) == cap["response"]["completion_probabilities"][0]["id"]
    # full-softmax log-probabilities: a top-20 of a 49k vocabulary holds less than all the mass
    assert 0.0 < kl.position_stats(top, top).base_tail < 1.0
    assert len(llamacpp.parse_llamacpp(cap["response"], 5)) == 5


def test_llamacpp_request_asks_one_token_with_raw_log_probabilities() -> None:
    cap = json.loads((DATA / "llamacpp-completion-nprobs.json").read_text())
    path, body = llamacpp.llamacpp_request(cap["request"]["prompt"], 20)
    assert path == "/completion"
    assert body == cap["request"]  # the request the real server answered above
    assert body["n_predict"] == 1 and body["post_sampling_probs"] is False and body["cache_prompt"] is True


def test_llamacpp_tokenize_real_response() -> None:
    cap = json.loads((DATA / "llamacpp-tokenize.json").read_text())
    path, body = kl.tokenize_request("llamacpp", cap["request"]["content"], True)
    assert (path, body) == ("/tokenize", cap["request"])
    toks = kl.parse_tokenize(cap["response"])
    assert toks == cap["response"]["tokens"] and len(toks) > 10


def test_llamacpp_response_without_probabilities_is_a_clear_error() -> None:
    cap = json.loads((DATA / "llamacpp-completion-nprobs.json").read_text())
    resp = dict(cap["response"])
    resp.pop("completion_probabilities")
    with pytest.raises(ValueError, match="no completion_probabilities"):
        llamacpp.parse_llamacpp(resp, 20)


# -------------------------------------------------------------------------------------------------- vLLM
# Shape from vllm-project/vllm@002032ee2b18:vllm/entrypoints/openai/completion/protocol.py
# (CompletionResponseChoice.prompt_logprobs: list[dict[int, Logprob] | None]) and vllm/logprobs.py Logprob
# (logprob, rank, decoded_token); entry 0 is None; each dict holds the top-k plus the prompt token itself.


def _vllm_response(ids: list[int]) -> dict:
    plp: list = [None]
    for j in range(1, len(ids)):
        entry = {str(100 + r): {"logprob": -0.5 * (r + 1), "rank": r + 1, "decoded_token": f"t{r}"} for r in range(3)}
        entry[str(ids[j])] = {"logprob": -12.0, "rank": 4000, "decoded_token": "x"}  # scored token, outside top-3
        plp.append(entry)
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": "!", "logprobs": None, "finish_reason": "length",
                         "stop_reason": None, "prompt_logprobs": plp}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}}


def test_vllm_request_and_parser() -> None:
    ids = [1, 11, 12, 13, 14]
    path, body = vllm.vllm_request(ids, 3)
    assert path == "/v1/completions"
    assert body["prompt"] == ids and body["prompt_logprobs"] == 3 and body["max_tokens"] == 1
    tops = vllm.parse_vllm(_vllm_response(ids), ids, 2, 3)
    assert len(tops) == 3  # positions 2, 3, 4
    assert all(set(t) == {100, 101, 102} for t in tops)  # the rank-4000 scored token is cut to the top-3
    assert tops[0][100] == -0.5


def test_vllm_parser_rejects_a_short_or_missing_list() -> None:
    ids = [1, 11, 12]
    with pytest.raises(ValueError, match="has 3 entries, expected 4"):
        vllm.parse_vllm(_vllm_response(ids), [*ids, 99], 1, 3)
    with pytest.raises(ValueError, match="no choices"):
        vllm.parse_vllm({"choices": []}, ids, 1, 3)


# ------------------------------------------------------------------------------------------------ SGLang
# Shape from sgl-project/sglang python/sglang/srt/managers/scheduler_output_processor_mixin.py
# (add_input_logprob_return_values: first entry padded with None, one entry per origin_input_ids[start:])
# and tokenizer_manager detokenize_logprob_tokens / detokenize_top_logprobs_tokens ((logprob, id, text) triples).


def _sglang_response(ids: list[int], logprob_start_len: int) -> dict:
    scored = ids[logprob_start_len:]
    tok = [[None, scored[0], None]] + [[-1.0, t, None] for t in scored[1:]]
    top: list = [None] + [[[-0.2, 200 + j, None], [-1.9, 300 + j, None]] for j in range(1, len(scored))]
    return {"text": "!", "output_ids": [5],
            "meta_info": {"id": "r", "prompt_tokens": len(ids), "completion_tokens": 1, "cached_tokens": 0,
                          "input_token_logprobs": tok, "input_top_logprobs": top,
                          "output_token_logprobs": [[-0.1, 5, None]],
                          "output_top_logprobs": [[[-0.1, 5, None], [-2.5, 6, None]]]}}


def test_sglang_request_and_parser_align_on_logprob_start_len() -> None:
    ids = [1, 2, 3, 4, 5, 6]
    start = 3
    path, body = sglang.sglang_request(ids, start, 2)
    assert path == "/generate"
    assert body["logprob_start_len"] == start - 1 and body["top_logprobs_num"] == 2
    assert body["input_ids"] == ids and body["return_logprob"] is True
    tops = sglang.parse_sglang(_sglang_response(ids, start - 1), ids, start, 2)
    assert [sorted(t) for t in tops] == [[201, 301], [202, 302], [203, 303]]  # ids[3], ids[4], ids[5]


def test_sglang_parser_catches_misalignment() -> None:
    ids = [1, 2, 3, 4, 5, 6]
    resp = _sglang_response([1, 2, 3, 9, 5, 6], 2)  # server scored other token ids
    with pytest.raises(ValueError, match="do not match"):
        sglang.parse_sglang(resp, ids, 3, 2)
    with pytest.raises(ValueError, match="expected 4"):
        sglang.parse_sglang(_sglang_response(ids, 1), ids, 3, 2)


def test_openai_style_tokenize_body() -> None:
    assert kl.tokenize_request("vllm", "hi", False) == ("/tokenize", {"prompt": "hi", "add_special_tokens": False})
    assert kl.tokenize_request("sglang", "hi", True)[1]["add_special_tokens"] is True
    with pytest.raises(ValueError, match="integer 'tokens'"):
        kl.parse_tokenize({"error": "x"})


# ------------------------------------------------------------------------------------------ URLs, options


def test_normalize_url() -> None:
    assert kl.normalize_url("http://127.0.0.1:8000/v1/", "--baseline") == "http://127.0.0.1:8000"
    assert kl.normalize_url(" https://h/x ", "--baseline") == "https://h/x"
    with pytest.raises(BadInput, match="^--candidate: put no credentials in the URL$"):
        kl.normalize_url("http://u:secret@h:1", "--candidate")
    with pytest.raises(BadInput, match="expected a server URL"):
        kl.normalize_url("127.0.0.1:8000", "--baseline")


def test_run_kl_validates_before_any_request() -> None:
    with pytest.raises(NotFound, match="unknown engine 'vlm' \\(did you mean 'vllm'\\?\\)"):
        kl.run_kl("http://a", "http://b", "vlm")
    with pytest.raises(BadInput, match="--tokens must be at least 1"):
        kl.run_kl("http://a", "http://b", "vllm", tokens=0)
    with pytest.raises(BadInput, match="vLLM returns at most"):
        kl.run_kl("http://a", "http://b", "vllm", top_k=50)


# ------------------------------------------------------------------------------------------------- texts


def test_gsm8k_pair_drops_calculator_annotations(shared_data: Path) -> None:
    item = json.loads((shared_data / "gsm8k" / "test.jsonl").open().readline())
    pair = gsm8k_pair(item["question"], item["answer"])
    assert pair.prompt.startswith("Question: Janet") and pair.prompt.endswith("\nAnswer:")
    assert pair.continuation.startswith(" Janet sells 16 - 3 - 4 = 9 duck eggs")
    assert "<<" not in pair.continuation and pair.continuation.endswith("#### 18")


def test_default_texts_read_the_shipped_split_lazily() -> None:
    from quantrack.resources import data_dir

    if not (data_dir() / "gsm8k" / "test.jsonl").is_file():
        pytest.skip("GSM8K split not shipped in this checkout yet")
    it = default_texts()
    first = next(it)
    assert first.source == "gsm8k/test.jsonl:1" and first.continuation.startswith(" ")


def test_default_texts_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentMissing, match="pass --texts FILE"):
        next(default_texts(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(("content", "message"), [
    ('{"prompt": "a"}\n', 'texts.jsonl:1: needs string fields "prompt" and "continuation"'),
    ("not json\n", "texts.jsonl:1: not JSON"),
    ('{"prompt": "a", "continuation": ""}\n', "texts.jsonl:1: empty continuation"),
    ("\n", "no texts in the file"),
])
def test_load_texts_errors(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "texts.jsonl"
    f.write_text(content)
    with pytest.raises(BadInput, match=message.replace("(", "\\(")):
        load_texts(f)


def test_load_texts_reads_pairs(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "Q: 1+1?\\nA:", "continuation": " 2"}\n\n{"prompt": "x", "continuation": " y"}\n')
    got = load_texts(f)
    assert [(t.prompt, t.continuation, t.source) for t in got] == [
        ("Q: 1+1?\nA:", " 2", "t.jsonl:1"), ("x", " y", "t.jsonl:3")]


# --------------------------------------------------------------------------------------------------- CLI


def test_cli_bad_engine_is_one_line_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["eval", "kl", "--baseline", "http://a", "--candidate", "http://b", "--engine", "trt"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "quantrack: error: --engine: expected one of vllm, sglang, llamacpp, got \"trt\"\n"


def test_cli_missing_texts_file_is_bad_input(tmp_path: Path) -> None:
    from quantrack.cli.eval_kl import kl as kl_cmd

    with pytest.raises(BadInput, match="^--texts: no such file: "):
        kl_cmd.main(["--baseline", "http://a", "--candidate", "http://b", "--texts", str(tmp_path / "x.jsonl")],
                    standalone_mode=False)


def test_render_table_shows_the_measured_figures() -> None:
    from quantrack.cli.eval_kl import render_table

    st = kl.PositionStats(agree=True, kl=0.01, kl_lower=0.008, base_tail=0.05, cand_tail=0.06, overlap=0.9)
    r = kl.summarize([[st], [st]], engine="llamacpp", baseline_url="http://a", candidate_url="http://b", top_k=20)
    out = render_table(r.to_dict())
    assert "measured: 2 positions over 2 texts" in out
    assert "top-1 agree" in out and "1.0000" in out and "0.01000" in out and "0.00800" in out
