"""Throughput and latency at several load levels against a running server.

Two kinds of level (asyncio + httpx.AsyncClient; lengths fixed and forced as in :mod:`latency`):

* **concurrency** ``c`` (closed loop): exactly ``c`` requests are kept in flight until ``requests_per_level``
  have finished;
* **rate** ``r`` (open loop): requests are sent at ``r``/s on a seeded Poisson or constant schedule
  (:func:`quantrack.measure.load.arrival_offsets`), at most ``max_concurrency`` in flight (None = no cap); the
  achieved rate ((n - 1) / dispatch span) is recorded beside the target, with the dispatch lag behind schedule.

Per level (all *measured*):

* output throughput = sum of usage.completion_tokens of the successful requests / level wall time
  (wall time = first request sent -> last request finished): the same window as ``vllm bench serve``'s
  ``benchmark_duration`` (docs/benchmarks.md, parity);
* TTFT, TPOT (= (e2e - TTFT) / (output tokens - 1) per request), e2e: p50/p90/p95/p99 and mean;
* mean requests in flight (sum of request durations / wall time: how much of the wall the ramp-up and drain
  took) and the client's own CPU seconds per streamed output token;
* goodput against per-request SLOs (``slo``), the engine's own metrics scraped during the level
  (:mod:`quantrack.measure.scrape`), and with ``repeats`` > 1 the mean and 95% t-interval over the repeats;
* failures with their reasons (short/over-long answers count as failures).

Every request of ``random`` and ``gsm8k`` has its own prompt (also across levels), so prefix caches do not shorten
prefill; the workloads of :mod:`quantrack.measure.workloads` (``shared-prefix``, ``multi-turn``, ``length-mix``,
``trace``) share what they say they share, and each level's **prefix-cache hit rate** (cached prompt tokens /
prompt tokens) is a figure of the level (:func:`prefix_cache_figure`: the engine's /metrics counters, else the
cached-token counts the server reported per request, else ``unknown`` with why).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantrack.errors import BadInput, MeasurementError, did_you_mean
from quantrack.interrupts import Interrupted
from quantrack.measure.client import (
    AsyncHttpStreamClient,
    HttpStreamClient,
    StreamSample,
    build_payload,
    check_base_url,
    check_engine,
    validate_sample,
)
from quantrack.measure.latency import (
    FORMULAS,
    Progress,
    check_counts,
    discover_model,
    prepare_prompts,
    strip_userinfo,
)
from quantrack.measure.load import (
    ARRIVALS,
    LevelCriterion,
    RequestSlo,
    achieved_rate,
    arrival_offsets,
    goodput,
    next_search_level,
    repeat_stats,
    search_result,
)
from quantrack.measure.prompts import PromptSet
from quantrack.measure.search import (
    ProbeSpec,
    SearchTrace,
    completion_rate,
    interrupted_result,
    outcome_from_row,
    probe_search,
)
from quantrack.measure.stats import percentile, summarize
from quantrack.measure.workloads import WORKLOADS, Workload, follow_up_prompt, scaled_offsets

SWEEP_FORMAT = "quantrack-sweep/1"
SWEEP_FORMULAS = {
    "output_tok_s": "output throughput = sum(usage.completion_tokens of ok requests) / level wall time",
    "wall_s": "level wall time = first request sent -> last request finished",
    "tpot": FORMULAS["tpot"],
    "ttft": FORMULAS["ttft"],
    "achieved_rate": "achieved rate = (requests sent - 1) / (last send - first send)",
    "completion_rate": "completion rate = (ok requests - 1) / (last finish - first finish)",
    "goodput": "goodput = requests meeting every per-request SLO / level wall time",
    "mean_in_flight": "mean in flight = sum(request e2e) / level wall time",
    "repeats": "with repeats: each figure's mean over the repeats and its 95% Student-t interval",
}
# figures of a level that get a mean and interval over repeats
REPEAT_FIGURES = ("output_tok_s", "request_s", "ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "e2e_p50_ms",
                  "goodput_request_s", "achieved_rate", "completion_rate", "prefix_cache_hit_rate")
SWEEP_FORMULAS["prefix_cache_hit_rate"] = ("prefix-cache hit rate = cached prompt tokens / prompt tokens over the "
                                           "level (engine /metrics counter increases, else the per-request counts "
                                           "the server reported)")


def default_requests(concurrency: int) -> int:
    """Requests per level when not given: 4 x concurrency, at least 8."""
    return max(8, 4 * concurrency)


@dataclass
class SweepResult:
    """One sweep: a row per concurrency level (``rows``), plus what was asked."""

    engine: str
    base_url: str
    model: str | None
    input_tokens: int
    output_tokens: int
    chat: bool = False
    label: str | None = None
    prompt: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)  # arrivals, seed, max concurrency, SLO, repeats
    slo_search: dict[str, Any] | None = None
    warmup_errors: list[str] = field(default_factory=list)
    interrupted: bool = False
    ended_early: str | None = None  # an error stopped the sweep: where (the finished levels before it are kept)
    timestamp: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))

    @property
    def n_failed(self) -> int:
        return sum(int(r["n_failed"]) for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SWEEP_FORMAT,
            "kind": "measured",
            "label": self.label,
            "engine": self.engine,
            "base_url": strip_userinfo(self.base_url),
            "model": self.model,
            "endpoint": "chat" if self.chat else "completions",
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "prompt": self.prompt,
            "n_warmup_failed": len(self.warmup_errors),
            "formulas": dict(SWEEP_FORMULAS),
            "rows": self.rows,
            "load": self.load,
            "slo_search": self.slo_search,
            "interrupted": self.interrupted,
            "ended_early": self.ended_early,
            "timestamp": self.timestamp,
        }


def level_row(concurrency: int | None, samples: list[StreamSample], wall_s: float, *,
              rate: float | None = None, sent_at: list[float] | None = None, lag_s: list[float] | None = None,
              slo: RequestSlo | None = None, client_cpu_s: float | None = None,
              max_concurrency: int | None = None) -> dict[str, Any]:
    """Aggregate one level (pure: samples already validated). ``rate`` set: an open-loop level."""
    ok = [s for s in samples if s.ok]
    out_tokens = sum(s.output_tokens or 0 for s in ok)

    def pct(vals: list[float]) -> dict[str, float] | None:
        sm = summarize(vals)
        if sm is None:
            return None
        return {"p50": sm.median, "p90": sm.p90, "p95": percentile(vals, 95.0), "p99": sm.p99, "mean": sm.mean,
                "n": sm.n}

    ttft = pct([s.ttft * 1000 for s in ok if s.ttft is not None])
    tpot = pct([s.tpot * 1000 for s in ok if s.tpot is not None])
    e2e = pct([s.e2e * 1000 for s in ok if s.e2e is not None])
    busy = sum(s.e2e for s in samples if s.e2e is not None)
    row: dict[str, Any] = {
        "mode": "rate" if rate is not None else "concurrency",
        "concurrency": concurrency,
        "requests": len(samples),
        "n_ok": len(ok),
        "n_failed": len(samples) - len(ok),
        "failures": dict(Counter(s.error or "unknown" for s in samples if not s.ok)),
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / wall_s if wall_s > 0 and ok else None,
        "request_s": len(ok) / wall_s if wall_s > 0 and ok else None,
        "ttft_ms": ttft,
        "tpot_ms": tpot,
        "e2e_ms": e2e,
        "ttft_p50_ms": ttft["p50"] if ttft else None,
        "tpot_p50_ms": tpot["p50"] if tpot else None,
        "tpot_p95_ms": tpot["p95"] if tpot else None,
        "e2e_p50_ms": e2e["p50"] if e2e else None,
        "mean_in_flight": busy / wall_s if wall_s > 0 else None,
        "client_cpu_ms_per_token": client_cpu_s * 1000 / out_tokens if client_cpu_s is not None and out_tokens
        else None,
    }
    if rate is not None:
        row["rate"] = rate
        row["max_concurrency"] = max_concurrency
        row["achieved_rate"] = achieved_rate(sent_at or [])
        row["completion_rate"] = completion_rate([s.t_start + s.e2e for s in ok if s.e2e is not None])
        row["dispatch_lag_ms"] = ({"p50": percentile(lag_s, 50) * 1000, "p99": percentile(lag_s, 99) * 1000,
                                   "max": max(lag_s) * 1000} if lag_s else None)
    if slo is not None:
        per = [(s.ttft * 1000 if s.ttft is not None else None, s.tpot * 1000 if s.tpot is not None else None,
                s.e2e * 1000 if s.e2e is not None else None, s.output_tokens or 0) for s in ok]
        row["goodput"] = goodput(per, slo, wall_s, len(samples))
        row["goodput_request_s"] = row["goodput"]["request_s"]
    return row


def level_label(row: dict[str, Any]) -> str:
    """``c16`` for a concurrency level, ``r2.5`` for a rate level (also the suffix of its MLflow metrics)."""
    if row.get("mode") == "rate" and isinstance(row.get("rate"), (int, float)):
        return f"r{row['rate']:g}"
    return f"c{row.get('concurrency')}"


def merge_repeats(runs: list[dict[str, Any]], pooled: dict[str, Any]) -> dict[str, Any]:
    """One row for a level measured ``len(runs)`` times. ``pooled``: :func:`level_row` over every repeat's
    samples (so the percentile tables cover all requests, and counts and failures add up); each headline figure
    is then replaced by its mean over the repeats, with ``repeat_stats`` (mean, 95% t-interval, values)."""
    if len(runs) == 1:
        return runs[0]
    row = dict(pooled)
    stats = {}
    for k in REPEAT_FIGURES:
        st = repeat_stats([r.get(k) for r in runs])
        if st is not None:
            stats[k] = st
            row[k] = st["mean"]
    row["repeats"] = len(runs)
    row["repeat_stats"] = stats
    row["runs"] = [{k: r.get(k) for k in (*REPEAT_FIGURES, "wall_s", "requests", "n_ok", "mode", "rate",
                                          "dispatch_lag_ms", "ttft_ms", "tpot_ms", "e2e_ms")}
                   for r in runs]
    return row


@dataclass
class Level:
    """One level to measure: ``concurrency`` (closed loop) or ``rate`` requests/s (open loop)."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def value(self) -> float:
        return float(self.rate if self.rate is not None else self.concurrency or 0)


