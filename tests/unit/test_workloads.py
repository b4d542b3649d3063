"""The sweep's workloads on the prompts they send (quantrack.measure.workloads, quantrack.measure.sweep).

The tokenizer here stands in for the server's /tokenize (as in tests/unit/test_load.py): one id per word, a BOS
id 1 first when ``add_special``; the real server's tokenizer runs in tests/integration/test_workloads_llamacpp.py.
The transport for the level runner is a recording client that answers at once (times are then the scheduler's)."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from quantrack.errors import BadInput
from quantrack.measure.client import StreamSample
from quantrack.measure.prompts import PromptSet
from quantrack.measure.sweep import Level, LoadOptions, Sent, _run_level, prefix_cache_figure, workload_files
from quantrack.measure.workloads import (
    follow_up_prompt,
    length_mix,
    multi_turn,
    read_lengths,
    read_trace,
    scaled_offsets,
    shared_prefix,
    trace_workload,
)


def tok(text: str, special: bool = True) -> list[int]:
    return ([1] if special else []) + [zlib.crc32(w.encode()) % 50000 + 2 for w in text.split()]


def plain(text: str) -> list[int]:
    return tok(text, special=False)


def test_shared_prefixes_are_equal_token_for_token_and_suffixes_distinct() -> None:
    wl = shared_prefix(12, 40, 8, groups=3, prefix_tokens=24, tokenize=tok, tokenize_plain=plain, seed=5)
    prompts = [r.prompt for r in wl.requests]
    assert all(isinstance(p, list) and len(p) == 40 for p in prompts)
    assert [r.group for r in wl.requests] == [i % 3 for i in range(12)]
    for g in range(3):
        members = [p for p, r in zip(prompts, wl.requests) if r.group == g]
        assert len(members) == 4 and all(m[:24] == members[0][:24] for m in members)  # shared, token for token
        assert len({tuple(m[24:]) for m in members}) == 4  # distinct suffixes
    assert len({tuple(p[:24]) for p in prompts}) == 3  # one prefix per group
    assert all(p[0] == 1 and 1 not in p[1:] for p in prompts)  # one BOS, at the start: the suffix has none
    assert wl.params == {"prefix_groups": 3, "prefix_tokens": 24} and "seed 5" in wl.method
    again = shared_prefix(12, 40, 8, groups=3, prefix_tokens=24, tokenize=tok, tokenize_plain=plain, seed=5)
    assert [r.prompt for r in again.requests] != prompts  # a fresh salt per level: no cache left by the last one
    with pytest.raises(BadInput, match="--prefix-tokens must be >= 1 and below --input-tokens 40"):
        shared_prefix(4, 40, 8, groups=1, prefix_tokens=40, tokenize=tok, tokenize_plain=plain, seed=0)


class RecordingClient:
    """Answers each stream at once with ``n`` output tokens whose text is 'aN bN ...' (N = the request's number);
    /tokenize answers with the stand-in tokenizer. Records every payload in order, and the time it was sent."""

    def __init__(self, delay: float = 0.0) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.delay = delay
        self.t: list[float] = []

    async def stream(self, path: str, payload: dict[str, Any], *, chat: bool = False,
                     keep_text: bool = False) -> tuple[float, StreamSample]:
        import time

        t0 = time.perf_counter()
        self.t.append(t0)
        self.payloads.append(payload)
        k = len(self.payloads)
        await asyncio.sleep(self.delay)
        n = payload["max_tokens"]
        s = StreamSample(t_start=t0, chunk_times=[0.001 * (i + 1) for i in range(n)], completion_tokens=n,
                         prompt_tokens=len(payload["prompt"]), finish_reason="length", done=True,
                         text=" ".join(f"a{k}x{i}" for i in range(n)) if keep_text else None,
                         server_timings={"cache_n": 0.0, "prompt_n": float(len(payload["prompt"]))})
        return t0, s

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return {"tokens": tok(body["content"], body["add_special"])}


def _run(wl: Any, level: Level, client: RecordingClient, **kw: Any) -> tuple[list[StreamSample], list[Sent]]:
    sent: list[Sent] = []
    ps = PromptSet([r.prompt for r in wl.requests], True, wl.method)
    samples, _wall, _sent_at, _lags = asyncio.run(_run_level(
        client, "llamacpp", None, ps, level, output_tokens=4, input_tokens=16, chat=False, progress=None,  # type: ignore[arg-type]
        opts=LoadOptions(**kw), lens=[(r.input_tokens, r.output_tokens) for r in wl.requests], workload=wl,
        sent_log=sent))
    return samples, sent


def test_multi_turn_turns_contain_their_history_and_the_previous_answer() -> None:
    wl = multi_turn(6, 16, 4, turns=3, tokenize=tok, tokenize_plain=plain, seed=1)
    assert [(r.group, r.turn) for r in wl.requests] == [(c, t) for c in range(2) for t in (1, 2, 3)]
    client = RecordingClient()
    samples, sent = _run(wl, Level(concurrency=2), client)
    assert len(samples) == 6 and all(s.ok for s in samples), [s.error for s in samples]
    by = {(x.group, x.turn): x for x in sent}
    for c in range(2):
        p1, p2, p3 = (by[(c, t)].prompt for t in (1, 2, 3))
        assert isinstance(p1, list) and isinstance(p2, list) and isinstance(p3, list)
        assert len(p1) == 16 and p1[0] == 1
        # turn k = turn k-1's prompt + the answer it got (re-tokenized, no BOS) + its own new 16-token message
        for prev, cur, t in ((p1, p2, 2), (p2, p3, 3)):
            k = next(i for i, pl in enumerate(client.payloads) if pl["prompt"] == prev) + 1
            answer = plain(" ".join(f"a{k}x{i}" for i in range(4)))
            msg = wl.requests[c * 3 + t - 1].prompt
            assert cur == follow_up_prompt(prev, answer, msg)  # type: ignore[arg-type]
            assert cur[: len(prev)] == prev and len(cur) == len(prev) + 4 + 16
        assert by[(c, 3)].input_tokens == 16 + (4 + 16) * 2  # exact count of what was sent
        # in sequence: a turn is sent after the previous one answered
        assert by[(c, 1)].sent_s < by[(c, 2)].sent_s < by[(c, 3)].sent_s  # type: ignore[operator]


def test_a_failed_turn_ends_its_conversation_and_counts_the_rest_as_failed() -> None:
    class Failing(RecordingClient):
        async def stream(self, path: str, payload: dict[str, Any], *, chat: bool = False,
                         keep_text: bool = False) -> tuple[float, StreamSample]:
            t, s = await super().stream(path, payload, chat=chat, keep_text=keep_text)
            if len(self.payloads) == 1:
                s.ok, s.error = False, "HTTP 500"
            return t, s

    wl = multi_turn(3, 16, 4, turns=3, tokenize=tok, tokenize_plain=plain, seed=1)
    samples, sent = _run(wl, Level(concurrency=1), Failing())
    assert len(sent) == 1 and [s.ok for s in samples] == [False, False, False]
    assert samples[1].error == "not sent: turn 1 of its conversation failed"


TRACE: list[dict[str, Any]] = [  # the Mooncake format: timestamp (ms), input_length, output_length, hash_ids (one per 512-token block)
    {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0, 1]},
    {"timestamp": 120, "input_length": 24, "output_length": 3, "hash_ids": [0, 2, 3]},
    {"timestamp": 130, "input_length": 8, "output_length": 5},
    {"timestamp": 400, "input_length": 12, "output_length": 2, "hash_ids": [4]},
]


def _trace_file(tmp_path: Path, rows: list[dict[str, Any]] = TRACE) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def test_trace_prompts_follow_the_records_and_share_blocks_by_hash_id(tmp_path: Path) -> None:
    recs = read_trace(_trace_file(tmp_path))
    wl = trace_workload(recs, 10, tokenize=tok, tokenize_plain=plain, seed=3, source="t", block_tokens=8)
    assert [(r.input_tokens, r.output_tokens) for r in wl.requests] == [(20, 4), (24, 3), (8, 5), (12, 2)]
    assert [len(r.prompt) for r in wl.requests] == [20, 24, 8, 12]
    assert wl.offsets == [0.0, 0.12, 0.13, 0.4]
    a, b = wl.requests[0].prompt, wl.requests[1].prompt
    assert a[:8] == b[:8] and a[8:16] != b[8:16]  # block 0 shared, then blocks 1 and 2 differ
    assert "native rate 7.500/s" in wl.method and "Mooncake" in wl.method


@pytest.mark.parametrize("rate", [None, 15.0])
def test_trace_arrival_times_within_25_ms(tmp_path: Path, rate: float | None) -> None:
    """Replayed as recorded (rate = the trace's own 7.5/s) and scaled to twice that; sends within 25 ms of due."""
    recs = read_trace(_trace_file(tmp_path))
    wl = trace_workload(recs, 10, tokenize=tok, tokenize_plain=plain, seed=3, source="t", block_tokens=8)
    native = 3 / 0.4
    client = RecordingClient()
    _samples, sent = _run(wl, Level(rate=rate or native), client)
    scale = 1.0 if rate is None else native / rate
    due = [o * scale for o in wl.offsets or []]
    got = sorted(sent, key=lambda x: x.index)
    assert [x.due_s for x in got] == pytest.approx(due)
    assert all(abs((x.sent_s or 0) - d) <= 0.025 for x, d in zip(got, due)), [(x.sent_s, d) for x, d in zip(got, due)]
    assert scaled_offsets([0.0, 1.0, 2.0], 2.0) == ([0.0, 0.5, 1.0], 0.5)


def test_trace_and_lengths_files_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n', encoding="utf-8")
    with pytest.raises(BadInput) as exc:
        read_trace(bad)
    assert str(exc.value) == f"--trace {bad}: line 1: missing output_length (Mooncake trace format)"
    with pytest.raises(BadInput, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")
    flat = _trace_file(tmp_path, [{"timestamp": 0, "input_length": 4, "output_length": 2}] * 3)
    with pytest.raises(BadInput, match="all arrive at one instant"):
        workload_files(LoadOptions(dataset="trace", trace=str(flat)), 16, has_rates=True)
    with pytest.raises(BadInput) as exc:
        workload_files(LoadOptions(dataset="length-mix"), 16, has_rates=False)
    assert str(exc.value) == "--dataset length-mix needs --lengths FILE (lines 'input,output[,weight]')"
    with pytest.raises(BadInput) as exc:
        workload_files(LoadOptions(dataset="random", trace=str(flat)), 16, has_rates=False)
    assert str(exc.value) == "--trace applies to --dataset trace (got --dataset random)"
    with pytest.raises(BadInput, match="--prefix-tokens must be >= 1 and below --input-tokens 16"):
        workload_files(LoadOptions(dataset="shared-prefix", prefix_tokens=16), 16, has_rates=False)


def test_length_mix_draws_the_pairs_by_weight_with_its_seed(tmp_path: Path) -> None:
    f = tmp_path / "lengths.csv"
    f.write_text("input,output,weight\n# chat and RAG\n10,4,3\n30,2,1\n", encoding="utf-8")
    pairs = read_lengths(f)
    assert pairs == [(10, 4, 3.0), (30, 2, 1.0)]
    j = tmp_path / "lengths.jsonl"
    j.write_text('{"input_tokens": 10, "output_tokens": 4}\n{"input_length": 30, "output_length": 2}\n', "utf-8")
    assert read_lengths(j) == [(10, 4, 1.0), (30, 2, 1.0)]

    def build(i: int, n: int) -> list[int]:
        return [1] + [i + 2] * (n - 1)

    wl = length_mix(400, pairs, build=build, seed=9, source=str(f))
    assert all(len(r.prompt) == r.input_tokens for r in wl.requests)
    share = sum(1 for r in wl.requests if r.input_tokens == 10) / 400
    assert 0.68 < share < 0.82  # weight 3 of 4: SE 0.022
    assert [r.input_tokens for r in length_mix(400, pairs, build=build, seed=9, source="x").requests] == [
        r.input_tokens for r in wl.requests]  # the seed reproduces the draw
    f.write_text("10,1\n", encoding="utf-8")
    with pytest.raises(BadInput, match="output >= 2 tokens"):
        read_lengths(f)


def test_prefix_cache_figure_sources_and_unknown() -> None:
    s = [StreamSample(server_timings={"cache_n": 30.0, "prompt_n": 10.0}),
         StreamSample(server_timings={"cache_n": 0.0, "prompt_n": 40.0}),
         StreamSample(prompt_tokens=20, cached_tokens=10)]
    engine = {"prefix_cache_hit_rate": 0.25, "source": "vllm /metrics (measured by the engine)"}
    got = prefix_cache_figure(s, engine)
    assert got["prefix_cache_hit_rate"] == 0.25 and got["prefix_cache"]["responses"] == pytest.approx(40 / 100)
    fallback = prefix_cache_figure(s, {"prefix_cache_hit_rate": None, "unknown": {}})
    assert fallback["prefix_cache_hit_rate"] == pytest.approx(0.4) and "per-request" in fallback["prefix_cache"]["source"]
    none = prefix_cache_figure([StreamSample()], {"prefix_cache_hit_rate": None,
                                                  "unknown": {"prefix_cache_hit_rate": "one scrape: no counter "
                                                              "increase to read"}})
    assert none["prefix_cache_hit_rate"] is None
    assert none["prefix_cache"]["unknown"] == ("/metrics: one scrape: no counter increase to read; responses: no "
                                               "cached-token count in them")
    assert "not scraped (--no-scrape)" in prefix_cache_figure([], None, scrape=False)["prefix_cache"]["unknown"]


def test_the_level_figure_and_its_unknown_reason_reach_the_record() -> None:
    from quantrack.measure.sweep import SweepResult
    from quantrack.run.record import _sweep_metrics
    from quantrack.store.records import RunRecord

    known = {"mode": "concurrency", "concurrency": 2, "prefix_cache_hit_rate": 0.5, "prefix_cache": {}}
    old = {"mode": "concurrency", "concurrency": 1, "server_metrics": {"prefix_cache_hit_rate": 0.25}}
    top = {"mode": "concurrency", "concurrency": 4, "prefix_cache_hit_rate": None,
           "prefix_cache": {"unknown": "/metrics: not scraped (--no-scrape); responses: no cached-token count"}}
    rec = RunRecord(experiment="x", run_name="a")
    _sweep_metrics(rec, SweepResult("vllm", "http://h", "m", 16, 4, rows=[old, known, top],
                                    load={"dataset": "shared-prefix"}))
    got = {m.key: m.value for m in rec.metrics}
    assert got["sweep_engine_prefix_hit_rate_c2"] == 0.5
    assert got["sweep_engine_prefix_hit_rate_c1"] == 0.25  # a row saved before the level figure existed
    assert "sweep_engine_prefix_hit_rate_c4" not in got  # unknown is not a number
    assert rec.tags["quantrack.sweep_dataset"] == "shared-prefix"
    assert rec.tags["quantrack.sweep_prefix_cache_unknown"].startswith("/metrics: not scraped (--no-scrape)")
