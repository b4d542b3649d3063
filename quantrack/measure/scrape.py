"""The engine's own view of a sweep level: its Prometheus ``/metrics`` (and llama.cpp's ``/slots``), polled.

While a level runs, :class:`MetricsScraper` reads the server's metrics endpoint every ``interval`` seconds
(one request at a time, on the sweep's event loop, so it never adds more than one connection) and
:func:`summarize_scrapes` turns the samples into the level's figures, all *measured by the engine*:

* ``kv_usage_max`` / ``kv_usage_mean``: KV-cache usage as a fraction of the cache (gauge);
* ``running_max`` / ``running_mean`` and ``waiting_max`` / ``waiting_mean``: requests being decoded / queued;
* ``preemptions``: counter increase over the level;
* ``prefix_cache_hit_rate``: cached prompt tokens / prompt tokens, from counter increases over the level.

Which series each engine serves (each adapter's ``metric_series`` in ``quantrack.engines``):

* vLLM (V1 engine, ``vllm/v1/metrics/loggers.py``): ``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``),
  ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:num_preemptions_total``,
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (tokens);
* SGLang (``python/sglang/srt/metrics/collector.py``): ``sglang:token_usage``, ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:cache_hit_rate`` (a gauge), ``sglang:num_retracted_reqs``;
* llama.cpp (observed from the xllamacpp 2026.10.11549 server, started with ``--metrics``):
  ``llamacpp:requests_processing``, ``llamacpp:requests_deferred``, ``llamacpp:prompt_tokens_total`` (excluding
  cached) and ``llamacpp:prompt_tokens_cached_total``; it serves **no KV-usage gauge and no preemption
  counter**, so those read ``unknown`` with that reason. ``/slots`` gives the busy slots (``is_processing``).

A figure the endpoint does not serve is ``None`` and named in ``unknown`` with why: never a zero.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any


def engine_series(engine: str) -> dict[str, tuple[str, ...]]:
    """figure -> candidate series names for ``engine`` (its adapter's ``metric_series``)."""
    from quantrack.engines import get_adapter

    return dict(get_adapter(engine).metric_series)


GAUGES = ("kv_usage", "running", "waiting")
FIGURES = ("kv_usage_max", "kv_usage_mean", "running_max", "running_mean", "waiting_max", "waiting_mean",
           "preemptions", "prefix_cache_hit_rate", "busy_slots_max")


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {series name: value}, summed over label sets (one model per server).

    ``# HELP`` / ``# TYPE`` lines and malformed lines are skipped; ``_created`` timestamps are dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            _, _, value = rest.rpartition("}")
        else:
            name, _, value = line.partition(" ")
        parts = value.split()
        if not parts or name.endswith("_created"):
            continue
        try:
            v = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(v):
            out[name] = out.get(name, 0.0) + v
    return out


def pick(series: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        if n in series:
            return series[n]
    return None


@dataclass
class Scrape:
    t: float  # seconds from the level's start
    series: dict[str, float]
    busy_slots: int | None = None


@dataclass
class ScrapeLog:
    """What one level's scraping saw (``samples``) and why it could not (``errors``)."""

    engine: str
    path: str = "/metrics"
    slots_path: str | None = None
    samples: list[Scrape] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _delta(first: Scrape, last: Scrape, names: tuple[str, ...]) -> float | None:
    a, b = pick(first.series, names), pick(last.series, names)
    return None if a is None or b is None else max(0.0, b - a)


def summarize_scrapes(log: ScrapeLog) -> dict[str, Any]:
    """The level's engine figures (see the module docstring) plus ``n_scrapes``, ``source`` and ``unknown``."""
    names = engine_series(log.engine)
    out: dict[str, Any] = {"source": f"{log.engine} {log.path} (measured by the engine)", "n_scrapes": len(log.samples)}
    unknown: dict[str, str] = {}
    for k in FIGURES:
        out[k] = None
    if not log.samples:
        why = log.errors[0] if log.errors else "no scrape finished during the level"
        out["unknown"] = {k: why for k in FIGURES}
        return out
    for g in GAUGES:
        cands = names.get(g)
        vals = [v for s in log.samples if cands and (v := pick(s.series, cands)) is not None]
        if vals:
            out[f"{g}_max"] = max(vals)
            out[f"{g}_mean"] = sum(vals) / len(vals)
        else:
            why = (f"{log.engine} serves no {g} series" if not cands else
                   f"none of {', '.join(cands)} in {log.path}")
            unknown[f"{g}_max"] = unknown[f"{g}_mean"] = why
    first, last = log.samples[0], log.samples[-1]
    if "preemptions" in names:
        out["preemptions"] = _delta(first, last, names["preemptions"])
        if out["preemptions"] is None:
            unknown["preemptions"] = f"none of {', '.join(names['preemptions'])} in {log.path}"
    else:
        unknown["preemptions"] = f"{log.engine} serves no preemption counter"
    out["prefix_cache_hit_rate"] = _prefix_rate(log, names)
    if out["prefix_cache_hit_rate"] is None:
        unknown["prefix_cache_hit_rate"] = ("no prompt tokens counted between the first and last scrape"
                                            if len(log.samples) > 1 else "one scrape: no counter increase to read")
    slots = [s.busy_slots for s in log.samples if s.busy_slots is not None]
    if slots:
        out["busy_slots_max"] = max(slots)
    elif log.slots_path:
        unknown["busy_slots_max"] = f"{log.slots_path} did not answer"
    if log.errors:
        out["errors"] = sorted(set(log.errors))[:3]
    out["unknown"] = unknown
    return out


def _prefix_rate(log: ScrapeLog, names: dict[str, tuple[str, ...]]) -> float | None:
    """Cached prompt tokens / prompt tokens over the level (counters), or the engine's own hit-rate gauge."""
    first, last = log.samples[0], log.samples[-1]
    if "prefix_queries" in names:
        hits, queries = _delta(first, last, names["prefix_hits"]), _delta(first, last, names["prefix_queries"])
        return hits / queries if hits is not None and queries else None
    if "prompt_cached" in names:
        cached = _delta(first, last, names["prompt_cached"])
        uncached = _delta(first, last, names["prompt_uncached"])
        ok = cached is not None and uncached is not None and cached + uncached > 0
        return cached / (cached + uncached) if ok and cached is not None and uncached is not None else None
    if "prefix_hit_rate" in names:
        vals = [v for s in log.samples if (v := pick(s.series, names["prefix_hit_rate"])) is not None]
        return vals[-1] if vals else None
    return None


def _errors() -> tuple[type[BaseException], ...]:
    from quantrack.measure.client import _transport_errors

    return (*_transport_errors(), ValueError)


class MetricsScraper:
    """Polls ``/metrics`` (and llama.cpp ``/slots``) on the running event loop until stopped."""

    def __init__(self, client: Any, base_url: str, engine: str, *, interval: float = 0.5,
                 api_key: str | None = None) -> None:
        self._client = client  # an httpx.AsyncClient
        self.base = base_url.rstrip("/")
        self.engine = engine
        self.interval = interval
        from quantrack.engines import get_adapter

        adapter = get_adapter(engine)
        self.log = ScrapeLog(engine=engine, path=adapter.metrics_path, slots_path=adapter.slots_path)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._api_key = api_key

    async def _once(self, t0: float) -> None:
        from quantrack.measure.client import _scrub, describe_error

        try:
            r = await self._client.get(self.base + self.log.path, headers=self._headers)
            if r.status_code != 200:
                self.log.errors.append(f"{self.log.path} answered HTTP {r.status_code}")
                return
            scrape = Scrape(t=time.perf_counter() - t0, series=parse_prometheus(r.text))
            if self.log.slots_path:
                s = await self._client.get(self.base + self.log.slots_path, headers=self._headers)
                if s.status_code == 200 and isinstance(body := s.json(), list):
                    scrape.busy_slots = sum(1 for x in body if isinstance(x, dict) and x.get("is_processing"))
            self.log.samples.append(scrape)
        except _errors() as exc:
            self.log.errors.append(_scrub(f"{self.log.path}: {describe_error(exc)}", self._api_key))

    async def run(self) -> None:
        """Scrape now (the counters' starting values), then every ``interval`` until cancelled."""
        import asyncio

        self._t0 = time.perf_counter()
        await self._once(self._t0)
        while True:
            await asyncio.sleep(self.interval)
            await self._once(self._t0)

    async def final(self) -> None:
        """One last scrape after the level's last request: the counters' end values."""
        await self._once(getattr(self, "_t0", time.perf_counter()))
