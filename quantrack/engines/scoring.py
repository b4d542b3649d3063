"""Per-engine wire format of prompt-logprob scoring and of ``/tokenize`` (pure request builders and response
parsers; vLLM, SGLang, llama.cpp), each citing the engine source or the real response it was checked against.
The adapters (``EngineAdapter.tokenize_request`` / ``score_prompt``) call these; ``quantrack.accuracy.kl`` is
engine-agnostic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TopK = dict[int, float]  # token id -> natural-log probability, the k most likely tokens at one position


def truncate_topk(logprobs: TopK, k: int) -> TopK:
    """The k most likely entries (vLLM also returns the scored token itself when it is not in the top-k)."""
    if len(logprobs) <= k:
        return dict(logprobs)
    ranked = sorted(logprobs.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return dict(ranked)


def openai_tokenize_request(text: str, add_special: bool, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of a /tokenize call on vLLM and SGLang.

    vLLM: ``TokenizeCompletionRequest`` {prompt, add_special_tokens} -> ``TokenizeResponse`` {tokens, count,
    max_model_len} (vllm-project/vllm@030ea52effcb:vllm/entrypoints/serve/tokenize/protocol.py:L20). SGLang: ``TokenizeRequest``
    {prompt, add_special_tokens} -> {tokens, count, max_model_len} (sgl-project/sglang,
    python/sglang/srt/entrypoints/openai/protocol.py). ``model``: the served name, for servers that need it.
    """
    body: dict[str, Any] = {"prompt": text, "add_special_tokens": add_special}
    if model:
        body["model"] = model
    return "/tokenize", body


def llamacpp_tokenize_request(text: str, add_special: bool) -> tuple[str, dict[str, Any]]:
    """llama.cpp: {content, add_special} -> {tokens} (checked on the xllamacpp 2026.10.11549 server,
    tests/data/kl/llamacpp-tokenize.json)."""
    return "/tokenize", {"content": text, "add_special": add_special}


def parse_tokenize(resp: Any) -> list[int]:
    toks = resp.get("tokens") if isinstance(resp, dict) else None
    if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
        raise ValueError(f"/tokenize answered without an integer 'tokens' list: {str(resp)[:200]}")
    return toks


