"""Quantization fidelity through the servers: top-1 agreement and KL(P_base || P_cand) per scored token.

Both arms are teacher-forced on the same token ids (checked through each server's ``/tokenize``); at every
scored position each server returns its top-k log-probabilities, and this module turns the two top-k lists
into a top-1 agreement and a KL estimate with a rigorous lower bound (derivation in ``docs/fidelity.md``).

Three layers, as elsewhere in quantrack:
1. pure math on ``{token_id: logprob}`` dicts (``position_stats``, ``summarize``, ``bootstrap_ci``);
2. the per-engine request builders and response parsers, owned by the engine adapters
   (``quantrack.engines.scoring`` holds what they share), through ``EngineAdapter.tokenize_request`` /
   ``score_prompt`` and, for the decode-side method, ``next_token_request`` / ``parse_next_token``;
3. the transport and driver, ``run_kl``, which the CLI and the study runner call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from quantrack.accuracy.texts import TextPair
from quantrack.engines import ENGINE_KINDS as ENGINES
from quantrack.engines import get_adapter
from quantrack.engines.scoring import TopK, parse_tokenize, truncate_topk  # noqa: F401 - re-exported
from quantrack.errors import BadInput, EngineError, unknown

DEFAULT_TOKENS = 2000
DEFAULT_TOP_K = 20
# vLLM rejects prompt_logprobs above its --max-logprobs (default 20); llama.cpp and SGLang accept more.
MAX_TOP_K = 100
PROB_FLOOR = 1e-12  # stands in for a probability that is exactly 0 on the candidate side (keeps KL finite)
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130



class KLMethod(StrEnum):
    """How the positions were scored (logged as the run param ``kl_method``).

    TEACHER_FORCED: the reference continuation in one prefill per text (vLLM ``prompt_logprobs``, SGLang input
    logprobs; llama.cpp, which has no prompt logprobs, one cached step per position). A backend that attends the
    tokens being prefilled from fresh bf16 K/V (SGLang's Triton extend) hides a KV-cache effect from it.
    DECODE_GREEDY: the baseline generates greedily from the prompt, one token per request; at every step both
    servers give their next-token distribution after the same prefix, reading the earlier positions from their
    own (for a KV arm: quantized) cache, as decoding does.
    """

    TEACHER_FORCED = "teacher-forced"
    DECODE_GREEDY = "decode-greedy"


DECODE_TOKENS_PER_TEXT = 128  # the baseline's greedy continuation per prompt (a GSM8K answer is ~100-200 tokens)
DECODE_METHOD = (
    "decode-side: the baseline generates greedily from each prompt, one token per request (prefix cache on), "
    "up to {n} tokens or its end-of-sequence; at every step the candidate gives its next-token distribution "
    "after the same prefix, reading earlier positions from its own KV cache; KL(P_base||P_cand) per step as for "
    "teacher-forced scoring (union of top-k sets, imputed tail, guaranteed lower bound); 95% CI: percentile "
    "bootstrap over texts"
)

METHOD = (
    "teacher-forced on identical token ids; per position top-k log-probabilities from each server; "
    "KL(P_base||P_cand) estimated on the union of the two top-k sets, a token missing from one side "
    "imputed at min(that side's k-th probability, its residual mass / (missing + 1)) and the rest of the "
    "residual kept as one 'other' bucket; kl_lower = exact KL of the partition {shared top-k tokens, "
    "everything else}, a guaranteed lower bound (log-sum inequality); no finite upper bound exists from "
    "top-k alone; 95% CI: percentile bootstrap over texts"
)

# ----------------------------------------------------------------------------------------------- pure math


@dataclass(frozen=True)
class PositionStats:
    """The comparison at one scored position."""

    agree: bool  # baseline argmax == candidate argmax
    kl: float  # point estimate of KL(P_base || P_cand), nats
    kl_lower: float  # guaranteed lower bound, nats
    base_tail: float  # baseline mass outside its top-k
    cand_tail: float  # candidate mass outside its top-k
    overlap: float  # |top-k(base) ∩ top-k(cand)| / k


def argmax(logprobs: TopK) -> int:
    """Most likely token id; ties (equal log-probabilities) go to the smaller id on both sides alike."""
    if not logprobs:
        raise ValueError("empty top-k")
    return min(logprobs, key=lambda t: (-logprobs[t], t))


def _term(p: float, q: float) -> float:
    """p * log(p / q), with 0 log 0 = 0 and q floored so an unseen candidate token keeps KL finite."""
    if p <= 0.0:
        return 0.0
    return p * math.log(p / max(q, PROB_FLOOR))


def position_stats(base: TopK, cand: TopK) -> PositionStats:
    """Top-1 agreement, KL estimate and KL lower bound at one position from the two top-k lists.

    ``base``/``cand`` map token id -> log-probability under the *full* distribution (the servers' top-k
    log-probabilities are full-softmax values, so each list sums to at most 1).
    """
    if not base or not cand:
        raise ValueError("both sides need at least one log-probability")
    k = max(len(base), len(cand))
    p = {t: math.exp(lp) for t, lp in base.items()}
    q = {t: math.exp(lp) for t, lp in cand.items()}
    shared = p.keys() & q.keys()

    # Lower bound: KL of the coarse partition {each shared token} + {everything else}. Both sides' masses are
    # known exactly on it, and merging cells never increases KL (log-sum inequality), so this is <= true KL.
    p_shared_rest = max(0.0, 1.0 - sum(p[t] for t in shared))
    q_shared_rest = max(0.0, 1.0 - sum(q[t] for t in shared))
    lower = sum(_term(p[t], q[t]) for t in shared) + _term(p_shared_rest, q_shared_rest)

    # Estimate: refine to the union of the two top-k sets. A token in one list only gets, on the side that
    # lacks it, min(that side's k-th probability, residual / (n_missing + 1)): it cannot exceed the k-th
    # probability, and the residual is shared with the tokens outside both lists ("other" bucket).
    p_tail = max(0.0, 1.0 - sum(p.values()))
    q_tail = max(0.0, 1.0 - sum(q.values()))
    miss_p = q.keys() - p.keys()  # candidate-only tokens: baseline value unknown
    miss_q = p.keys() - q.keys()  # baseline-only tokens: candidate value unknown
    imp_p = min(min(p.values()), p_tail / (len(miss_p) + 1)) if miss_p else 0.0
    imp_q = min(min(q.values()), q_tail / (len(miss_q) + 1)) if miss_q else 0.0
    est = sum(_term(p[t], q[t]) for t in shared)
    est += sum(_term(p[t], imp_q) for t in miss_q)
    est += sum(_term(imp_p, q[t]) for t in miss_p)
    est += _term(p_tail - imp_p * len(miss_p), q_tail - imp_q * len(miss_q))
    # The estimate refines the lower bound's partition with the same cell masses, so est >= lower up to
    # rounding; clamp the rounding so the reported pair is always ordered, and KL is never negative.
    lower = max(0.0, lower)
    est = max(est, lower)
    return PositionStats(agree=argmax(base) == argmax(cand), kl=est, kl_lower=lower, base_tail=p_tail,
                         cand_tail=q_tail, overlap=len(shared) / k)


def _ratio_stats(groups: Sequence[Sequence[PositionStats]]) -> tuple[list[float], list[float], list[float]]:
    n = [float(len(g)) for g in groups]
    agree = [float(sum(s.agree for s in g)) for g in groups]
    kl = [float(sum(s.kl for s in g)) for g in groups]
    return n, agree, kl


def bootstrap_ci(groups: Sequence[Sequence[PositionStats]], *, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> dict[str, list[float]] | None:
    """Percentile bootstrap over texts (positions within a text are correlated, texts are not).

    Returns ``{"top1_agree": [lo, hi], "kl_mean": [lo, hi]}`` for position-weighted means, or ``None`` with
    fewer than two texts (a bootstrap over one text says nothing).
    """
    import numpy as np

    groups = [g for g in groups if g]
    if len(groups) < 2:
        return None
    n, agree, kl = (np.asarray(a) for a in _ratio_stats(groups))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(groups), size=(resamples, len(groups)))
    tot = n[idx].sum(axis=1)
    lo_q, hi_q = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    agree_bs = agree[idx].sum(axis=1) / tot
    kl_bs = kl[idx].sum(axis=1) / tot
    return {
        "top1_agree": [float(np.percentile(agree_bs, lo_q)), float(np.percentile(agree_bs, hi_q))],
        "kl_mean": [float(np.percentile(kl_bs, lo_q)), float(np.percentile(kl_bs, hi_q))],
    }


@dataclass
class KLResult:
    """Fidelity of a candidate arm against its baseline. KL in nats; every figure is measured."""

    engine: str
    baseline_url: str
    candidate_url: str
    top_k: int
    n_positions: int
    n_texts: int
    top1_agree: float
    kl_mean: float
    kl_median: float
    kl_p99: float
    kl_lower_mean: float  # guaranteed lower bound of the mean KL
    base_tail_mass: float  # mean baseline probability outside its top-k
    cand_tail_mass: float  # mean candidate probability outside its top-k
    topk_overlap: float  # mean |top-k(base) ∩ top-k(cand)| / k
    ci: dict[str, list[float]] | None  # 95% bootstrap over texts: top1_agree, kl_mean
    texts: str = ""  # where the texts came from
    wall_s: float | None = None
    method: str = METHOD
    label: str = "measured"
    kl_method: str = KLMethod.TEACHER_FORCED.value
    per_text: list[dict[str, Any]] = field(default_factory=list)  # source, positions, agree, kl_mean

    def metrics(self) -> dict[str, float]:
        """The MLflow metrics the tracking code logs next to GSM8K (names are part of the API)."""
        return {
            "kl_top1_agree": self.top1_agree,
            "kl_mean": self.kl_mean,
            "kl_median": self.kl_median,
            "kl_p99": self.kl_p99,
            "kl_positions": float(self.n_positions),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["metrics"] = self.metrics()
        return data


def summarize(groups: Sequence[Sequence[PositionStats]], *, engine: str, baseline_url: str,
              candidate_url: str, top_k: int, sources: Sequence[str] = (), texts: str = "",
              wall_s: float | None = None) -> KLResult:
    """Pool the positions of all texts into one result (means are per position, the CI is over texts)."""
    import numpy as np

    flat = [s for g in groups for s in g]
    if not flat:
        raise BadInput("no positions were scored (every continuation tokenized to nothing?)")
    kls = np.asarray([s.kl for s in flat])
    per_text = []
    for i, g in enumerate(groups):
        if g:
            per_text.append({"source": sources[i] if i < len(sources) else str(i), "positions": len(g),
                             "top1_agree": sum(s.agree for s in g) / len(g),
                             "kl_mean": sum(s.kl for s in g) / len(g)})
    return KLResult(
        engine=engine, baseline_url=baseline_url, candidate_url=candidate_url, top_k=top_k,
        n_positions=len(flat), n_texts=len(per_text),
        top1_agree=sum(s.agree for s in flat) / len(flat),
        kl_mean=float(kls.mean()), kl_median=float(np.median(kls)), kl_p99=float(np.percentile(kls, 99)),
        kl_lower_mean=sum(s.kl_lower for s in flat) / len(flat),
        base_tail_mass=sum(s.base_tail for s in flat) / len(flat),
        cand_tail_mass=sum(s.cand_tail for s in flat) / len(flat),
        topk_overlap=sum(s.overlap for s in flat) / len(flat),
        ci=bootstrap_ci(groups), texts=texts, wall_s=wall_s, per_text=per_text,
    )


def tokenize_request(engine: str, text: str, add_special: bool) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of a /tokenize call on ``engine`` (its adapter's wire format)."""
    return get_adapter(engine).tokenize_request(text, add_special)


# ------------------------------------------------------------------------------------- transport and driver


def normalize_url(url: str, flag: str) -> str:
    """``http://host:port`` (a trailing ``/v1`` or ``/`` is dropped); credentials in the URL are refused."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadInput(f"{flag}: expected a server URL like http://127.0.0.1:8000, got {url!r}")
    if parts.username or parts.password:
        raise BadInput(f"{flag}: put no credentials in the URL")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class _Server:
    """One engine server: JSON POSTs with one-line errors naming the role (baseline/candidate)."""

    def __init__(self, role: str, url: str, engine: str, timeout_s: float) -> None:
        import httpx

        self.role, self.url, self.engine = role, url, engine
        from quantrack.measure.client import http_timeout

        self._http = httpx.Client(base_url=url, timeout=http_timeout(timeout_s))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        try:
            r = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            from quantrack.measure.client import describe_error

            raise EngineError(f"{self.role} server {self.url}{path}: {describe_error(exc)}") from None
        if r.status_code != 200:
            raise EngineError(f"{self.role} server {self.url}{path}: HTTP {r.status_code}: "
                              f"{r.text[:200].strip()}")
        try:
            return r.json()
        except ValueError:
            raise EngineError(f"{self.role} server {self.url}{path}: answered non-JSON") from None

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        path, body = get_adapter(self.engine).tokenize_request(text, add_special)
        try:
            return parse_tokenize(self.post(path, body))
        except ValueError as exc:
            raise EngineError(f"{self.role} server {self.url}: {exc}") from None

    def score(self, ids: Sequence[int], start: int, k: int) -> list[TopK]:
        """Top-k at positions start..len(ids)-1, each conditioned on ids[:position]."""
        try:
            return get_adapter(self.engine).score_prompt(self.post, ids, start, k)
        except ValueError as exc:
            raise EngineError(f"{self.role} server {self.url}: {exc}") from None

    def next_token(self, prefix: Sequence[int], k: int) -> tuple[TopK, bool]:
        """(top-k of the next token after ``prefix``, whether the engine stopped there: end of sequence)."""
        adapter = get_adapter(self.engine)
        path, body = adapter.next_token_request(prefix, k)
        try:
            return adapter.parse_next_token(self.post(path, body), k)
        except ValueError as exc:
            raise EngineError(f"{self.role} server {self.url}: {exc}") from None

    def close(self) -> None:
        self._http.close()


def _tokenize_pair(server: _Server, text: TextPair) -> tuple[list[int], list[int]]:
    return server.tokenize(text.prompt, True), server.tokenize(text.continuation, False)


def _decode_text(pool: Any, base: _Server, cand: _Server, prompt: list[int], n: int, k: int) -> list[PositionStats]:
    """One prompt of the decode-side method: up to ``n`` greedy baseline steps, both servers at each step."""
    ids = list(prompt)
    out: list[PositionStats] = []
    for _ in range(n):
        fb, fc = pool.submit(base.next_token, ids, k), pool.submit(cand.next_token, ids, k)
        (b_top, stopped), (c_top, _) = fb.result(), fc.result()
        out.append(position_stats(b_top, c_top))
        if stopped:
            break
        ids.append(argmax(b_top))
    return out


def _check_engine(engine: str, top_k: int, decode: bool) -> None:
    """What the engine's adapter can do, before any server is asked: BadInput for an engine whose adapter has no
    request for the method, and for a top-k above what it returns."""
    adapter = get_adapter(engine)
    why = adapter.kl_unsupported(decode=decode)
    if why:
        raise BadInput(why)
    most = adapter.max_prompt_logprobs
    if most is not None and top_k > most:
        raise BadInput(f"--top-k {top_k}: {adapter.label} returns at most {most} prompt "
                       "log-probabilities by default (--max-logprobs)")


def run_kl(baseline_url: str, candidate_url: str, engine: str, *, texts: Iterable[TextPair] | None = None,
           tokens: int = DEFAULT_TOKENS, top_k: int = DEFAULT_TOP_K,
           progress: Callable[[str], None] | None = None, timeout_s: float = 300.0,
           texts_label: str | None = None, method: str = KLMethod.TEACHER_FORCED,
           decode_tokens_per_text: int = DECODE_TOKENS_PER_TEXT) -> KLResult:
    """Score ``tokens`` continuation positions on both servers and compare them (the library entry point).

    ``texts`` defaults to the shipped GSM8K test split (questions + reference answers, in file order). Both
    servers must tokenize every text identically; the run stops with a one-line error if they do not.
    """
    from concurrent.futures import ThreadPoolExecutor

    if engine not in ENGINES:
        raise unknown("engine", engine, ENGINES)
    if method not in {m.value for m in KLMethod}:
        raise unknown("KL method", str(method), [m.value for m in KLMethod])
    decode = method == KLMethod.DECODE_GREEDY
    if decode_tokens_per_text < 1:
        raise BadInput(f"decode tokens per text must be at least 1, got {decode_tokens_per_text}")
    if tokens < 1:
        raise BadInput(f"--tokens must be at least 1, got {tokens}")
    if not 1 <= top_k <= MAX_TOP_K:
        raise BadInput(f"--top-k must be between 1 and {MAX_TOP_K}, got {top_k}")
    _check_engine(engine, top_k, decode)
    base_url = normalize_url(baseline_url, "--baseline")
    cand_url = normalize_url(candidate_url, "--candidate")
    if texts is None:
        from quantrack.accuracy.texts import default_texts

        texts = default_texts()
        texts_label = texts_label or "GSM8K test (question + reference answer), file order"
    say = progress or (lambda _msg: None)

    from quantrack.measure.client import check_timeout

    timeout_s = check_timeout(timeout_s)
    base = _Server("baseline", base_url, engine, timeout_s)
    cand = _Server("candidate", cand_url, engine, timeout_s)
    groups: list[list[PositionStats]] = []
    sources: list[str] = []
    done = 0
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for text in texts:
                if done >= tokens:
                    break
                fb, fc = pool.submit(_tokenize_pair, base, text), pool.submit(_tokenize_pair, cand, text)
                (bp, bc), (cp, cc) = fb.result(), fc.result()
                where = text.source or f"text {len(groups) + 1}"
                if (bp, bc) != (cp, cc):
                    raise BadInput(f"{where}: the baseline and candidate servers tokenize differently "
                                   f"({len(bp) + len(bc)} vs {len(cp) + len(cc)} tokens); they must serve the "
                                   "same tokenizer")
                if not bp:
                    raise BadInput(f"{where}: the prompt tokenizes to nothing; a scored token needs context")
                if decode:
                    stats = _decode_text(pool, base, cand, bp, min(decode_tokens_per_text, tokens - done), top_k)
                    groups.append(stats)
                    sources.append(where)
                    done += len(stats)
                    say(f"{done}/{tokens} positions ({len(groups)} texts, {time.perf_counter() - t0:.1f} s)")
                    continue
                n = min(len(bc), tokens - done)
                if n == 0:
                    continue
                ids = bp + bc[:n]
                sb = pool.submit(base.score, ids, len(bp), top_k)
                sc = pool.submit(cand.score, ids, len(bp), top_k)
                b_top, c_top = sb.result(), sc.result()
                groups.append([position_stats(b, c) for b, c in zip(b_top, c_top, strict=True)])
                sources.append(where)
                done += n
                say(f"{done}/{tokens} positions ({len(groups)} texts, {time.perf_counter() - t0:.1f} s)")
    finally:
        base.close()
        cand.close()
    result = summarize(groups, engine=engine, baseline_url=base_url, candidate_url=cand_url, top_k=top_k,
                       sources=sources, texts=texts_label or "", wall_s=round(time.perf_counter() - t0, 2))
    if decode:
        result.kl_method = KLMethod.DECODE_GREEDY.value
        result.method = DECODE_METHOD.format(n=decode_tokens_per_text)
        result.texts = (result.texts + "; " if result.texts else "") + "prompts only (continuations: the baseline's "\
            "greedy tokens)"
    return result
