"""Streaming client for OpenAI-compatible servers (vLLM, SGLang, llama.cpp): payloads, SSE, timing.

Two layers, kept apart so the parsing can be tested with plain data:

* pure: :func:`build_payload`, :class:`SSEDecoder` (bytes -> event data), :func:`parse_chunk`
  (event data -> :class:`Chunk`), :class:`StreamAccumulator` (timed events -> :class:`StreamSample`)
  and :func:`validate_sample` (token counts vs. what was asked);
* transport: :class:`HttpStreamClient` (httpx, sync) and :class:`AsyncHttpStreamClient`
  (httpx.AsyncClient, for concurrency sweeps). A network or protocol failure never raises out of
  ``stream()``: it comes back as a failed sample with its reason.

Timing follows vLLM's benchmark client (engine-facts.md §5.3,
``vllm@4ba787ec9:vllm/benchmarks/lib/endpoint_request_func.py:L248-L307``): the clock starts just
before the request is sent; TTFT is the arrival of the first chunk carrying output; e2e is the
arrival of the *last* chunk carrying output (not of ``[DONE]``). As there, a completions chunk
with non-empty ``choices`` counts as one output token even when its text is empty: a byte-level
BPE token that ends inside a UTF-8 character streams as ``""`` (seen on the H200 with a
random-weight model: only ~9 of 128 chunks carried text, so counting text-only chunks pushed TTFT
later and TPOT ~17% lower). An empty chunk carrying ``finish_reason`` is ambiguous: llama.cpp
ends every stream with such a bookkeeping chunk that is not a token (observed,
tests/data/llamacpp-stream-completions.sse), while vLLM's last token can stream as ``""`` with
``finish_reason``; it is counted only when the server's usage says one token is still missing.
Chat chunks count when
``delta.content`` (or reasoning) is non-empty, as vLLM's ``_choice_has_streamed_output`` does for
the role-only first chunk. Arrival time is taken when the bytes come off the socket, before JSON
parsing.

API keys are sent as ``Authorization: Bearer`` and never stored in a sample or error message.

Every request is bounded: :func:`http_timeout` builds the one ``httpx.Timeout`` every quantrack client uses,
connect (:data:`CONNECT_TIMEOUT_S`, capped by the read timeout) apart from read/write/pool (the user's
``--timeout`` or ``[engine] request_timeout_s``), so a server that accepts a connection and never answers fails
within the read timeout; :func:`check_timeout` refuses ``nan``, infinity and values <= 0 with one line.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Self

from quantrack.engines import ENGINE_KINDS as ENGINES
from quantrack.errors import BadInput, MeasurementError

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
# llama.cpp's per-request timings (observed in xllamacpp 2026.10.11549 responses, engine-facts.md §1.5)
SERVER_TIMING_KEYS = ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms", "predicted_per_token_ms")


class SSEError(Exception):
    """The byte stream is not valid server-sent events / the JSON in it is not a chunk."""


# ----------------------------------------------------------------------------- payloads


def build_payload(
    engine: str,
    *,
    model: str | None,
    prompt: str | list[int],
    max_tokens: int,
    chat: bool = False,
    stream: bool = True,
) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one fixed-length request.

    Output length is forced: ``ignore_eos`` (accepted by vLLM, SGLang and llama.cpp's server) and,
    for vLLM and SGLang, ``min_tokens`` equal to ``max_tokens``. Greedy sampling (temperature 0)
    so that runs are repeatable. Token-id prompts go to ``/v1/completions`` only.
    """
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    if model:
        body["model"] = model
    from quantrack.engines import get_adapter

    body.update(get_adapter(engine).fixed_length_fields(max_tokens))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if chat:
        if not isinstance(prompt, str):
            raise BadInput("--chat needs a text prompt (token-id prompts only work with /v1/completions)")
        body["messages"] = [{"role": "user", "content": prompt}]
        return CHAT_PATH, body
    body["prompt"] = prompt
    return COMPLETIONS_PATH, body


# ----------------------------------------------------------------------------- SSE


