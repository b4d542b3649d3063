"""SSE decoding, chunk parsing and sample validation, on real llama.cpp streams.

tests/data/llamacpp-stream-*.sse were captured with curl from llama.cpp's server in
xllamacpp 2026.10.11549 serving SmolLM2-135M-Instruct Q4_1 (stream=true, include_usage, ignore_eos).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.measure.client import (
    SSEDecoder,
    SSEError,
    StreamAccumulator,
    StreamSample,
    build_payload,
    parse_chunk,
    validate_sample,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _replay(raw: bytes, *, chat: bool, step: int) -> StreamSample:
    """Feed the capture ``step`` bytes at a time; the k-th read arrives at t = k ms."""
    acc = StreamAccumulator(0.0, chat=chat, keep_text=True)
    for k, i in enumerate(range(0, len(raw), step)):
        if acc.feed(raw[i : i + step], (k + 1) / 1000.0):
            break
    return acc.finish()


@pytest.mark.parametrize("step", [1, 7, 100000])
def test_real_llamacpp_completion_stream(step: int) -> None:
    raw = (DATA / "llamacpp-stream-completions.sse").read_bytes()
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    texts = [e["choices"][0]["text"] for e in events if e.get("choices") and e["choices"][0]["text"]]
    final = events[-1]
    s = _replay(raw, chat=False, step=step)
    assert s.ok and s.done
    assert s.n_chunks == len(texts) == final["usage"]["completion_tokens"]
    assert s.text == "".join(texts)
    assert s.completion_tokens == final["usage"]["completion_tokens"]
    assert s.prompt_tokens == final["usage"]["prompt_tokens"]
    assert s.finish_reason == "length"
    # llama.cpp's own figure, carried by the final chunk
    assert s.server_tpot == pytest.approx(final["timings"]["predicted_per_token_ms"] / 1000.0)
    assert s.server_timings and s.server_timings["predicted_n"] == final["timings"]["predicted_n"]
    # the empty-text final chunk is not an output chunk: e2e is the last text chunk
    assert s.chunk_times == sorted(s.chunk_times)


def test_real_llamacpp_chat_stream_skips_role_chunk() -> None:
    raw = (DATA / "llamacpp-stream-chat.sse").read_bytes()
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    contents = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    assert contents[0] is None  # role-only first chunk in the capture
    s = _replay(raw, chat=True, step=13)
    assert s.ok and s.done
    assert s.n_chunks == len([c for c in contents if c])
    assert s.completion_tokens == events[-1]["usage"]["completion_tokens"]
    assert events[-1]["choices"] == [] and s.server_timings is not None


def test_real_nonstream_response_carries_timings(shared_data: Path) -> None:
    """A real non-streamed llama.cpp response (shared data) parses the same way."""
    obj = json.loads((shared_data / "llamacpp-cpu" / "resp-Q4_0-kvf16.json").read_text())
    chunk = parse_chunk(json.dumps(obj))
    assert chunk.has_choices and chunk.finish_reason == "length"
    assert chunk.usage and chunk.usage["completion_tokens"] == obj["timings"]["predicted_n"]
    t = obj["timings"]
    # predicted_per_token_ms = predicted_ms / (predicted_n - 1): the TPOT definition (engine-facts §1.5)
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / (t["predicted_n"] - 1))


def test_sse_comments_crlf_and_fields() -> None:
    d = SSEDecoder()
    out = d.feed(b": ping\r\nevent: message\r\nid: 3\r\ndata: {\"a\":1}\r\n\r\ndata: [DO")
    assert out == ['{"a":1}']
    assert d.feed(b"NE]\n\n") == ["[DONE]"]


def test_sse_multiline_data_and_trailing_event() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: one\ndata: two\n\n") == ["one\ntwo"]
    assert d.feed(b"data: last") == []
    assert d.close() == ["last"]


def test_malformed_sse_line_raises() -> None:
    with pytest.raises(SSEError, match="malformed SSE line: 'this is not an SSE line'"):
        SSEDecoder().feed(b"this is not an SSE line\n\n")


def test_bad_json_raises_and_error_object_reported() -> None:
    with pytest.raises(SSEError, match="not JSON"):
        parse_chunk("{not json")
    err = parse_chunk('{"error": {"message": "boom", "code": 500}}')
    assert err.error == "server error in stream: boom"


def test_stream_without_done_fails() -> None:
    raw = (DATA / "llamacpp-stream-completions.sse").read_bytes()
    cut = raw[: raw.index(b"\n\n", 600) + 2]  # first events only, then the connection ends
    s = _replay(cut, chat=False, step=50)
    assert not s.ok
    assert s.error is not None and s.error.startswith("stream ended before [DONE] after ")


def test_payloads_force_length() -> None:
    path, body = build_payload("vllm", model="m", prompt=[1, 2, 3], max_tokens=128)
    assert path == "/v1/completions"
    assert body["ignore_eos"] is True and body["min_tokens"] == 128 and body["max_tokens"] == 128
    assert body["stream_options"] == {"include_usage": True} and body["prompt"] == [1, 2, 3]
    path, body = build_payload("llamacpp", model=None, prompt="hi", max_tokens=32, chat=True)
    assert path == "/v1/chat/completions" and "min_tokens" not in body and "model" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(BadInput, match="--chat needs a text prompt"):
        build_payload("sglang", model="m", prompt=[1, 2], max_tokens=8, chat=True)


def _sample(n_chunks: int, usage: int | None) -> StreamSample:
    return StreamSample(chunk_times=[0.1 + 0.01 * i for i in range(n_chunks)], completion_tokens=usage, prompt_tokens=16, done=True)


def test_validate_short_long_and_mismatch() -> None:
    short = validate_sample(_sample(5, 5), output_tokens=8)
    assert not short.ok and short.error == "short: server returned 5 of 8 tokens (finish_reason=None)"
    long = validate_sample(_sample(10, 10), output_tokens=8)
    assert not long.ok and long.error == "server ignored max_tokens: returned 10 > 8 tokens"
    bundled = validate_sample(_sample(7, 8), output_tokens=8, input_tokens=16)
    assert bundled.ok and bundled.notes == ["chunk/usage mismatch: 7 output chunks, usage says 8 tokens"]
    nousage = validate_sample(_sample(8, None), output_tokens=8)
    assert nousage.ok and nousage.notes == ["server sent no usage; output tokens counted from chunks"]
    prompt = validate_sample(_sample(8, 8), output_tokens=8, input_tokens=20)
    assert prompt.notes == ["prompt is 16 tokens (asked 20)"]


def test_empty_text_completion_chunks_count_as_tokens_like_vllms_client():
    """Byte-level BPE tokens that end mid-character stream as "" (seen with vLLM 0.25 on the H200):
    they are tokens, so TTFT is the first chunk with choices and every chunk counts (engine-facts §5.3)."""
    from quantrack.measure.client import StreamAccumulator

    acc = StreamAccumulator(0.0)
    events = [
        (b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n', 0.050),
        (b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n', 0.054),
        (b'data: {"choices":[{"index":0,"text":"\\u00e9","finish_reason":null}]}\n\n', 0.058),
        (b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n', 0.062),
        (b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}\n\n', 0.063),
        (b"data: [DONE]\n\n", 0.064),
    ]
    for data, t in events:
        acc.feed(data, t)
    s = acc.finish()
    assert s.chunk_times == [0.050, 0.054, 0.058, 0.062]
    assert s.completion_tokens == 4 and s.n_chunks == 4


def test_llamacpp_trailing_bookkeeping_chunk_is_not_a_token():
    from quantrack.measure.client import StreamAccumulator

    acc = StreamAccumulator(0.0)
    for data, t in [
        (b'data: {"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n', 0.01),
        (b'data: {"choices":[{"index":0,"text":" b","finish_reason":null}]}\n\n', 0.02),
        ((b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}],'
         b'"usage":{"completion_tokens":2,"prompt_tokens":3},"timings":{"predicted_per_token_ms":10.0}}\n\n'), 0.03),
        (b"data: [DONE]\n\n", 0.031),
    ]:
        acc.feed(data, t)
    s = acc.finish()
    assert s.chunk_times == [0.01, 0.02] and s.completion_tokens == 2
