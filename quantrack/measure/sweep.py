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

Every request has its own prompt (also across levels), so prefix caches do not shorten prefill.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from quantrack.errors import BadInput
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
from quantrack.measure.stats import percentile, summarize

SWEEP_FORMAT = "quantrack-sweep/1"
SWEEP_FORMULAS = {
    "output_tok_s": "output throughput = sum(usage.completion_tokens of ok requests) / level wall time",
    "wall_s": "level wall time = first request sent -> last request finished",
    "tpot": FORMULAS["tpot"],
    "ttft": FORMULAS["ttft"],
    "achieved_rate": "achieved rate = (requests sent - 1) / (last send - first send)",
    "goodput": "goodput = requests meeting every per-request SLO / level wall time",
    "mean_in_flight": "mean in flight = sum(request e2e) / level wall time",
    "repeats": "with repeats: each figure's mean over the repeats and its 95% Student-t interval",
}
# figures of a level that get a mean and interval over repeats
REPEAT_FIGURES = ("output_tok_s", "request_s", "ttft_p50_ms", "tpot_p50_ms", "tpot_p95_ms", "e2e_p50_ms",
                  "goodput_request_s", "achieved_rate")


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
    row["runs"] = [{k: r.get(k) for k in (*REPEAT_FIGURES, "wall_s", "requests", "n_ok")}
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
    search_levels: int = 3  # extra levels the SLO search may measure
    keep_samples: bool = False  # each row keeps its per-request samples (bench/parity_vllm_bench.py)
    dataset: str = "random"  # random: filler of exact token counts; gsm8k: test questions, answers' lengths out
    range_ratio: float = 0.0  # random: lengths uniform in [L(1-r), L(1+r)] (vllm bench serve --random-range-ratio)

    def to_dict(self) -> dict[str, Any]:
        return {"arrival": self.arrival, "seed": self.seed, "max_concurrency": self.max_concurrency,
                "slo": self.slo.to_dict() if self.slo else None, "repeats": self.repeats, "scrape": self.scrape,
                "search": self.search.text if self.search else None, "dataset": self.dataset,
                "range_ratio": self.range_ratio}


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
) -> tuple[list[StreamSample], float, list[float], list[float]]:
    """(samples, wall seconds, send times, dispatch lags) of one level; ``lens``: (input, output) tokens per
    request when they vary (None input: a text prompt of natural length)."""
    import asyncio

    n = len(prompts.prompts)
    samples: list[StreamSample | None] = [None] * n
    sent_at: list[float] = []
    lags: list[float] = []
    done = 0
    phase = f"rate {level.rate:g}/s" if level.rate is not None else f"concurrency {level.concurrency}"

    async def one(i: int, prompt: str | list[int]) -> None:
        nonlocal done
        n_in, n_out = lens[i] if lens else (input_tokens, output_tokens)
        path, payload = build_payload(engine, model=model, prompt=prompt, max_tokens=n_out, chat=chat)
        t_sent, sample = await client.stream(path, payload, chat=chat)
        sent_at.append(t_sent)
        samples[i] = validate_sample(sample, output_tokens=n_out, input_tokens=n_in)
        done += 1
        if progress:
            progress(phase, done, n)

    t0 = time.perf_counter()
    if level.rate is None:
        queue = list(enumerate(prompts.prompts))

        async def worker() -> None:
            while queue:
                i, prompt = queue.pop(0)
                await one(i, prompt)

        await asyncio.gather(*(worker() for _ in range(min(level.concurrency or 1, n))))
    else:
        offsets = arrival_offsets(n, level.rate, opts.arrival, seed)
        gate = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
        tasks = []

        async def gated(i: int, prompt: str | list[int], due: float) -> None:
            if gate is None:
                lags.append(time.perf_counter() - due)
                await one(i, prompt)
                return
            async with gate:  # as vllm bench serve --max-concurrency: the schedule waits for a free slot
                lags.append(time.perf_counter() - due)
                await one(i, prompt)

        for i, (prompt, off) in enumerate(zip(prompts.prompts, offsets)):
            due = t0 + off
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(gated(i, prompt, due)))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    return [s for s in samples if s is not None], wall, sent_at, lags


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
) -> SweepResult:
    """Measure each concurrency level, then each rate level, in turn (each ``load.repeats`` times); with
    ``load.search`` bisect between the measured levels for the highest one meeting it. Ctrl-C raises
    ``Interrupted`` whose ``partial`` keeps the finished levels (``interrupted``): the interrupt is never
    swallowed."""
    engine = check_engine(engine)
    base_url = check_base_url(base_url)
    opts = load or LoadOptions()
    rates = list(rates or [])
    check_counts(input_tokens=input_tokens, output_tokens=output_tokens, warmup=warmup)
    _check_levels(concurrency, rates, requests_per_level, opts)
    result = SweepResult(engine=engine, base_url=base_url, model=model, input_tokens=input_tokens,
                         output_tokens=output_tokens, chat=chat, label=label, load=opts.to_dict())
    levels = [Level(concurrency=c) for c in concurrency] + [Level(rate=float(r)) for r in rates]
    state = {"offset": 0}
    with HttpStreamClient(base_url, api_key=api_key, timeout=timeout) as sync:
        if result.model is None:
            result.model = discover_model(sync)
        try:
            if warmup:
                wp = prepare_prompts(sync, engine, result.model, count=warmup, input_tokens=input_tokens, chat=chat)
                state["offset"] += warmup
                for prompt in wp.prompts:
                    path, payload = build_payload(engine, model=result.model, prompt=prompt, max_tokens=output_tokens, chat=chat)
                    s = validate_sample(sync.stream(path, payload, chat=chat), output_tokens=output_tokens)
                    if not s.ok:
                        result.warmup_errors.append(s.error or "unknown")

            def measure(level: Level) -> dict[str, Any]:
                n = requests_per_level or (default_requests(level.concurrency) if level.concurrency is not None
                                           else default_rate_requests(level.rate or 1.0))
                runs, pooled, walls = [], [], 0.0
                for rep in range(opts.repeats):
                    ps, lens = level_prompts(sync, engine, result.model, n, input_tokens, output_tokens, chat,
                                             state["offset"], opts, opts.seed + 7919 * rep + len(result.rows))
                    state["offset"] += n
                    result.prompt = ps.method
                    cpu0 = time.process_time()
                    samples, wall, sent, lags, scraped = asyncio_run(_level(
                        base_url, api_key, timeout, engine, result.model, ps, level, output_tokens, input_tokens,
                        chat, progress, opts, opts.seed + rep, lens))
                    cpu = time.process_time() - cpu0
                    row = level_row(level.concurrency, samples, wall, rate=level.rate, sent_at=sent, lag_s=lags,
                                    slo=opts.slo, client_cpu_s=cpu, max_concurrency=opts.max_concurrency)
                    if scraped is not None:
                        row["server_metrics"] = scraped
                    if opts.keep_samples:
                        row["samples"] = [dict(x.to_dict(), t_start=x.t_start) for x in samples]
                    runs.append(row)
                    pooled.extend(samples)
                    walls += wall
                if len(runs) == 1:
                    return runs[0]
                merged = merge_repeats(runs, level_row(level.concurrency, pooled, walls, rate=level.rate,
                                                       slo=opts.slo, max_concurrency=opts.max_concurrency))
                merged["server_metrics"] = runs[-1].get("server_metrics")
                return merged

            measured: dict[float, dict[str, Any]] = {}
            for level in levels:
                row = measure(level)
                result.rows.append(row)
                measured[level.value] = row
            if opts.search is not None:
                _search(result, measured, opts, measure, by_rate=bool(rates))
        except KeyboardInterrupt as exc:  # never swallowed: the caller decides; what was measured goes with it
            result.interrupted = True
            raise Interrupted.of(exc, partial=result) from None
    return result