class SSEDecoder:
    """Incremental server-sent-events decoder: feed bytes, get the ``data`` of complete events.

    Events end at a blank line; ``:`` lines are comments (keep-alive pings); ``event``/``id``/
    ``retry`` fields are ignored; any other line is malformed and raises :class:`SSEError`.
    """

    _IGNORED_FIELDS = (b"event", b"id", b"retry")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        if b"\n" not in chunk and b"\r" not in chunk:
            return []
        *lines, self._buf = self._buf.split(b"\n")
        out: list[str] = []
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data).decode("utf-8", errors="replace"))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue
            name, sep, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif name in self._IGNORED_FIELDS and sep:
                continue
            else:
                raise SSEError(f"malformed SSE line: {line[:80].decode('utf-8', errors='replace')!r}")
        return out

    def close(self) -> list[str]:
        """End of stream: a last event without its blank line is still delivered."""
        out: list[str] = []
        if self._buf.strip():
            out.extend(self.feed(b"\n\n"))
        elif self._data:
            out.append(b"\n".join(self._data).decode("utf-8", errors="replace"))
        self._data = []
        self._buf = b""
        return out


@dataclass
class Chunk:
    """What one streamed JSON chunk says (completions or chat)."""

    has_choices: bool
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None


def parse_chunk(data: str, chat: bool = False) -> Chunk:
    """Parse one SSE data payload (not ``[DONE]``). Raises :class:`SSEError` on non-JSON."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise SSEError(f"malformed SSE data (not JSON): {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise SSEError(f"malformed SSE data (not an object): {data[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        return Chunk(has_choices=False, error=f"server error in stream: {str(msg)[:200]}")
    choices = obj.get("choices") or []
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    timings = obj.get("timings") if isinstance(obj.get("timings"), dict) else None
    if not choices:
        return Chunk(has_choices=False, usage=usage, timings=timings)
    first = choices[0]
    if chat:
        delta = first.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
    else:
        text = first.get("text") or ""
    return Chunk(
        has_choices=True,
        text=text,
        finish_reason=first.get("finish_reason"),
        usage=usage,
        timings=timings,
    )


def is_output_chunk(chunk: Chunk, chat: bool = False) -> bool:
    """Does this chunk carry one output token? (see the module docstring for the rule and why)."""
    if not chunk.has_choices:
        return False
    if chunk.text:
        return True
    if chat:
        return False
    # An empty chunk that ends the stream is held back: llama.cpp's bookkeeping chunk is not a token, while
    # vLLM's last token may be empty too; StreamAccumulator.finish() settles it against usage.
    return chunk.finish_reason is None


# ----------------------------------------------------------------------------- samples


@dataclass
class StreamSample:
    """One streamed request, timed. Times are seconds from request start (``perf_counter``)."""

    ok: bool = True
    error: str | None = None
    t_start: float = 0.0  # perf_counter() when the request was sent (absolute; not saved)
    chunk_times: list[float] = field(default_factory=list)  # arrival of each output chunk
    prompt_tokens: int | None = None  # server's usage
    completion_tokens: int | None = None  # server's usage
    finish_reason: str | None = None
    server_timings: dict[str, float] | None = None  # llama.cpp `timings` (per request)
    cached_tokens: int | None = None  # server's usage.prompt_tokens_details.cached_tokens (prompt tokens from cache)
    done: bool = False  # saw data: [DONE]
    notes: list[str] = field(default_factory=list)
    text: str | None = None

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)

    @property
    def output_tokens(self) -> int | None:
        """Server-counted output tokens (usage); the chunk count when the server gave no usage."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.n_chunks or None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1): vLLM's per-request TPOT (engine-facts.md §5.3)."""
        n = self.output_tokens
        if not self.chunk_times or n is None or n < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1)

    @property
    def itl(self) -> list[float]:
        """Gaps between consecutive output chunks (per chunk, not per token)."""
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def server_tpot(self) -> float | None:
        """llama.cpp's ``timings.predicted_per_token_ms`` in seconds (predicted_ms / (n - 1))."""
        if not self.server_timings or "predicted_per_token_ms" not in self.server_timings:
            return None
        return self.server_timings["predicted_per_token_ms"] / 1000.0

    def prompt_cache_counts(self) -> tuple[int, int] | None:
        """(prompt tokens served from the server's cache, prompt tokens) as the server reported them for this
        request: llama.cpp ``timings.cache_n`` of ``cache_n + prompt_n``, else the OpenAI field
        ``usage.prompt_tokens_details.cached_tokens`` of ``usage.prompt_tokens``; None when it reported neither."""
        t = self.server_timings or {}
        if "cache_n" in t and "prompt_n" in t:
            return int(t["cache_n"]), int(t["cache_n"] + t["prompt_n"])
        if self.cached_tokens is not None and self.prompt_tokens:
            return self.cached_tokens, self.prompt_tokens
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "error": self.error,
            "ttft_ms": _ms(self.ttft),
            "tpot_ms": _ms(self.tpot),
            "e2e_ms": _ms(self.e2e),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "content_chunks": self.n_chunks,
            "finish_reason": self.finish_reason,
            "server_tpot_ms": _ms(self.server_tpot),
            "cached_tokens": (self.prompt_cache_counts() or (None,))[0],
            "notes": list(self.notes),
        }


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


