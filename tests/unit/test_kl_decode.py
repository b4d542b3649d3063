"""The decode-side KL method's pure parts: the next-token request builders and parsers of each engine, and the
greedy loop against two stand-in servers that answer from fixed distributions (quantrack's own code paths only; the
real thing runs against llama.cpp in tests/integration/test_kl_decode_llamacpp.py).

llama.cpp's answer is the real one in tests/data/kl/llamacpp-completion-nprobs.json (stop_type "limit"). vLLM's and
SGLang's are built from their protocol as read in the source (cited beside each adapter's next_token_request in
quantrack/engines/vllm.py and sglang.py). Every builder and parser is reached through its adapter, as run_kl does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.accuracy import kl
from quantrack.engines import get_adapter
from quantrack.errors import BadInput

DATA = Path(__file__).resolve().parents[1] / "data"


def test_llamacpp_next_token_real_response() -> None:
    resp = json.loads((DATA / "kl" / "llamacpp-completion-nprobs.json").read_text())["response"]
    a = get_adapter("llamacpp")
    top, stopped = a.parse_next_token(resp, 5)
    assert len(top) == 5 and not stopped  # stop_type "limit": n_predict reached, not end of sequence
    assert a.parse_next_token({**resp, "stop_type": "eos"}, 5)[1] is True
    path, body = a.next_token_request([1, 2, 3], 5)
    assert path == "/completion" and body["cache_prompt"] is True and body["n_predict"] == 1


def test_vllm_next_token() -> None:
    a = get_adapter("vllm")
    path, body = a.next_token_request([5, 6, 7], 3)
    assert path == "/v1/completions" and body["logprobs"] == 3 and body["return_tokens_as_token_ids"] is True
    assert body["max_tokens"] == 1 and "prompt_logprobs" not in body  # output logprobs: the prefix cache is used
    resp = {"choices": [{"index": 0, "text": "x", "finish_reason": "length",
                         "logprobs": {"tokens": ["token_id:9"], "token_logprobs": [-0.1],
                                      "top_logprobs": [{"token_id:9": -0.1, "token_id:4": -2.5, "token_id:1": -3.0}]}}]}
    top, stopped = a.parse_next_token(resp, 2)
    assert top == {9: -0.1, 4: -2.5} and not stopped
    resp["choices"][0]["finish_reason"] = "stop"
    assert a.parse_next_token(resp, 2)[1] is True
    resp["choices"][0]["logprobs"]["top_logprobs"] = [{"x": -0.1}]
    with pytest.raises(ValueError, match="return_tokens_as_token_ids ignored"):
        a.parse_next_token(resp, 2)


def test_sglang_next_token() -> None:
    a = get_adapter("sglang")
    path, body = a.next_token_request([5, 6, 7], 3)
    assert path == "/generate" and body["top_logprobs_num"] == 3 and body["sampling_params"]["max_new_tokens"] == 1
    resp = {"text": "x", "meta_info": {"finish_reason": {"type": "length", "length": 1},
                                       "output_top_logprobs": [[[-0.2, 9, None], [-1.9, 4, None]]]}}
    assert a.parse_next_token(resp, 3) == ({9: -0.2, 4: -1.9}, False)
    resp["meta_info"]["finish_reason"] = {"type": "stop", "matched": 2}
    assert a.parse_next_token(resp, 3)[1] is True


class _Fixed:
    """A stand-in server: the next-token distribution depends only on the prefix length."""

    def __init__(self, shift: float, eos_at: int) -> None:
        self.shift, self.eos_at, self.prefixes = shift, eos_at, []

    def next_token(self, prefix: list[int], k: int) -> tuple[dict[int, float], bool]:
        import math

        self.prefixes.append(list(prefix))
        p = [0.7 - self.shift, 0.2 + self.shift, 0.1]
        top = {len(prefix) % 50 + 100: math.log(p[0]), 7: math.log(p[1]), 8: math.log(p[2])}
        return top, len(prefix) >= self.eos_at


def test_greedy_loop_follows_the_baseline_and_stops_at_its_end() -> None:
    from concurrent.futures import ThreadPoolExecutor

    base, cand = _Fixed(0.0, eos_at=6), _Fixed(0.05, eos_at=99)
    with ThreadPoolExecutor(2) as pool:
        stats = kl._decode_text(pool, base, cand, [1, 2], 10, 3)  # type: ignore[arg-type]
    assert len(stats) == 5  # prefixes of length 2..6; the baseline stopped after the 6-token prefix
    assert base.prefixes == cand.prefixes  # the candidate is scored on the baseline's tokens
    assert base.prefixes[1] == [1, 2, 102]  # the baseline's argmax was appended
    assert all(s.agree for s in stats) and all(s.kl > 0 for s in stats)


def test_unknown_method_is_one_line() -> None:
    with pytest.raises(BadInput, match="unknown KL method 'beam'"):
        kl.run_kl("http://127.0.0.1:1", "http://127.0.0.1:1", "llamacpp", method="beam")


def test_study_kl_method_key(tmp_path: Path) -> None:
    from quantrack.study import load_study

    src = (Path(__file__).resolve().parents[2] / "examples" / "cpu-smollm2.toml").read_text()
    assert "kl = {" in src
    p = tmp_path / "s.toml"
    p.write_text(src.replace("kl = {", 'kl = { method = "decode-greedy",', 1))
    assert load_study(p).eval.kl_method == "decode-greedy"
    p.write_text(src.replace("kl = {", 'kl = { method = "sampled",', 1))
    with pytest.raises(BadInput, match="sampled"):
        load_study(p)


def test_the_fake_engines_decode_side_kl_through_its_adapter_alone() -> None:
    """The fake engine (tests/fake_engine.py) gives the decode-side KL in its adapter only -- its next-token request
    and parser -- and run_kl drives two of its servers (tests/sse_fixture.py, answering /completion with a real
    llama.cpp response) through them: the greedy loop appends the baseline's argmax, both servers see the same
    prefixes, and two identical servers agree on every token with KL 0."""
    from quantrack.accuracy.texts import TextPair
    from tests.fake_engine import KIND, registered
    from tests.sse_fixture import NEXT_TOKEN_ANSWER, FixtureServer

    first = max(NEXT_TOKEN_ANSWER["completion_probabilities"][0]["top_logprobs"], key=lambda e: e["logprob"])
    base, cand = FixtureServer().start(), FixtureServer().start()
    try:
        with registered():
            r = kl.run_kl(base.base_url, cand.base_url, KIND, top_k=5, tokens=5, method=kl.KLMethod.DECODE_GREEDY,
                          decode_tokens_per_text=3,
                          texts=[TextPair("one two three", "four", "t1"), TextPair("five six", "seven", "t2")])
    finally:
        base.stop()
        cand.stop()
    assert (r.engine, r.kl_method, r.n_positions, r.n_texts) == (KIND, "decode-greedy", 5, 2)
    assert r.top1_agree == 1.0 and r.kl_mean == 0.0 and r.topk_overlap == 1.0
    sent = [q["body"] for q in base.requests if q["mode"] == "next-token"]
    assert [q["body"] for q in cand.requests if q["mode"] == "next-token"] == sent
    assert [len(b["prompt"]) for b in sent] == [3, 4, 5, 2, 3]  # 3 steps of text 1, then the 2 positions left
    assert sent[1]["prompt"][-1] == first["id"] and sent[0]["n_probs"] == 5 and sent[0]["cache_prompt"] is True