def vllm_request(ids: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /v1/completions scoring every prompt position of ``ids``.

    ``CompletionRequest.prompt`` accepts a list of token ids and ``prompt_logprobs: int`` asks for the top-k at
    every prompt position (vllm-project/vllm@002032ee2b18:vllm/entrypoints/openai/completion/protocol.py:L50
    prompt, :L96 prompt_logprobs). ``max_tokens`` 1: 0 is only allowed with ``echo`` (same file,
    ``to_sampling_params``: ``echo_without_generation``); one greedy token costs nothing next to the prefill.
    """
    return "/v1/completions", {"prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                               "prompt_logprobs": k, "add_special_tokens": False}


def parse_vllm(resp: Any, ids: Sequence[int], start: int, k: int) -> list[TopK]:
    """Top-k per position for ``ids[start:]`` from a vLLM completion response.

    ``CompletionResponseChoice.prompt_logprobs: list[dict[int, Logprob] | None]`` (same protocol.py), filled from
    ``final_res.prompt_logprobs`` (vllm/entrypoints/openai/completion/serving.py,
    ``request_output_to_completion_response``): entry j is the distribution that scored prompt token j (entry 0
    is null: nothing precedes it); each dict holds the top-k plus the scored token itself, as
    ``{"<id>": {"logprob", "rank", "decoded_token"}}`` (JSON object keys are strings).
    """
    try:
        plp = resp["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("vLLM response has no choices[0].prompt_logprobs (server too old?)") from None
    if not isinstance(plp, list) or len(plp) != len(ids):
        raise ValueError(f"vLLM prompt_logprobs has {len(plp) if isinstance(plp, list) else 'no'} entries, "
                         f"expected {len(ids)}")
    out: list[TopK] = []
    for j in range(start, len(ids)):
        entry = plp[j]
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"vLLM prompt_logprobs[{j}] is empty")
        out.append(truncate_topk({int(t): float(v["logprob"]) for t, v in entry.items()}, k))
    return out


def sglang_request(ids: Sequence[int], start: int, k: int) -> tuple[str, dict[str, Any]]:
    """POST /generate with ``input_ids`` scoring positions ``start..``.

    ``GenerateReqInput`` fields input_ids, return_logprob, logprob_start_len, top_logprobs_num,
    sampling_params (sgl-project/sglang, python/sglang/srt/managers/io_struct.py). The scheduler pads the first
    returned entry with None ("Always pad the first one with None") and returns one entry per token of
    ``origin_input_ids[logprob_start_len:]`` (python/sglang/srt/managers/scheduler_output_processor_mixin.py,
    ``add_input_logprob_return_values``), so ``logprob_start_len = start - 1`` makes entries 1.. score
    ``ids[start:]``.
    """
    if start < 1:
        raise ValueError("the first token has no context to be scored from")
    return "/generate", {"input_ids": list(ids), "return_logprob": True, "logprob_start_len": start - 1,
                         "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def parse_sglang(resp: Any, ids: Sequence[int], start: int, k: int) -> list[TopK]:
    """Top-k per position for ``ids[start:]`` from ``meta_info.input_top_logprobs``.

    Each entry is a list of ``[logprob, token_id, text-or-null]`` triples, or null for the padded first entry
    (tokenizer_manager ``detokenize_top_logprobs_tokens``); ``input_token_logprobs`` entries are single triples
    whose token ids must equal ``ids[start-1:]`` (checked here, so a misaligned server is caught).
    """
    try:
        meta = resp["meta_info"]
        tops = meta["input_top_logprobs"]
    except (KeyError, TypeError):
        raise ValueError("SGLang response has no meta_info.input_top_logprobs (return_logprob off?)") from None
    expected = len(ids) - (start - 1)
    if not isinstance(tops, list) or len(tops) != expected:
        raise ValueError(f"SGLang input_top_logprobs has {len(tops) if isinstance(tops, list) else 'no'} "
                         f"entries, expected {expected}")
    toks = meta.get("input_token_logprobs")
    if isinstance(toks, list) and len(toks) == expected:
        got = [e[1] for e in toks if isinstance(e, list | tuple) and len(e) >= 2]
        if got and got != list(ids[start - 1:]):
            raise ValueError("SGLang input_token_logprobs token ids do not match the ids sent")
    out: list[TopK] = []
    for j in range(1, expected):
        entry = tops[j]
        if not isinstance(entry, list) or not entry:
            raise ValueError(f"SGLang input_top_logprobs[{j}] is empty")
        out.append(truncate_topk({int(e[1]): float(e[0]) for e in entry}, k))
    return out


def llamacpp_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /completion for the distribution after ``prefix`` (one request per scored position).

    llama.cpp's server gives top-k log-probabilities only for generated tokens, so each position is one
    1-token generation from the growing prefix; ``cache_prompt`` lets the slot reuse the previous prefix (the
    server reports ``timings.cache_n = len(prefix) - 1``, ``prompt_n = 1``). ``post_sampling_probs: false``
    returns log-probabilities of the full softmax, before any sampler (identical at temperature 0 and 1.5 on
    xllamacpp 2026.10.11549; see docs/fidelity.md).
    """
    return "/completion", {"prompt": list(prefix), "n_predict": 1, "n_probs": k, "temperature": 0.0,
                           "cache_prompt": True, "post_sampling_probs": False}


def parse_llamacpp(resp: Any, k: int) -> TopK:
    """``completion_probabilities[0].top_logprobs`` = [{"id", "token", "bytes", "logprob"}, ...].

    Field names as returned by the llama.cpp server in xllamacpp 2026.10.11549 (real response stored in
    tests/data/kl/llamacpp-completion-nprobs.json).
    """
    try:
        top = resp["completion_probabilities"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("llama.cpp response has no completion_probabilities[0].top_logprobs "
                         "(n_probs ignored, or post_sampling_probs on?)") from None
    if not isinstance(top, list) or not top:
        raise ValueError("llama.cpp top_logprobs is empty")
    return truncate_topk({int(e["id"]): float(e["logprob"]) for e in top}, k)


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


def parse_llamacpp_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped): ``parse_llamacpp`` plus ``stop_type == "eos"`` (llama.cpp server's /completion answer)."""
    return parse_llamacpp(resp, k), isinstance(resp, dict) and resp.get("stop_type") == "eos"


NEXT_TOKEN = {
    "vllm": (vllm_next_request, parse_vllm_next),
    "sglang": (sglang_next_request, parse_sglang_next),
    "llamacpp": (llamacpp_request, parse_llamacpp_next),
}