class StreamAccumulator:
    """Builds a :class:`StreamSample` from timed SSE events (pure: the caller supplies the times)."""

    def __init__(self, t_start: float, chat: bool = False, keep_text: bool = False) -> None:
        self.t_start = t_start
        self.chat = chat
        self.sample = StreamSample(t_start=t_start, text="" if keep_text else None)
        self._decoder = SSEDecoder()
        self._held_final: float | None = None  # arrival of an empty chunk with finish_reason (see finish())

    def feed(self, data: bytes, t: float) -> bool:
        """Bytes that arrived at time ``t``. Returns True once ``[DONE]`` was seen."""
        for event in self._decoder.feed(data):
            if self._event(event, t):
                return True
        return False

    def _event(self, data: str, t: float) -> bool:
        s = self.sample
        if data.strip() == "[DONE]":
            s.done = True
            return True
        chunk = parse_chunk(data, self.chat)
        if chunk.error:
            raise SSEError(chunk.error)
        if chunk.usage:
            s.prompt_tokens = _int_or_none(chunk.usage.get("prompt_tokens"))
            s.completion_tokens = _int_or_none(chunk.usage.get("completion_tokens"))
            details = chunk.usage.get("prompt_tokens_details")
            if isinstance(details, dict) and "cached_tokens" in details:
                s.cached_tokens = _int_or_none(details.get("cached_tokens"))
        if chunk.timings:
            s.server_timings = {
                k: float(chunk.timings[k]) for k in SERVER_TIMING_KEYS if isinstance(chunk.timings.get(k), (int, float))
            }
        if chunk.finish_reason:
            s.finish_reason = chunk.finish_reason
        if chunk.has_choices and is_output_chunk(chunk, self.chat):
            s.chunk_times.append(t - self.t_start)
            if s.text is not None:
                s.text += chunk.text
        elif chunk.has_choices and not self.chat and not chunk.text and chunk.finish_reason is not None:
            self._held_final = t - self.t_start
        return False

    def finish(self) -> StreamSample:
        """End of the byte stream: deliver a trailing event; a stream without [DONE] fails."""
        s = self.sample
        if not s.done:
            for event in self._decoder.close():
                if self._event(event, self.t_start):
                    break
        if (self._held_final is not None and s.completion_tokens is not None
                and s.n_chunks == s.completion_tokens - 1):
            s.chunk_times.append(self._held_final)  # vLLM's last token streamed as ""
        if not s.done and s.ok:
            fail(s, f"stream ended before [DONE] after {s.n_chunks} output chunks")
        return s


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None


def fail(sample: StreamSample, reason: str) -> StreamSample:
    """Mark a sample failed (the first reason wins)."""
    if sample.ok:
        sample.ok = False
        sample.error = reason
    return sample