@dataclass
class LoadOptions:
    """How rate levels send and what each level also measures (defaults: the closed-loop sweep as before)."""

    arrival: str = "poisson"
    seed: int = 0
    max_concurrency: int | None = None
    slo: RequestSlo | None = None
    repeats: int = 1
    scrape: bool = True
    scrape_interval_s: float = 0.5
    search: LevelCriterion | None = None
    search_levels: int = 3  # extra levels the SLO search may measure (measured mode)
    probe: ProbeSpec | None = None  # the SLO search probes new levels (quantrack.measure.search)
    keep_samples: bool = False  # each row keeps its per-request samples (bench/parity_vllm_bench.py)
    dataset: str = "random"  # random | gsm8k | the workloads of quantrack.measure.workloads
    range_ratio: float = 0.0  # random: lengths uniform in [L(1-r), L(1+r)] (vllm bench serve --random-range-ratio)
    prefix_groups: int = 1  # shared-prefix: groups, each sharing one prefix
    prefix_tokens: int = 0  # shared-prefix: tokens of each group's prefix (0 = half the input length)
    turns: int = 2  # multi-turn: turns per conversation
    lengths: str | None = None  # length-mix: file of input/output pairs
    trace: str | None = None  # trace: Mooncake-format JSONL
    keep_sent: bool = False  # each row keeps what was sent (prompt ids, lengths, times): quantrack sweep --save

    def to_dict(self) -> dict[str, Any]:
        out = {"arrival": self.arrival, "seed": self.seed, "max_concurrency": self.max_concurrency,
               "slo": self.slo.to_dict() if self.slo else None, "repeats": self.repeats, "scrape": self.scrape,
               "search": self.search.text if self.search else None, "dataset": self.dataset,
               "range_ratio": self.range_ratio}
        if self.probe is not None:
            out["search_probe"] = self.probe.to_dict()
        if self.dataset == "shared-prefix":
            out.update(prefix_groups=self.prefix_groups, prefix_tokens=self.prefix_tokens)
        elif self.dataset == "multi-turn":
            out["turns"] = self.turns
        elif self.dataset == "length-mix":
            out["lengths"] = self.lengths
        elif self.dataset == "trace":
            out["trace"] = self.trace
        return out


