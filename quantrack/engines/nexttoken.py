"""One next token at a time, per engine: the wire format of the decode-side KL method
(quantrack.accuracy.kl KLMethod.DECODE_GREEDY): a request for ONE generated token after a prefix with its top-k
log-probabilities, and the parser giving (top-k, stopped at end of sequence)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantrack.engines.llamacpp import llamacpp_request, parse_llamacpp
from quantrack.engines.scoring import TopK, truncate_topk

# ---- one next token at a time (the decode-side KL method, quantrack.accuracy.kl KLMethod.DECODE_GREEDY)
#
# Each call asks for ONE generated token after ``prefix`` with its top-k log-probabilities. Called with a prefix
# that grows by one token per step, an engine with prefix caching (vLLM's and SGLang's default; llama.cpp's
# ``cache_prompt``) reads every earlier position's K/V from its cache -- the quantized cache a candidate arm
# generates from -- and computes only the newest token, as decoding does.


def vllm_next_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /v1/completions: one greedy token, its top-k ``logprobs`` keyed ``token_id:<id>``
    (``return_tokens_as_token_ids``, vllm@dd10e03f9:vllm/entrypoints/openai/completion/protocol.py:L138-L145)."""
    return "/v1/completions", {"prompt": list(prefix), "max_tokens": 1, "temperature": 0.0, "logprobs": k,
                               "return_tokens_as_token_ids": True, "add_special_tokens": False}


def parse_vllm_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped) from ``choices[0].logprobs.top_logprobs[0]`` = {"token_id:<id>": logprob};
    stopped = finish_reason "stop" (an end-of-sequence token)."""
    try:
        choice = resp["choices"][0]
        top = choice["logprobs"]["top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise ValueError("vLLM response has no choices[0].logprobs.top_logprobs[0]") from None
    if not isinstance(top, dict) or not top:
        raise ValueError("vLLM top_logprobs[0] is empty")
    out: TopK = {}
    for key, lp in top.items():
        if not str(key).startswith("token_id:"):
            raise ValueError(f"vLLM top_logprobs key {key!r} is not token_id:<id> (return_tokens_as_token_ids ignored?)")
        out[int(str(key)[len("token_id:"):])] = float(lp)
    return truncate_topk(out, k), choice.get("finish_reason") == "stop"


def sglang_next_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /generate: one greedy token with ``top_logprobs_num`` output log-probabilities."""
    return "/generate", {"input_ids": list(prefix), "return_logprob": True, "logprob_start_len": len(prefix) - 1,
                         "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def parse_sglang_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped) from ``meta_info.output_top_logprobs[0]`` = [[logprob, token_id, text], ...];
    stopped = ``meta_info.finish_reason.type == "stop"``."""
    try:
        meta = resp["meta_info"]
        top = meta["output_top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise ValueError("SGLang response has no meta_info.output_top_logprobs[0]") from None
    if not isinstance(top, list) or not top:
        raise ValueError("SGLang output_top_logprobs[0] is empty")
    fin = meta.get("finish_reason")
    stopped = isinstance(fin, dict) and fin.get("type") == "stop"
    return truncate_topk({int(e[1]): float(e[0]) for e in top}, k), stopped


def llamacpp_next_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """llama.cpp's own one-token request (quantrack.engines.llamacpp.llamacpp_request: cache_prompt on)."""
    return llamacpp_request(prefix, k)


def parse_llamacpp_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped): ``parse_llamacpp`` plus ``stop_type == "eos"`` (llama.cpp server's /completion answer)."""
    return parse_llamacpp(resp, k), isinstance(resp, dict) and resp.get("stop_type") == "eos"


NEXT_TOKEN = {
    "vllm": (vllm_next_request, parse_vllm_next),
    "sglang": (sglang_next_request, parse_sglang_next),
    "llamacpp": (llamacpp_next_request, parse_llamacpp_next),
}