def validate_sample(sample: StreamSample, *, output_tokens: int, input_tokens: int | None = None) -> StreamSample:
    """Check a finished sample against what was asked; fail or annotate it in place.

    * fewer or more output tokens than asked -> failed (never averaged in silently);
    * no usage from the server -> note, tokens counted from chunks;
    * output chunks != usage tokens -> note (servers may bundle tokens in one chunk);
    * prompt tokens != asked -> note (the prompt was approximate or the server added tokens).
    """
    if not sample.ok:
        return sample
    if sample.completion_tokens is None:
        sample.notes.append("server sent no usage; output tokens counted from chunks")
    n = sample.output_tokens
    if not sample.chunk_times or n is None:
        return fail(sample, "no output chunk received")
    if n < output_tokens:
        return fail(sample, f"short: server returned {n} of {output_tokens} tokens (finish_reason={sample.finish_reason})")
    if n > output_tokens:
        return fail(sample, f"server ignored max_tokens: returned {n} > {output_tokens} tokens")
    if sample.completion_tokens is not None and sample.n_chunks != sample.completion_tokens:
        sample.notes.append(f"chunk/usage mismatch: {sample.n_chunks} output chunks, usage says {sample.completion_tokens} tokens")
    if input_tokens is not None and sample.prompt_tokens is not None and sample.prompt_tokens != input_tokens:
        sample.notes.append(f"prompt is {sample.prompt_tokens} tokens (asked {input_tokens})")
    return sample


# ----------------------------------------------------------------------------- transport

CONNECT_TIMEOUT_S = 10.0  # a TCP connect on a LAN takes milliseconds; 10 s covers a loaded host