def _check_levels(concurrency: list[int], rates: list[float], requests_per_level: int | None,
                  opts: LoadOptions) -> None:
    if not concurrency and not rates:
        raise BadInput("give --concurrency levels or --rate levels (requests/s)")
    if any(c < 1 for c in concurrency):
        raise BadInput(f"--concurrency levels must be >= 1 (got {concurrency})")
    if any(not (isinstance(r, (int, float)) and r > 0 and r < 1e6) for r in rates):
        raise BadInput(f"--rate levels must be requests/s > 0 and < 1e6 (got {rates})")
    if concurrency and rates and opts.search is not None:
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
        raise BadInput(f"--dataset must be one of {', '.join(DATASETS)} (got {opts.dataset!r})")
    if not 0 <= opts.range_ratio < 1:
        raise BadInput(f"--random-range-ratio must be in [0, 1) (got {opts.range_ratio})")


DATASETS = ("random", "gsm8k")


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


def load_options(sw: Any) -> LoadOptions:
    """LoadOptions from a study's [sweep] table (``quantrack.study.SweepSpec``); the strings parsed here."""
    from quantrack.measure.load import parse_criterion, parse_request_slo

    return LoadOptions(arrival=sw.arrival, seed=sw.seed, max_concurrency=sw.max_concurrency or None,
                       slo=parse_request_slo(sw.goodput, "[sweep] goodput") if sw.goodput else None,
                       repeats=sw.repeats, scrape=sw.scrape,
                       search=parse_criterion(sw.slo_search, "[sweep] slo_search") if sw.slo_search else None,
                       dataset=sw.dataset, range_ratio=sw.range_ratio)


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
        level = Level(rate=nxt) if by_rate else Level(concurrency=int(nxt))
        row = measure(level)
        row["search"] = True
        result.rows.append(row)
        measured[level.value] = row
    result.rows.sort(key=lambda r: float(r.get("rate" if by_rate else "concurrency") or 0))
    v, vals = verdicts()
    result.slo_search = search_result(crit, v, vals, mode)


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
) -> tuple[list[StreamSample], float, list[float], list[float], dict[str, Any] | None]:
    import asyncio

    from quantrack.measure.scrape import MetricsScraper, summarize_scrapes

    width = level.concurrency or opts.max_concurrency or max(1, len(prompts.prompts))
    client = AsyncHttpStreamClient(base_url, api_key=api_key, timeout=timeout, max_connections=width + 1)
    scraper = task = None
    try:
        if opts.scrape:
            scraper = MetricsScraper(client._client, base_url, engine, interval=opts.scrape_interval_s,
                                     api_key=api_key)
            task = asyncio.create_task(scraper.run())
        samples, wall, sent, lags = await _run_level(
            client, engine, model, prompts, level, output_tokens=output_tokens, input_tokens=input_tokens,
            chat=chat, progress=progress, opts=opts, seed=seed, lens=lens)
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
