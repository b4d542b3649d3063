"""Inputs of an exact token count, built with the server's own tokenizer.

Every request gets a different prompt: it starts with 8 hex digits drawn from the run's random
salt and the request index, so no request is served from a prefix cache left by an earlier one,
in this run or a previous run against the same server (vLLM prefix caching, SGLang's radix cache,
llama.cpp's slot and RAM prompt caches would otherwise skip most of the prefill and make TTFT
meaningless; observed: llama.cpp reported ``cache_n`` 32 of 128 for a repeated prompt).

Exact: the text is tokenized by the server (vLLM/SGLang ``POST /tokenize {"model","prompt"}``
-> ``{"tokens","count"}``; llama.cpp ``POST /tokenize {"content"}`` -> ``{"tokens"}``) and the
first N token ids are sent as the prompt of ``/v1/completions``. Chat requests need text and
get a chat template on top, so their length is approximate (and said so); the server's
``usage.prompt_tokens`` is recorded either way.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from quantrack.errors import MeasurementError

# Plain, common words: roughly one token each in BPE vocabularies, so the first guess is close.
_WORDS = (
    "the", "river", "city", "light", "morning", "paper", "table", "window", "garden", "music",
    "simple", "number", "people", "water", "between", "market", "little", "before", "letter",
    "green", "market", "winter", "summer", "station", "evening", "question", "answer", "history",
    "mountain", "road", "bridge", "school", "travel", "picture", "family", "morning", "kitchen",
    "orange", "yellow", "silver", "doctor", "teacher", "country", "village", "forest", "animal",
    "weather", "season", "minute", "system", "program", "message", "engine", "signal", "center",
    "middle", "corner", "border", "island", "harbor", "valley",
)

Tokenizer = Callable[[str], list[int]]


@dataclass
class PromptSet:
    """Prompts for a run: token-id lists (exact) or texts (approximate)."""

    prompts: list[str | list[int]]
    exact: bool
    method: str  # shown in the output, e.g. "exact: token ids from llamacpp /tokenize"


def new_salt() -> str:
    """A fresh per-run salt, so two runs never send the same prompts."""
    import secrets

    return secrets.token_hex(4)


def filler_text(index: int, n_words: int, salt: str = "") -> str:
    """Text for request ``index``: a unique hex prefix, then pseudo-random words (same inputs, same text)."""
    rng = random.Random(f"{salt}:{index}")
    head = f"{rng.getrandbits(32):08x}"
    return head + " " + " ".join(rng.choice(_WORDS) for _ in range(n_words))


def exact_token_prompt(index: int, n_tokens: int, tokenize: Tokenizer, salt: str = "") -> list[int]:
    """The first ``n_tokens`` ids of request ``index``'s text, tokenized by the server."""
    n_words = max(8, n_tokens)
    for _ in range(8):
        ids = tokenize(filler_text(index, n_words, salt))
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
        n_words *= 2
    raise MeasurementError(f"could not build a {n_tokens}-token prompt: /tokenize returned too few tokens")


def approximate_text_prompt(index: int, n_tokens: int, tokenize: Tokenizer | None, salt: str = "") -> str:
    """Text of about ``n_tokens`` tokens (at most that many, when a tokenizer is available)."""
    if tokenize is None:
        return filler_text(index, max(1, n_tokens - 3), salt)
    n_words = max(1, n_tokens)
    for _ in range(12):
        count = len(tokenize(filler_text(index, n_words, salt)))
        if count <= n_tokens:
            return filler_text(index, n_words, salt)
        n_words = max(1, int(n_words * n_tokens / count) - 1)
    return filler_text(index, n_words, salt)


def build_prompts(
    count: int, n_tokens: int, tokenize: Tokenizer | None, *, chat: bool, source: str, start: int = 0, salt: str | None = None
) -> PromptSet:
    """``count`` distinct prompts of ``n_tokens`` (exact when possible), request indices from ``start``.

    ``salt`` defaults to a fresh random one (pass one only to reproduce prompts in a test).
    """
    salt = new_salt() if salt is None else salt
    why = "chat template adds tokens" if chat else f"no tokenize endpoint ({source})"
    if tokenize is not None and not chat:
        try:
            first = exact_token_prompt(start, n_tokens, tokenize, salt)
        except MeasurementError as exc:
            # e.g. SGLang 0.5.16 answered HTTP 500 on /tokenize: measure with text prompts, labelled approximate
            why, tokenize = f"{source} failed: {exc}", None
        else:
            return PromptSet(
                prompts=[first, *(exact_token_prompt(i, n_tokens, tokenize, salt)
                                  for i in range(start + 1, start + count))],
                exact=True,
                method=f"exact: {n_tokens} token ids from {source}",
            )
    return PromptSet(
        prompts=[approximate_text_prompt(i, n_tokens, tokenize, salt) for i in range(start, start + count)],
        exact=False,
        method=f"approximate: text of about {n_tokens} tokens ({why}); see prompt_tokens",
    )


def server_tokenizer(engine: str, request_json: Callable[..., object], model: str | None,
                     add_special: bool = True) -> Tokenizer:
    """A tokenize function backed by the server's endpoint (see the module docstring); ``add_special=False``:
    without the BOS a prompt's start gets (for text that continues other token ids)."""

    from quantrack.engines import get_adapter

    adapter = get_adapter(engine)

    def tokenize(text: str) -> list[int]:
        path, body = adapter.tokenize_request(text, add_special=add_special, model=model)
        answer = request_json("POST", path, body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise MeasurementError(f"{engine} /tokenize answered without a token list")
        return tokens

    return tokenize