def check_timeout(value: object, flag: str = "--timeout") -> float:
    """A timeout in seconds: finite and > 0, else one-line BadInput naming ``flag``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise BadInput(f"{flag} must be a number of seconds (got {value!r})") from None
    if isinstance(value, bool) or not math.isfinite(v) or v <= 0:
        raise BadInput(f"{flag} must be a finite number of seconds > 0 (got {value!r})")
    return v


def http_timeout(read_s: float, connect_s: float | None = None, flag: str = "--timeout") -> Any:
    """``httpx.Timeout``: connect apart from read/write/pool; both checked (see :func:`check_timeout`)."""
    import httpx

    read = check_timeout(read_s, flag)
    connect = min(read, check_timeout(CONNECT_TIMEOUT_S if connect_s is None else connect_s, "connect timeout"))
    return httpx.Timeout(read, connect=connect)


def check_base_url(base_url: str) -> str:
    """Validate ``--base-url`` (http(s)://host[:port][/prefix]); returns it without a trailing '/'."""
    import httpx

    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise BadInput(f"--base-url {base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise BadInput(f"--base-url {base_url!r} must look like http://HOST:PORT")
    return base_url.rstrip("/")


def check_engine(engine: str) -> str:
    from quantrack.errors import unknown

    if engine not in ENGINES:
        raise unknown("engine", engine, ENGINES)
    return engine


def describe_error(exc: BaseException) -> str:
    """One short reason for a transport failure (connection refused, DNS, timeout, cut stream)."""
    import httpx

    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        kind = {
            httpx.ConnectTimeout: "connect",
            httpx.ReadTimeout: "read",
            httpx.WriteTimeout: "write",
            httpx.PoolTimeout: "pool",
        }.get(type(exc), "")
        return f"timeout ({kind})".replace(" ()", "")
    if isinstance(exc, httpx.ConnectError):
        low = text.lower()
        if "name or service not known" in low or "name resolution" in low or "nodename nor servname" in low or "errno -2" in low or "errno -3" in low:
            return f"DNS failure: {text}"
        if "refused" in low:
            return "connection refused"
        return f"connect error: {text}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"stream cut mid-way: {text}"
    if isinstance(exc, httpx.ReadError):
        return f"stream cut mid-way (read error): {text}"
    if isinstance(exc, SSEError):
        return str(exc)
    return f"{type(exc).__name__}: {text}"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a request can fail with short of a bug: httpx errors, bad SSE, socket and decode errors."""
    import httpx

    return (httpx.HTTPError, httpx.StreamError, SSEError, OSError, UnicodeError)


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _http_error(status: int, body: bytes) -> str:
    snippet = body[:200].decode("utf-8", errors="replace").strip().replace("\n", " ")
    return f"HTTP {status}: {snippet}" if snippet else f"HTTP {status}"


class HttpStreamClient:
    """Synchronous httpx transport: one keep-alive connection, used for batch-1 latency."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 60.0, connect_timeout: float = 10.0) -> None:
        import httpx

        self.base_url = check_base_url(base_url)
        self._api_key = api_key
        self._client = httpx.Client(timeout=http_timeout(timeout, connect_timeout), headers=_headers(api_key))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def request_json(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """A plain JSON call (models, tokenize). Raises MeasurementError with a one-line reason."""
        try:
            r = self._client.request(method, self.base_url + path, json=payload)
        except _transport_errors() as exc:
            raise MeasurementError(_scrub(f"{method} {self.base_url}{path}: {describe_error(exc)}", self._api_key)) from None
        if r.status_code >= 400:
            raise MeasurementError(_scrub(f"{method} {self.base_url}{path}: {_http_error(r.status_code, r.content)}", self._api_key))
        try:
            return r.json()
        except ValueError:  # also UnicodeDecodeError: bytes that are not text at all
            raise BadInput(f"--base-url {self.base_url}: {method} {path} answered HTTP {r.status_code} with a body "
                           "that is not JSON (is this an OpenAI-compatible server?)") from None

    def stream(self, path: str, payload: dict[str, Any], *, chat: bool = False, keep_text: bool = False) -> StreamSample:
        """Send one streaming request and time it. Never raises for network/protocol failures."""
        t0 = time.perf_counter()
        acc = StreamAccumulator(t0, chat=chat, keep_text=keep_text)
        try:
            with self._client.stream("POST", self.base_url + path, json=payload) as r:
                if r.status_code >= 400:
                    return fail(acc.sample, _scrub(_http_error(r.status_code, r.read()), self._api_key))
                # we ask for identity encoding; raw bytes skip httpx's decoder layer (less per-chunk work)
                chunks = r.iter_bytes() if r.headers.get("content-encoding") else r.iter_raw()
                for data in chunks:
                    if acc.feed(data, time.perf_counter()):
                        break
            return acc.finish()
        except _transport_errors() as exc:
            return fail(acc.sample, _scrub(describe_error(exc), self._api_key))


class AsyncHttpStreamClient:
    """httpx.AsyncClient transport for concurrency sweeps (same parsing and timing)."""

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout: float = 120.0, connect_timeout: float = 10.0, max_connections: int = 64
    ) -> None:
        import httpx

        self.base_url = check_base_url(base_url)
        self._api_key = api_key
        self._client = httpx.AsyncClient(
            timeout=http_timeout(timeout, connect_timeout),
            headers=_headers(api_key),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST a JSON body, the answer's JSON (raises MeasurementError on a transport or HTTP error)."""
        try:
            r = await self._client.post(self.base_url + path, json=body)
        except _transport_errors() as exc:
            raise MeasurementError(_scrub(f"{path}: {describe_error(exc)}", self._api_key)) from None
        if r.status_code >= 400:
            raise MeasurementError(_scrub(f"{path}: {_http_error(r.status_code, r.content)}", self._api_key))
        try:
            return r.json()
        except ValueError:
            raise MeasurementError(f"{path} answered with a body that is not JSON") from None

    async def stream(self, path: str, payload: dict[str, Any], *, chat: bool = False,
                     keep_text: bool = False) -> tuple[float, StreamSample]:
        """(absolute start time, sample). Never raises for network/protocol failures. ``keep_text``: the sample
        keeps the streamed text (a multi-turn workload resends it)."""
        t0 = time.perf_counter()
        acc = StreamAccumulator(t0, chat=chat, keep_text=keep_text)
        try:
            async with self._client.stream("POST", self.base_url + path, json=payload) as r:
                if r.status_code >= 400:
                    return t0, fail(acc.sample, _scrub(_http_error(r.status_code, await r.aread()), self._api_key))
                achunks = r.aiter_bytes() if r.headers.get("content-encoding") else r.aiter_raw()
                async for data in achunks:
                    if acc.feed(data, time.perf_counter()):
                        break
            return t0, acc.finish()
        except _transport_errors() as exc:
            return t0, fail(acc.sample, _scrub(describe_error(exc), self._api_key))
