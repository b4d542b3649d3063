"""Throughput and latency at several concurrency levels against a running server.

At each level exactly ``c`` requests are kept in flight (asyncio + httpx.AsyncClient) until
``requests_per_level`` have finished; lengths are fixed and forced as in :mod:`latency`.
Per level (all *measured*):

* output throughput = sum of usage.completion_tokens of the successful requests / level wall time
  (wall time = first request sent -> last request finished);
* TTFT, TPOT (= (e2e - TTFT) / (output tokens - 1) per request), e2e: p50/p90/p99 and mean;
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
from quantrack.measure.prompts import PromptSet
from quantrack.measure.stats import summarize

SWEEP_FORMAT = "quantrack-sweep/1"
SWEEP_FORMULAS = {
    "output_tok_s": "output throughput = sum(usage.completion_tokens of ok requests) / level wall time",
    "wall_s": "level wall time = first request sent -> last request finished",
    "tpot": FORMULAS["tpot"],
    "ttft": FORMULAS["ttft"],
}


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
            "interrupted": self.interrupted,
            "timestamp": self.timestamp,
        }


def level_row(concurrency: int, samples: list[StreamSample], wall_s: float) -> dict[str, Any]:
    """Aggregate one level (pure: samples already validated)."""
    ok = [s for s in samples if s.ok]
    out_tokens = sum(s.output_tokens or 0 for s in ok)

    def pct(vals: list[float]) -> dict[str, float] | None:
        sm = summarize(vals)
        return None if sm is None else {"p50": sm.median, "p90": sm.p90, "p99": sm.p99, "mean": sm.mean, "n": sm.n}

    ttft = pct([s.ttft * 1000 for s in ok if s.ttft is not None])
    tpot = pct([s.tpot * 1000 for s in ok if s.tpot is not None])
    return {
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
        "e2e_ms": pct([s.e2e * 1000 for s in ok if s.e2e is not None]),
        "ttft_p50_ms": ttft["p50"] if ttft else None,
        "tpot_p50_ms": tpot["p50"] if tpot else None,
    }


async def _run_level(
    client: AsyncHttpStreamClient,
    engine: str,
    model: str | None,
    prompts: PromptSet,
    concurrency: int,
    *,
    output_tokens: int,
    input_tokens: int,
    chat: bool,
    progress: Progress | None,
) -> tuple[list[StreamSample], float]:
    import asyncio

    queue = list(enumerate(prompts.prompts))
    samples: list[StreamSample | None] = [None] * len(queue)
    done = 0

    async def worker() -> None:
        nonlocal done
        while queue:
            i, prompt = queue.pop(0)
            path, payload = build_payload(engine, model=model, prompt=prompt, max_tokens=output_tokens, chat=chat)
            _, sample = await client.stream(path, payload, chat=chat)
            samples[i] = validate_sample(sample, output_tokens=output_tokens, input_tokens=input_tokens)
            done += 1
            if progress:
                progress(f"concurrency {concurrency}", done, len(samples))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(queue)))))
    wall = time.perf_counter() - t0
    return [s for s in samples if s is not None], wall


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
) -> SweepResult:
    """Measure each concurrency level in turn; Ctrl-C raises ``Interrupted`` whose ``partial`` keeps the finished
    levels (``interrupted``): the interrupt is never swallowed."""
    import asyncio

    engine = check_engine(engine)
    base_url = check_base_url(base_url)
    check_counts(input_tokens=input_tokens, output_tokens=output_tokens, warmup=warmup)
    if not concurrency or any(c < 1 for c in concurrency):
        raise BadInput(f"--concurrency levels must be >= 1 (got {concurrency})")
    if requests_per_level is not None and requests_per_level < 1:
        raise BadInput(f"--requests must be >= 1 (got {requests_per_level})")
    result = SweepResult(engine=engine, base_url=base_url, model=model, input_tokens=input_tokens, output_tokens=output_tokens, chat=chat, label=label)
    offset = 0
    with HttpStreamClient(base_url, api_key=api_key, timeout=timeout) as sync:
        if result.model is None:
            result.model = discover_model(sync)
        try:
            if warmup:
                wp = prepare_prompts(sync, engine, result.model, count=warmup, input_tokens=input_tokens, chat=chat)
                offset += warmup
                for prompt in wp.prompts:
                    path, payload = build_payload(engine, model=result.model, prompt=prompt, max_tokens=output_tokens, chat=chat)
                    s = validate_sample(sync.stream(path, payload, chat=chat), output_tokens=output_tokens)
                    if not s.ok:
                        result.warmup_errors.append(s.error or "unknown")
            for c in concurrency:
                n = requests_per_level or default_requests(c)
                ps = prepare_prompts(sync, engine, result.model, count=n, input_tokens=input_tokens, chat=chat, start=offset)
                offset += n
                result.prompt = ps.method
                samples, wall = asyncio.run(_level(base_url, api_key, timeout, engine, result.model, ps, c, output_tokens, input_tokens, chat, progress))
                result.rows.append(level_row(c, samples, wall))
        except KeyboardInterrupt as exc:  # never swallowed: the caller decides; what was measured goes with it
            result.interrupted = True
            raise Interrupted.of(exc, partial=result) from None
    return result


async def _level(
    base_url: str,
    api_key: str | None,
    timeout: float,
    engine: str,
    model: str | None,
    prompts: PromptSet,
    c: int,
    output_tokens: int,
    input_tokens: int,
    chat: bool,
    progress: Progress | None,
) -> tuple[list[StreamSample], float]:
    client = AsyncHttpStreamClient(base_url, api_key=api_key, timeout=timeout, max_connections=max(c, 1))
    try:
        return await _run_level(
            client, engine, model, prompts, c, output_tokens=output_tokens, input_tokens=input_tokens, chat=chat, progress=progress
        )
    finally:
        await client.aclose()
