"""What the engines' KL wire formats share -- prompt-logprob scoring, one next token at a time (the decode-side
method) and ``/tokenize``: the top-k type, its truncation, the OpenAI-style /tokenize request (vLLM, SGLang) and its
answer. Each engine's own request builders and response parsers are in its module, behind its adapter
(``score_prompt``, ``next_token_request`` / ``parse_next_token``); ``quantrack.accuracy.kl`` is engine-agnostic.
"""

from __future__ import annotations

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


def parse_tokenize(resp: Any) -> list[int]:
    toks = resp.get("tokens") if isinstance(resp, dict) else None
    if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
        raise ValueError(f"/tokenize answered without an integer 'tokens' list: {str(resp)[:200]}")
    return toks