@dataclass
class Sent:
    """What one request of a level sent (kept in the row with ``keep_sent``: ``quantrack sweep --save``)."""

    index: int
    input_tokens: int | None
    output_tokens: int
    prompt: str | list[int] | None = None
    group: int | None = None
    turn: int | None = None
    due_s: float | None = None  # scheduled send (rate levels), from the level's start
    sent_s: float | None = None  # actual send, from the level's start

    def to_dict(self, with_prompt: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"i": self.index, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                             "sent_s": self.sent_s}
        for k in ("group", "turn", "due_s"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if with_prompt:
            d["prompt"] = self.prompt
        return d


class _Sender:
    """Sends one level's units (a request, or a multi-turn conversation's turns in sequence) and keeps what came
    back: samples by request index, send times, and (``sent_log``) what each request sent."""

    def __init__(self, client: AsyncHttpStreamClient, engine: str, model: str | None, prompts: PromptSet, *,
                 output_tokens: int, input_tokens: int, chat: bool, progress: Progress | None, phase: str,
                 lens: list[tuple[int | None, int]] | None, workload: Workload | None,
                 sent_log: list[Sent] | None) -> None:
        self.client, self.engine, self.model, self.prompts = client, engine, model, prompts
        self.output_tokens, self.input_tokens, self.chat = output_tokens, input_tokens, chat
        self.progress, self.phase, self.lens, self.workload, self.sent_log = progress, phase, lens, workload, sent_log
        self.multi = workload is not None and workload.turns > 1
        self.samples: list[StreamSample | None] = [None] * len(prompts.prompts)
        self.sent_at: list[float] = []
        self.lags: list[float] = []  # rate levels: how far behind its schedule each request went out
        self.done = 0
        self.t0 = time.perf_counter()
        self.t_last = self.t0  # when the last request so far came back

    @property
    def complete(self) -> bool:
        """Every request of the level came back (answered or failed): the level is finished."""
        return all(s is not None for s in self.samples)

    async def send(self, i: int, prompt: str | list[int], n_in: int | None, due: float | None) -> StreamSample:
        n_out = self.lens[i][1] if self.lens else self.output_tokens
        path, payload = build_payload(self.engine, model=self.model, prompt=prompt, max_tokens=n_out, chat=self.chat)
        t_sent, sample = await self.client.stream(path, payload, chat=self.chat, keep_text=self.multi)
        self.sent_at.append(t_sent)
        sample = validate_sample(sample, output_tokens=n_out, input_tokens=n_in)
        self.samples[i] = sample
        self.t_last = time.perf_counter()
        if self.sent_log is not None:
            p = self.workload.requests[i] if self.workload is not None else None
            self.sent_log.append(Sent(i, n_in, n_out, prompt, p.group if p else None, p.turn if p else None,
                                      due, t_sent - self.t0))
        self.done += 1
        if self.progress:
            self.progress(self.phase, self.done, len(self.samples))
        return sample

    async def unit(self, idx: list[int], due: float | None) -> None:
        """Request ``idx[0]``; for a conversation each later turn after the previous one's answer."""
        history: list[int] | None = None
        answer: list[int] = []
        for pos, i in enumerate(idx):
            prompt = self.prompts.prompts[i]
            n_in = self.lens[i][0] if self.lens else self.input_tokens
            if history is not None and isinstance(prompt, list):
                prompt = follow_up_prompt(history, answer, prompt)
                n_in = len(prompt)
            s = await self.send(i, prompt, n_in, due if pos == 0 else None)
            if not self.multi:
                continue
            if not s.ok:  # the conversation cannot go on without the answer: the later turns count as failed
                for j in idx[pos + 1:]:
                    self.samples[j] = StreamSample(ok=False, error=f"not sent: turn {pos + 1} of its conversation "
                                                   "failed")
                    self.done += 1
                return
            history = list(prompt) if isinstance(prompt, list) else None
            answer = await self.answer_ids(s.text or "")

    async def answer_ids(self, text: str) -> list[int]:
        """The answer's text as token ids (the server's /tokenize, no special tokens): the history's next part."""
        from quantrack.engines import get_adapter

        if not text:
            return []
        path, body = get_adapter(self.engine).tokenize_request(text, add_special=False, model=self.model)
        answer = await self.client.post_json(path, body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise MeasurementError(f"{self.engine} /tokenize answered without a token list (multi-turn history)")
        return tokens


async def _run_level(
    client: AsyncHttpStreamClient,
    engine: str,
    model: str | None,
    prompts: PromptSet,
    level: Level,
    *,
    output_tokens: int,
    input_tokens: int,
    chat: bool,
    progress: Progress | None,
    opts: LoadOptions,
    seed: int = 0,
    lens: list[tuple[int | None, int]] | None = None,
    workload: Workload | None = None,
    sent_log: list[Sent] | None = None,
    box: list[_Sender] | None = None,
) -> tuple[list[StreamSample], float, list[float], list[float]]:
    """(samples, wall seconds, send times, dispatch lags) of one level; ``lens``: (input, output) tokens per
    request when they vary (None input: a text prompt of natural length). ``workload``: its conversations are the
    units sent (multi-turn: a conversation's turns in sequence, each resending the history and the previous answer)
    and its arrival offsets (trace) the schedule of a rate level. ``sent_log`` collects what each request sent;
    ``box`` gets the level's sender, so that what came back is there whatever stops the level."""
    import asyncio

    phase = f"rate {level.rate:g}/s" if level.rate is not None else f"concurrency {level.concurrency}"
    units = workload.conversations if workload is not None else [[i] for i in range(len(prompts.prompts))]
    tx = _Sender(client, engine, model, prompts, output_tokens=output_tokens, input_tokens=input_tokens, chat=chat,
                 progress=progress, phase=phase, lens=lens, workload=workload, sent_log=sent_log)
    if box is not None:
        box.append(tx)
    lags = tx.lags
    t0 = tx.t0
    if level.rate is None:
        queue = list(units)

        async def worker() -> None:
            while queue:
                await tx.unit(queue.pop(0), None)

        await asyncio.gather(*(worker() for _ in range(min(level.concurrency or 1, len(units)))))
    else:
        if workload is not None and workload.offsets is not None:
            offsets, _k = scaled_offsets([workload.offsets[u[0]] for u in units], level.rate)
        else:
            offsets = arrival_offsets(len(units), level.rate, opts.arrival, seed)
        gate = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
        tasks = []

        async def gated(idx: list[int], due: float) -> None:
            if gate is None:
                lags.append(time.perf_counter() - due)
                await tx.unit(idx, due - t0)
                return
            async with gate:  # as vllm bench serve --max-concurrency: the schedule waits for a free slot
                lags.append(time.perf_counter() - due)
                await tx.unit(idx, due - t0)

        for idx, off in zip(units, offsets):
            due = t0 + off
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(gated(idx, due)))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    return [s for s in tx.samples if s is not None], wall, tx.sent_at, lags


def run_sweep(
    base_url: str,
    engine: str,
    concurrency: list[int],
    *,
    requests_per_level: int | None = None,
    input_tokens: int = 1024,
    output_tokens: int = 128,
    warmup: int = 2,
    chat: bool = False,
    api_key: str | None = None,
    model: str | None = None,
    progress: Progress | None = None,
    timeout: float = 300.0,
    label: str | None = None,
    rates: list[float] | None = None,
    load: LoadOptions | None = None,
    on_level: Callable[[SweepResult], None] | None = None,
) -> SweepResult:
    """Measure each concurrency level, then each rate level, in turn (each ``load.repeats`` times); with
    ``load.search`` bisect between the measured levels for the highest one meeting it. Ctrl-C raises
    ``Interrupted`` whose ``partial`` keeps the finished levels (``interrupted``): the interrupt is never
    swallowed.

    A level is finished when every request of it came back; it is kept, and ``on_level(result)`` called, the
    moment it is, so a caller holds it whatever stops the sweep next (an interrupt, a second one that forces the
    exit, the engine gone). An interrupt that lands after a level's last request came back but before its row was
    built still keeps it (``interrupted_after_last_request``: its engine metrics were not scraped to its end)."""
    engine = check_engine(engine)
    base_url = check_base_url(base_url)
    opts = load or LoadOptions()
    rates = list(rates or [])
    check_counts(input_tokens=input_tokens, output_tokens=output_tokens, warmup=warmup)
    _check_levels(concurrency, rates, requests_per_level, opts)
    result = SweepResult(engine=engine, base_url=base_url, model=model, input_tokens=input_tokens,
                         output_tokens=output_tokens, chat=chat, label=label, load=opts.to_dict())
    levels = [Level(concurrency=c) for c in concurrency] + [Level(rate=float(r)) for r in rates]
    files = workload_files(opts, input_tokens, bool(rates))  # read and checked before the server is asked anything
    with HttpStreamClient(base_url, api_key=api_key, timeout=timeout) as sync:
        if result.model is None:
            result.model = discover_model(sync)
        lv = _Levels(sync, result, opts, files, base_url=base_url, api_key=api_key, timeout=timeout,
                     requests_per_level=requests_per_level, chat=chat, progress=progress, on_level=on_level)
        try:
            if warmup:
                wp = prepare_prompts(sync, engine, result.model, count=warmup, input_tokens=input_tokens, chat=chat)
                lv.offset += warmup
                for prompt in wp.prompts:
                    path, payload = build_payload(engine, model=result.model, prompt=prompt, max_tokens=output_tokens, chat=chat)
                    s = validate_sample(sync.stream(path, payload, chat=chat), output_tokens=output_tokens)
                    if not s.ok:
                        result.warmup_errors.append(s.error or "unknown")
            for level in levels:
                lv.measure(level)
            if opts.search is not None and opts.probe is not None:
                _probe(result, opts, lv)
            elif opts.search is not None:
                _search(result, lv.measured, opts, lv.measure, by_rate=bool(rates))
        except KeyboardInterrupt as exc:  # never swallowed: the caller decides; what was measured goes with it
            result.interrupted = True
            raise Interrupted.of(exc, partial=result) from None
        except Exception:
            # the finished levels were handed on (on_level) as each ended; the result says where the sweep stopped
            result.ended_early = (f"an error in level {_level_name(lv.current)}" if lv.current is not None
                                  else "an error before the first level")
            raise
    return result


_Repeat = tuple[dict[str, Any], list[StreamSample], float]  # one repeat of a level: its row, samples, wall seconds


class _Levels:
    """Measures a sweep's levels one by one against one server, and keeps each the moment it is finished (in the
    result, then ``on_level(result)``)."""

    def __init__(self, sync: HttpStreamClient, result: SweepResult, opts: LoadOptions, files: WorkloadFiles, *,
                 base_url: str, api_key: str | None, timeout: float, requests_per_level: int | None, chat: bool,
                 progress: Progress | None, on_level: Callable[[SweepResult], None] | None) -> None:
        self.sync, self.result, self.opts, self.files = sync, result, opts, files
        self.base_url, self.api_key, self.timeout = base_url, api_key, timeout
        self.requests_per_level, self.chat, self.progress, self.on_level = requests_per_level, chat, progress, on_level
        self.offset = 0  # prompts used so far (every request has its own prompt, across levels too)
        self.measured: dict[float, dict[str, Any]] = {}
        self.current: Level | None = None  # the level being measured (named when an error stops the sweep)

    def keep(self, row: dict[str, Any], level: Level) -> None:
        """A finished level: in the result, and handed on at once."""
        if not any(r is row for r in self.result.rows):
            self.result.rows.append(row)
        self.measured[level.value] = row
        if self.on_level is not None:
            self.on_level(self.result)

    def requests(self, level: Level) -> int:
        if self.requests_per_level:
            return self.requests_per_level
        if self.files.trace:
            return len(self.files.trace)  # a trace: every record unless --requests
        return (default_requests(level.concurrency) if level.concurrency is not None
                else default_rate_requests(level.rate or 1.0))

    def measure(self, level: Level, search: bool = False, repeats: int | None = None) -> dict[str, Any]:
        """One level, each of its repeats in turn; kept (``keep``) once its last repeat's requests all came back.

        An interrupt that lands after that (the level's "k/k" said, its row not built or not kept yet) keeps the
        level, then goes on; a level cut short is never made up."""
        r, opts = self.result, self.opts
        n = self.requests(level)
        self.current = level
        runs: list[_Repeat] = []
        whole: dict[str, Any] | None = None
        n_rep = repeats or opts.repeats
        for rep in range(n_rep):
            wseed = opts.seed + 7919 * rep + len(r.rows)
            ps, lens, wl = _plan_level(self.sync, r.engine, r.model, n, r.input_tokens, r.output_tokens, self.chat,
                                       self.offset, opts, wseed, self.files, level)
            self.offset += n
            r.prompt = ps.method
            sent_log: list[Sent] = []
            box: list[_Sender] = []
            got: tuple[Any, ...] | None = None
            last = rep == n_rep - 1
            cpu0 = time.process_time()
            try:
                got = asyncio_run(_level(
                    self.base_url, self.api_key, self.timeout, r.engine, r.model, ps, level, r.output_tokens,
                    r.input_tokens, self.chat, self.progress, opts, opts.seed + rep, lens, wl, sent_log, box))
                runs.append(self.repeat_row(level, got, time.process_time() - cpu0, ps.method, wseed, wl, sent_log))
                if last:
                    whole = self.combine(level, runs, search)
                    self.keep(whole, level)
            except KeyboardInterrupt:
                tx = box[-1] if box else None
                if not last or tx is None or not tx.complete:
                    raise
                if whole is None:
                    if len(runs) == rep:  # this repeat's row was not built yet: built from what came back
                        tail = got or ([x for x in tx.samples if x is not None], tx.t_last - tx.t0, tx.sent_at,
                                       tx.lags, None)
                        one = self.repeat_row(level, tail, time.process_time() - cpu0, ps.method, wseed, wl, sent_log)
                        if got is None:  # the level's engine metrics were not scraped to its end
                            one[0]["interrupted_after_last_request"] = True
                        runs.append(one)
                    whole = self.combine(level, runs, search)
                self.keep(whole, level)
                raise
        assert whole is not None
        return whole

    def repeat_row(self, level: Level, got: tuple[Any, ...], cpu: float, method: str, wseed: int,
                   wl: Workload | None, sent_log: list[Sent]) -> _Repeat:
        opts = self.opts
        samples, wall, sent, lags, scraped = got
        row = level_row(level.concurrency, samples, wall, rate=level.rate, sent_at=sent, lag_s=lags,
                        slo=opts.slo, client_cpu_s=cpu, max_concurrency=opts.max_concurrency)
        if scraped is not None:
            row["server_metrics"] = scraped
        row.update(prefix_cache_figure(samples, scraped, opts.scrape))
        row["workload"] = {"dataset": opts.dataset, "seed": wseed, "method": method, **(wl.params if wl else {})}
        if opts.keep_sent:
            row["sent"] = [x.to_dict(True) for x in sorted(sent_log, key=lambda x: x.index)]
        if opts.keep_samples:
            row["samples"] = [dict(x.to_dict(), t_start=x.t_start) for x in samples]
        return row, samples, wall

    def combine(self, level: Level, runs: list[_Repeat], search: bool) -> dict[str, Any]:
        """The level's row: its one repeat, or the repeats merged (mean and interval, pooled percentiles)."""
        opts = self.opts
        if len(runs) == 1:
            merged = runs[0][0]
        else:
            rows = [row for row, _s, _w in runs]
            pooled = [x for _r, samples, _w in runs for x in samples]
            merged = merge_repeats(rows, level_row(level.concurrency, pooled, sum(w for _r, _s, w in runs),
                                                   rate=level.rate, slo=opts.slo,
                                                   max_concurrency=opts.max_concurrency))
            merged["server_metrics"] = rows[-1].get("server_metrics")
            merged["prefix_cache"] = {"hit_rate": merged.get("prefix_cache_hit_rate"),
                                      "source": "mean over the repeats", "runs": [r.get("prefix_cache") for r in rows]}
            merged["workload"] = [r.get("workload") for r in rows]
            if opts.keep_sent:
                merged["sent"] = [r.get("sent") for r in rows]
            if any(r.get("interrupted_after_last_request") for r in rows):
                merged["interrupted_after_last_request"] = True
        if search:
            merged["search"] = True
        return merged


def _plan_level(sync: HttpStreamClient, engine: str, model: str | None, n: int, input_tokens: int,
                output_tokens: int, chat: bool, start: int, opts: LoadOptions, seed: int, files: WorkloadFiles,
                level: Level) -> tuple[PromptSet, list[tuple[int | None, int]] | None, Workload | None]:
    """A level's prompts, (input, output) lengths per request when they vary, and its workload (if not random or
    gsm8k)."""
    if opts.dataset not in WORKLOADS:
        ps, lens = level_prompts(sync, engine, model, n, input_tokens, output_tokens, chat, start, opts, seed)
        return ps, lens, None
    wl = level_workload(sync, engine, model, n, input_tokens, output_tokens, chat, opts, seed, files)
    if wl.offsets is not None:
        wl.method += (f"; replayed with its arrival times scaled to a mean {level.rate:g}/s" if level.rate is not None
                      else "; closed loop: the trace's arrival times are not used at a concurrency level")
    ps = PromptSet(prompts=[r.prompt for r in wl.requests], exact=True, method=wl.method)
    return ps, [(r.input_tokens, r.output_tokens) for r in wl.requests], wl


def _check_levels(concurrency: list[int], rates: list[float], requests_per_level: int | None,
                  opts: LoadOptions) -> None:
    if not concurrency and not rates and opts.probe is None:
        raise BadInput("give --concurrency levels or --rate levels (requests/s)")
    if any(c < 1 for c in concurrency):
        raise BadInput(f"--concurrency levels must be >= 1 (got {concurrency})")
    if any(not (isinstance(r, (int, float)) and r > 0 and r < 1e6) for r in rates):
        raise BadInput(f"--rate levels must be requests/s > 0 and < 1e6 (got {rates})")
    if concurrency and rates and opts.search is not None and opts.probe is None:
        raise BadInput("--slo-search bisects one kind of level: give --concurrency or --rate, not both")
    if requests_per_level is not None and requests_per_level < 1:
        raise BadInput(f"--requests must be >= 1 (got {requests_per_level})")
    if opts.arrival not in ARRIVALS:
        raise BadInput(f"--arrival must be one of {', '.join(ARRIVALS)} (got {opts.arrival!r})")
    if opts.max_concurrency is not None and opts.max_concurrency < 1:
        raise BadInput(f"--max-concurrency must be >= 1 (got {opts.max_concurrency})")
    if opts.repeats < 1:
        raise BadInput(f"--repeats must be >= 1 (got {opts.repeats})")
    if opts.dataset not in DATASETS:
        raise BadInput(f"--dataset must be one of {', '.join(DATASETS)} (got {opts.dataset!r})"
                       f"{did_you_mean(opts.dataset, DATASETS)}")
    if not 0 <= opts.range_ratio < 1:
        raise BadInput(f"--random-range-ratio must be in [0, 1) (got {opts.range_ratio})")


DATASETS = ("random", "gsm8k", *WORKLOADS)


def range_lengths(n: int, nominal: int, ratio: float, seed: int, minimum: int = 1) -> list[int]:
    """``n`` lengths uniform on the integers [int(L(1 - r)), int(L(1 + r))] (vLLM's random dataset with
    ``--random-range-ratio r``), at least ``minimum``; seeded."""
    import random

    if ratio <= 0:
        return [nominal] * n
    rng = random.Random(seed)
    lo, hi = max(minimum, int(nominal * (1 - ratio))), max(minimum, int(nominal * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def level_prompts(sync: HttpStreamClient, engine: str, model: str | None, n: int, input_tokens: int,
                  output_tokens: int, chat: bool, start: int, opts: LoadOptions,
                  seed: int) -> tuple[PromptSet, list[tuple[int | None, int]] | None]:
    """The level's prompts and, when lengths vary, (input, output) tokens per request."""
    if opts.dataset == "gsm8k":
        return gsm8k_prompts(sync, engine, model, n, start)
    if opts.range_ratio <= 0:
        return prepare_prompts(sync, engine, model, count=n, input_tokens=input_tokens, chat=chat, start=start), None
    ins = range_lengths(n, input_tokens, opts.range_ratio, seed)
    outs = range_lengths(n, output_tokens, opts.range_ratio, seed + 1, minimum=2)
    prompts: list[str | list[int]] = []
    exact = True
    for i, n_in in enumerate(ins):
        ps = prepare_prompts(sync, engine, model, count=1, input_tokens=n_in, chat=chat, start=start + i)
        prompts.extend(ps.prompts)
        exact = exact and ps.exact
    method = (f"{'exact' if exact else 'approximate'}: lengths uniform in [{min(ins)}, {max(ins)}] in and "
              f"[{min(outs)}, {max(outs)}] out (range ratio {opts.range_ratio:g}, seed {seed})")
    return PromptSet(prompts=prompts, exact=exact, method=method), [
        (n_in if exact else None, n_out) for n_in, n_out in zip(ins, outs)]


def gsm8k_prompts(sync: HttpStreamClient, engine: str, model: str | None, n: int,
                  start: int) -> tuple[PromptSet, list[tuple[int | None, int]]]:
    """GSM8K test questions as prompts (their natural lengths) and, as each request's output length, the token
    count of that question's reference answer (the server's /tokenize): real input/output length pairs."""
    from quantrack.accuracy.gsm8k import load_data
    from quantrack.errors import MeasurementError
    from quantrack.measure.prompts import server_tokenizer

    test = load_data(0).test
    tokenize = server_tokenizer(engine, sync.request_json, model)
    qs = [test[(start + i) % len(test)] for i in range(n)]
    try:
        outs = [max(2, len(tokenize(q["answer"]))) for q in qs]
    except MeasurementError as exc:
        raise MeasurementError(f"dataset gsm8k needs the server's /tokenize for the answers' lengths: {exc}") from None
    method = (f"gsm8k: test questions {start % len(test)}.. as text ({len(test)} shipped), output = the reference "
              f"answer's token count ({min(outs)}-{max(outs)})")
    return PromptSet(prompts=[q["question"] for q in qs], exact=False, method=method), [(None, o) for o in outs]


@dataclass
class WorkloadFiles:
    """The files a workload reads, read and checked once before the sweep starts."""

    lengths: list[tuple[int, int, float]] | None = None
    trace: list[Any] | None = None


def workload_files(opts: LoadOptions, input_tokens: int, has_rates: bool) -> WorkloadFiles:
    """Check the workload's options and read its file (a bad one: BadInput before any request)."""
    from quantrack.measure.workloads import read_lengths, read_trace, scaled_offsets

    d = opts.dataset
    given = {"--lengths": opts.lengths, "--trace": opts.trace}
    wants = {"length-mix": "--lengths", "trace": "--trace"}.get(d)
    for flag, v in given.items():
        if v is not None and flag != wants:
            raise BadInput(f"{flag} applies to --dataset {'length-mix' if flag == '--lengths' else 'trace'} "
                           f"(got --dataset {d})")
    if d == "shared-prefix":
        if opts.prefix_groups < 1:
            raise BadInput(f"--prefix-groups must be >= 1 (got {opts.prefix_groups})")
        p = opts.prefix_tokens or input_tokens // 2
        if not 1 <= p < input_tokens:
            raise BadInput(f"--prefix-tokens must be >= 1 and below --input-tokens {input_tokens} (got {p}): the "
                           "distinct suffix needs at least one token")
    if d == "multi-turn" and opts.turns < 1:
        raise BadInput(f"--turns must be >= 1 (got {opts.turns})")
    if d == "length-mix":
        if not opts.lengths:
            raise BadInput("--dataset length-mix needs --lengths FILE (lines 'input,output[,weight]')")
        return WorkloadFiles(lengths=read_lengths(opts.lengths))
    if d == "trace":
        if not opts.trace:
            raise BadInput("--dataset trace needs --trace FILE (Mooncake JSONL: timestamp, input_length, "
                           "output_length per line)")
        recs = read_trace(opts.trace)
        if has_rates:
            scaled_offsets([r.timestamp_ms / 1000.0 for r in recs], 1.0)  # a trace with no span cannot be scaled
        return WorkloadFiles(trace=recs)
    return WorkloadFiles()


def level_workload(sync: HttpStreamClient, engine: str, model: str | None, n: int, input_tokens: int,
                   output_tokens: int, chat: bool, opts: LoadOptions, seed: int, files: WorkloadFiles) -> Workload:
    """One level's requests of a :mod:`quantrack.measure.workloads` workload, as exact token ids from the
    server's /tokenize (these workloads need it: a shared prefix or a history is only shared token for token)."""
    from quantrack.measure import workloads as w
    from quantrack.measure.prompts import build_prompts, server_tokenizer

    if chat:
        raise BadInput(f"--dataset {opts.dataset} sends token ids to /v1/completions: leave out --chat")
    tokenize = server_tokenizer(engine, sync.request_json, model)
    plain = server_tokenizer(engine, sync.request_json, model, add_special=False)
    try:
        if opts.dataset == "shared-prefix":
            return w.shared_prefix(n, input_tokens, output_tokens, groups=opts.prefix_groups,
                                   prefix_tokens=opts.prefix_tokens or input_tokens // 2, tokenize=tokenize,
                                   tokenize_plain=plain, seed=seed)
        if opts.dataset == "multi-turn":
            return w.multi_turn(n, input_tokens, output_tokens, turns=opts.turns, tokenize=tokenize,
                                tokenize_plain=plain, seed=seed)
        if opts.dataset == "length-mix":
            assert files.lengths is not None
            from quantrack.measure.prompts import new_salt

            salt = new_salt()

            def build(i: int, n_in: int) -> list[int] | str:
                return build_prompts(1, n_in, tokenize, chat=False, source=f"{engine} /tokenize", start=i,
                                     salt=salt).prompts[0]

            return w.length_mix(n, files.lengths, build=build, seed=seed, source=str(opts.lengths))
        assert opts.dataset == "trace" and files.trace is not None
        return w.trace_workload(files.trace, n, tokenize=tokenize, tokenize_plain=plain, seed=seed,
                                source=str(opts.trace))
    except MeasurementError as exc:
        raise MeasurementError(f"--dataset {opts.dataset} needs exact token ids from the server's /tokenize: "
                               f"{exc}") from None


def prefix_cache_figure(samples: list[StreamSample], scraped: dict[str, Any] | None,
                        scrape: bool = True) -> dict[str, Any]:
    """The level's prefix-cache hit rate (cached prompt tokens / prompt tokens), measured by the engine:

    from its /metrics counters over the level (vLLM ``prefix_cache_hits/queries``, llama.cpp
    ``prompt_tokens_cached/prompt_tokens``; SGLang: its ``cache_hit_rate`` gauge), else from the cached-token
    counts the server reported per request (llama.cpp ``timings.cache_n``, OpenAI ``prompt_tokens_details``);
    else None with ``unknown`` saying why. Returns ``prefix_cache_hit_rate`` and ``prefix_cache`` (both sources)."""
    counts = [c for s in samples if s.ok and (c := s.prompt_cache_counts()) is not None]
    total = sum(t for _, t in counts)
    per_request = sum(c for c, _ in counts) / total if counts and total > 0 else None
    engine = scraped.get("prefix_cache_hit_rate") if scraped else None
    info: dict[str, Any] = {"engine_metrics": engine, "responses": per_request,
                            "responses_n": len(counts)}
    if engine is not None:
        info.update(hit_rate=engine, source=scraped.get("source") if scraped else None)
    elif per_request is not None:
        info.update(hit_rate=per_request, source="the server's per-request cached-token counts (llama.cpp "
                    "timings.cache_n / usage.prompt_tokens_details.cached_tokens), summed over the level")
    else:
        why_metrics = ("not scraped (--no-scrape)" if not scrape else
                       ((scraped or {}).get("unknown") or {}).get("prefix_cache_hit_rate")
                       or "the engine's /metrics serve no prefix-cache counter")
        info.update(hit_rate=None, source=None,
                    unknown=f"/metrics: {why_metrics}; responses: no cached-token count in them")
    return {"prefix_cache_hit_rate": info["hit_rate"], "prefix_cache": info}


def load_options(sw: Any) -> LoadOptions:
    """LoadOptions from a study's [sweep] table (``quantrack.study.SweepSpec``); the strings parsed here."""
    from quantrack.measure.load import parse_criterion, parse_request_slo
    from quantrack.measure.search import probe_spec

    search = parse_criterion(sw.slo_search, "[sweep] slo_search") if sw.slo_search else None
    probe = probe_spec(sw.search_mode, sw.search_range, sw.search_tolerance, sw.search_repeats, criterion=search,
                       prefix="[sweep] ")
    return LoadOptions(arrival=sw.arrival, seed=sw.seed, max_concurrency=sw.max_concurrency or None,
                       slo=parse_request_slo(sw.goodput, "[sweep] goodput") if sw.goodput else None,
                       repeats=sw.repeats, scrape=sw.scrape, search=search, probe=probe,
                       dataset=sw.dataset, range_ratio=sw.range_ratio, prefix_groups=sw.prefix_groups,
                       prefix_tokens=sw.prefix_tokens, turns=sw.turns, lengths=sw.lengths, trace=sw.trace)


def default_rate_requests(rate: float) -> int:
    """Requests per rate level when not given: about 8 seconds of arrivals, at least 8."""
    return max(8, round(8 * rate))


def _search(result: SweepResult, measured: dict[float, dict[str, Any]], opts: LoadOptions,
            measure: Any, *, by_rate: bool) -> None:
    crit = opts.search
    assert crit is not None
    mode = "rate" if by_rate else "concurrency"

    def verdicts() -> tuple[dict[float, bool], dict[float, float | None]]:
        v = {x: bool(crit.met(r)) for x, r in measured.items() if crit.met(r) is not None}
        return v, {x: crit.value(r) for x, r in measured.items()}

    for _ in range(opts.search_levels):
        v, _vals = verdicts()
        nxt = next_search_level(v, integer=not by_rate)
        if nxt is None or nxt in measured:
            break
        measure(Level(rate=nxt) if by_rate else Level(concurrency=int(nxt)), search=True)  # kept as it ends
    result.rows.sort(key=lambda r: float(r.get("rate" if by_rate else "concurrency") or 0))
    v, vals = verdicts()
    result.slo_search = search_result(crit, v, vals, mode)


def _probe(result: SweepResult, opts: LoadOptions, lv: _Levels) -> None:
    """The SLO search that measures: each probe a level of the sweep (kept and handed on like the others)."""
    crit, spec = opts.search, opts.probe
    assert crit is not None and spec is not None

    def measure(x: float) -> Any:
        level = Level(rate=x) if spec.mode == "rate" else Level(concurrency=int(x))
        row = lv.measure(level, search=True, repeats=spec.repeats)
        return outcome_from_row(crit, row, x, spec.margin)

    trace = SearchTrace()
    try:
        result.slo_search = probe_search(crit, spec, measure, trace)
    except KeyboardInterrupt:  # the finished probes' bracket, labelled interrupted; the interrupt goes on
        result.slo_search = interrupted_result(crit, spec, trace)
        raise
    finally:
        result.rows.sort(key=lambda r: (r.get("mode") != "concurrency",
                                        float(r.get("rate" if r.get("mode") == "rate" else "concurrency") or 0)))


def _level_name(level: Level) -> str:
    """``c16`` / ``r2.5``, as :func:`level_label` names a row."""
    return f"r{level.rate:g}" if level.rate is not None else f"c{level.concurrency}"


def asyncio_run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


async def _level(
    base_url: str,
    api_key: str | None,
    timeout: float,
    engine: str,
    model: str | None,
    prompts: PromptSet,
    level: Level,
    output_tokens: int,
    input_tokens: int,
    chat: bool,
    progress: Progress | None,
    opts: LoadOptions,
    seed: int,
    lens: list[tuple[int | None, int]] | None = None,
    workload: Workload | None = None,
    sent_log: list[Sent] | None = None,
    box: list[_Sender] | None = None,
) -> tuple[list[StreamSample], float, list[float], list[float], dict[str, Any] | None]:
    import asyncio

    from quantrack.measure.scrape import MetricsScraper, summarize_scrapes

    width = level.concurrency or opts.max_concurrency or max(1, len(prompts.prompts))
    if workload is not None and workload.turns > 1:
        width = width + 1  # the multi-turn history's /tokenize beside the streams
    client = AsyncHttpStreamClient(base_url, api_key=api_key, timeout=timeout, max_connections=width + 1)
    scraper = task = None
    try:
        if opts.scrape:
            scraper = MetricsScraper(client._client, base_url, engine, interval=opts.scrape_interval_s,
                                     api_key=api_key)
            task = asyncio.create_task(scraper.run())
        samples, wall, sent, lags = await _run_level(
            client, engine, model, prompts, level, output_tokens=output_tokens, input_tokens=input_tokens,
            chat=chat, progress=progress, opts=opts, seed=seed, lens=lens, workload=workload, sent_log=sent_log,
            box=box)
        scraped = None
        if scraper is not None and task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await scraper.final()
            scraped = summarize_scrapes(scraper.log)
        return samples, wall, sent, lags, scraped
    finally:
        if task is not None and not task.done():
            task.cancel()
        await client.aclose()
