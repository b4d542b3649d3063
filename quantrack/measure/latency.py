"""Batch-1 latency against a running OpenAI-compatible server: TTFT, TPOT, ITL, e2e.

One request at a time, fixed lengths (defaults from the lab seed: 1024 in, 128 out, 10 warmup,
30 iterations, as ``vllm bench latency``), output forced past end-of-sequence. Every sample is
checked against what was asked; a short or over-long answer fails that sample with its reason
and is never averaged in. For llama.cpp the server's own per-request
``timings.predicted_per_token_ms`` is recorded beside the client's TPOT.

All figures here are *measured*. Formulas (also in the saved row and the CLI help):
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantrack.errors import BadInput, MeasurementError
from quantrack.interrupts import Interrupted
from quantrack.measure.client import (
    HttpStreamClient,
    StreamSample,
    build_payload,
    check_base_url,
    check_engine,
    validate_sample,
)
from quantrack.measure.prompts import PromptSet, build_prompts, server_tokenizer
from quantrack.measure.stats import Summary, pct_diff, summarize

FORMULAS: dict[str, str] = {
    "ttft": "TTFT = arrival of the first output chunk - request start",
    "tpot": "TPOT = (e2e - TTFT) / (output tokens - 1), output tokens = server usage.completion_tokens (vLLM/SGLang definition)",
    "itl": "ITL = gaps between consecutive output chunks, pooled over requests (per chunk, not per token)",
    "e2e": "e2e = arrival of the last output chunk - request start",
    "decode_tok_s": "decode tok/s = (output tokens - 1) / (e2e - TTFT) per request",
    "server_tpot": "server TPOT = llama.cpp timings.predicted_per_token_ms = predicted_ms / (predicted_n - 1)",
    "ci95": "95% CI = mean +/- t(0.975, n-1) * s / sqrt(n) across requests",
}
__doc__ = (__doc__ or "") + "\n".join(f"* {f}" for f in FORMULAS.values()) + "\n"

ROW_FORMAT = "quantrack-latency/1"
Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class LatencyResult:
    """What one latency run measured. ``samples`` are the measured iterations (warmup excluded)."""

    engine: str
    base_url: str
    model: str | None
    input_tokens: int
    output_tokens: int
    warmup: int
    iterations: int
    chat: bool = False
    label: str | None = None
    prompt: str = ""
    prompt_exact: bool = False
    samples: list[StreamSample] = field(default_factory=list)
    warmup_errors: list[str] = field(default_factory=list)
    interrupted: bool = False
    timestamp: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))

    @property
    def ok_samples(self) -> list[StreamSample]:
        return [s for s in self.samples if s.ok]

    @property
    def n_failed(self) -> int:
        return sum(1 for s in self.samples if not s.ok)

    def failure_reasons(self) -> dict[str, int]:
        return dict(Counter(s.error or "unknown" for s in self.samples if not s.ok))

    def notes(self) -> dict[str, int]:
        return dict(Counter(n for s in self.ok_samples for n in s.notes))

    def stats(self) -> dict[str, Summary | None]:
        ok = self.ok_samples
        ms = 1000.0
        return {
            "ttft_ms": summarize([s.ttft * ms for s in ok if s.ttft is not None]),
            "tpot_ms": summarize([s.tpot * ms for s in ok if s.tpot is not None]),
            "itl_ms": summarize([g * ms for s in ok for g in s.itl]),
            "e2e_ms": summarize([s.e2e * ms for s in ok if s.e2e is not None]),
            "decode_tok_s": summarize([1.0 / s.tpot for s in ok if s.tpot]),
            "server_tpot_ms": summarize([s.server_tpot * ms for s in ok if s.server_tpot is not None]),
            "tpot_vs_server_pct": summarize(
                [pct_diff(s.tpot, s.server_tpot) for s in ok if s.tpot is not None and s.server_tpot]
            ),
        }

    def tpot_vs_server_median_pct(self) -> float | None:
        """% difference of the medians: (client TPOT - server TPOT) / server TPOT."""
        st = self.stats()
        c, s = st["tpot_ms"], st["server_tpot_ms"]
        return pct_diff(c.median, s.median) if c and s and s.median else None

    def to_row(self) -> dict[str, Any]:
        st = self.stats()
        return {
            "format": ROW_FORMAT,
            "kind": "measured",
            "label": self.label,
            "engine": self.engine,
            "base_url": strip_userinfo(self.base_url),
            "model": self.model,
            "endpoint": "chat" if self.chat else "completions",
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "prompt": self.prompt,
            "warmup": self.warmup,
            "iterations": self.iterations,
            "n_ok": len(self.ok_samples),
            "n_failed": self.n_failed,
            "n_warmup_failed": len(self.warmup_errors),
            "failures": self.failure_reasons(),
            "warmup_failures": dict(Counter(self.warmup_errors)),
            "notes": self.notes(),
            **{k: (v.to_dict() if v else None) for k, v in st.items()},
            "tpot_vs_server_median_pct": self.tpot_vs_server_median_pct(),
            "server_tpot_source": _server_timing(self.engine),
            "formulas": dict(FORMULAS),
            "samples": [s.to_dict() for s in self.samples],
            "interrupted": self.interrupted,
            "timestamp": self.timestamp,
        }


def strip_userinfo(url: str) -> str:
    """Never save credentials embedded in a URL (http://user:pass@host)."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def check_counts(*, input_tokens: int, output_tokens: int, warmup: int | None = None, iterations: int | None = None) -> None:
    """Bad counts -> BadInput naming the flag."""
    if input_tokens < 1:
        raise BadInput(f"--input-tokens must be >= 1 (got {input_tokens})")
    if output_tokens < 2:
        raise BadInput(f"--output-tokens must be >= 2, TPOT needs two tokens (got {output_tokens})")
    if warmup is not None and warmup < 0:
        raise BadInput(f"--warmup must be >= 0 (got {warmup})")
    if iterations is not None and iterations < 1:
        raise BadInput(f"--iterations must be >= 1 (got {iterations})")


def discover_model(client: HttpStreamClient) -> str | None:
    """The first model id the server lists at /v1/models; a server that lists none is refused (never ``None``)."""
    answer = client.request_json("GET", "/v1/models")
    data = answer.get("data") if isinstance(answer, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
        return str(data[0]["id"])
    raise MeasurementError(f"{client.base_url}/v1/models lists no model: the server serves nothing to measure "
                           "(or pass --model NAME)")


def prepare_prompts(
    client: HttpStreamClient, engine: str, model: str | None, *, count: int, input_tokens: int, chat: bool, start: int = 0
) -> PromptSet:
    """Token-exact prompts when the server tokenizes; approximate (and labelled so) otherwise."""
    tokenize = server_tokenizer(engine, client.request_json, model)
    try:
        tokenize("probe")
    except MeasurementError as exc:
        text = str(exc)
        if "HTTP 404" in text or "HTTP 405" in text:
            return build_prompts(count, input_tokens, None, chat=chat, source=f"{engine} /tokenize absent",
                                 start=start)
        if "HTTP 5" in text:  # the endpoint exists but fails (seen: SGLang 0.5.16 answered HTTP 500)
            return build_prompts(count, input_tokens, None, chat=chat,
                                 source=f"{engine} /tokenize failed ({text[:80]})", start=start)
        raise
    return build_prompts(count, input_tokens, tokenize, chat=chat, source=f"{engine} /tokenize", start=start)


def measure_latency(
    base_url: str,
    engine: str,
    *,
    input_tokens: int = 1024,
    output_tokens: int = 128,
    warmup: int = 10,
    iterations: int = 30,
    chat: bool = False,
    api_key: str | None = None,
    model: str | None = None,
    progress: Progress | None = None,
    timeout: float = 60.0,
    label: str | None = None,
) -> LatencyResult:
    """Run warmup then ``iterations`` batch-1 streamed requests; every sample validated.

    Ctrl-C (or a signal under ``quantrack.interrupts.signals_raise``) stops the run and raises ``Interrupted``
    whose ``partial`` is what was measured (``interrupted=True``): the interrupt is never swallowed.
    Raises MeasurementError (exit 1) only when the server cannot be used at all
    (unreachable for the model/tokenize queries).
    """
    engine = check_engine(engine)
    base_url = check_base_url(base_url)
    check_counts(input_tokens=input_tokens, output_tokens=output_tokens, warmup=warmup, iterations=iterations)
    if timeout <= 0:
        raise BadInput(f"--timeout must be > 0 (got {timeout})")
    result = LatencyResult(
        engine=engine,
        base_url=base_url,
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        warmup=warmup,
        iterations=iterations,
        chat=chat,
        label=label,
    )
    with HttpStreamClient(base_url, api_key=api_key, timeout=timeout) as client:
        try:
            if result.model is None:
                result.model = discover_model(client)
            prompts = prepare_prompts(client, engine, result.model, count=warmup + iterations, input_tokens=input_tokens, chat=chat)
            result.prompt, result.prompt_exact = prompts.method, prompts.exact
            total = warmup + iterations
            for i, prompt in enumerate(prompts.prompts):
                path, payload = build_payload(engine, model=result.model, prompt=prompt, max_tokens=output_tokens, chat=chat)
                sample = validate_sample(client.stream(path, payload, chat=chat), output_tokens=output_tokens, input_tokens=input_tokens)
                if i < warmup:
                    if not sample.ok:
                        result.warmup_errors.append(sample.error or "unknown")
                else:
                    result.samples.append(sample)
                if progress:
                    progress("warmup" if i < warmup else "measure", i + 1, total)
        except KeyboardInterrupt as exc:  # never swallowed: the caller decides; what was measured goes with it
            result.interrupted = True
            raise Interrupted.of(exc, partial=result) from None
    return result


def _server_timing(engine: str) -> str | None:
    from quantrack.engines import get_adapter

    return get_adapter(engine).server_timing


# ----------------------------------------------------------------------------- merging saved rows


def load_latency_rows(paths: list[str] | tuple[Any, ...]) -> list[dict[str, Any]]:
    """Read saved rows (``--save`` output, or the lab's run.py rows) as one flat record each."""
    import json
    from pathlib import Path

    if not paths:
        raise BadInput("--merge needs at least one saved row file")
    out: list[dict[str, Any]] = []
    for p in paths:
        path = Path(p)
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInput(f"--merge: no such file {str(path)!r}") from None
        except (OSError, ValueError) as exc:
            raise BadInput(f"--merge: {path} is not a JSON row: {exc}") from None
        rows = obj if isinstance(obj, list) else [obj]
        for row in rows:
            out.append(flatten_row(row, str(path)))
    return out


def flatten_row(row: Any, source: str = "") -> dict[str, Any]:
    """One table record from a saved row. Lab run.py rows carry single values (statistic unstated)."""

    def med(key: str) -> float | None:
        v = row.get(key)
        return v.get("median") if isinstance(v, dict) else None

    def ci(key: str) -> str | None:
        v = row.get(key)
        if isinstance(v, dict) and v.get("ci95_low") is not None:
            return f"{v['ci95_low']:.2f}-{v['ci95_high']:.2f}"
        return None

    if isinstance(row, dict) and row.get("format") == ROW_FORMAT:
        itl = row.get("itl_ms") or {}
        return {
            "label": row.get("label") or _stem(source),
            "engine": row.get("engine"),
            "in/out": f"{row.get('input_tokens')}/{row.get('output_tokens')}",
            "ok/failed": f"{row.get('n_ok')}/{row.get('n_failed')}",
            "ttft_ms": med("ttft_ms"),
            "tpot_ms": med("tpot_ms"),
            "tpot_ci95_ms": ci("tpot_ms"),
            "itl_p99_ms": itl.get("p99"),
            "e2e_ms": med("e2e_ms"),
            "server_tpot_ms": med("server_tpot_ms"),
            "tpot_vs_server_pct": row.get("tpot_vs_server_median_pct"),
            "statistic": "median (measured)" + (", interrupted" if row.get("interrupted") else ""),
            "source": source,
        }
    if isinstance(row, dict) and isinstance(row.get("batch1"), dict):
        b = row["batch1"]
        tokens = b.get("tokens") or []
        return {
            "label": row.get("label") or _stem(source),
            "engine": row.get("engine"),
            "in/out": f"{row.get('input')}/{row.get('output')}",
            "ok/failed": f"{len(tokens)}/?" if tokens else None,
            "ttft_ms": b.get("ttft_ms"),
            "tpot_ms": b.get("tpot_ms"),
            "tpot_ci95_ms": None,
            "itl_p99_ms": None,
            "e2e_ms": b.get("e2e_ms"),
            "server_tpot_ms": None,
            "tpot_vs_server_pct": None,
            "statistic": "as saved by lab run.py (statistic not stated)",
            "source": source,
        }
    raise BadInput(f"--merge: {source} is not a latency row (expected format {ROW_FORMAT!r} or a lab run.py row)")


def _stem(source: str) -> str:
    from pathlib import Path

    return Path(source).stem if source else ""
