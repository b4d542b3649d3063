"""The workloads a sweep level can send (``quantrack sweep --dataset``; ``[sweep] dataset``), built as exact token ids.

Each builder is pure given a tokenizer (``text -> ids``; the server's ``/tokenize``, see
:mod:`quantrack.measure.prompts`) and a seed, and returns a :class:`Workload`: one :class:`Planned` request per
request of the level, with its exact input and output token counts. ``random`` and ``gsm8k`` are built in
:mod:`quantrack.measure.sweep` as before; the ones here:

* ``shared-prefix`` (``prefix_groups`` N, ``prefix_tokens`` P): request i belongs to group i mod N; every request
  of a group starts with the same P token ids (the group's prefix, fresh per level), then a distinct suffix up to
  the input length. The first request of a group pays the prefill; a prefix cache can answer the rest's first P.
* ``multi-turn`` (``turns`` K): conversations of K turns. Turn 1 is a fresh user message of the input length;
  turn k > 1 resends turn k-1's prompt, the answer the server gave to it (its text, tokenized by the server
  without special tokens) and a new user message of the input length. Turns of a conversation are sent one after
  the other (a turn needs the previous answer); conversations run side by side (a concurrency level keeps C
  conversations going; a rate level starts conversations at the rate). The runner composes the prompts
  (:func:`follow_up_prompt`); ``Planned.prompt`` of a later turn holds its new user message only.
* ``length-mix`` (``lengths`` FILE): each request's (input, output) lengths drawn, seeded, from the pairs in the
  file (a third column or ``weight`` key weights a pair: a histogram); see :func:`read_lengths`.
* ``trace`` (``trace`` FILE): the Mooncake trace format (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl``;
  one JSON object a line: ``timestamp`` in ms from the trace's start, ``input_length``, ``output_length``, optional
  ``hash_ids``: one id per 512-token block, equal ids = equal block content, so the trace's prefix sharing is
  replayed too); see :func:`read_trace`. A rate level replays the trace's arrival times scaled to that mean rate;
  a concurrency level sends the trace's lengths in closed loop (its times unused, said so).

Prompts are salted per level (:func:`quantrack.measure.prompts.new_salt`), so a level never hits a cache left by
another level or an earlier run: what a prefix cache answers is what the workload itself shares.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.measure.prompts import Tokenizer, exact_token_prompt, new_salt

WORKLOADS = ("shared-prefix", "multi-turn", "length-mix", "trace")
# Mooncake's FAST'25 traces: one hash id per 512-token block (toolagent_trace.jsonl line 1: input_length 6758,
# 14 hash_ids = ceil(6758 / 512))
MOONCAKE_BLOCK_TOKENS = 512
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_RECORDS = 1_000_000


@dataclass
class Planned:
    """One request as planned: token ids (or text) and its exact lengths; ``group``: shared-prefix group or
    multi-turn conversation; ``turn`` (multi-turn, from 1); ``offset_s``: trace arrival from the level's start."""

    prompt: list[int] | str
    input_tokens: int | None
    output_tokens: int
    group: int | None = None
    turn: int | None = None
    offset_s: float | None = None


@dataclass
class Workload:
    name: str
    requests: list[Planned]
    method: str  # shown with the sweep, e.g. "shared-prefix: 4 groups x 32-token prefix ..."
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    offsets: list[float] | None = None  # trace: arrival offsets (seconds), before any rate scaling
    turns: int = 1  # multi-turn: turns per conversation (requests of a conversation are consecutive)

    @property
    def conversations(self) -> list[list[int]]:
        """Request indices per conversation, in turn order (every other workload: one request each)."""
        n = len(self.requests)
        k = max(1, self.turns)
        return [list(range(i, min(i + k, n))) for i in range(0, n, k)]


def _ids(index: int, n: int, tokenize: Tokenizer, salt: str) -> list[int]:
    return exact_token_prompt(index, n, tokenize, salt) if n > 0 else []


def shared_prefix(n: int, input_tokens: int, output_tokens: int, *, groups: int, prefix_tokens: int,
                  tokenize: Tokenizer, tokenize_plain: Tokenizer, seed: int, salt: str | None = None) -> Workload:
    """``n`` requests in ``groups`` groups (request i in group i mod groups) sharing ``prefix_tokens`` ids, then a
    distinct suffix (``tokenize_plain``: without special tokens) up to ``input_tokens``."""
    if groups < 1:
        raise BadInput(f"--prefix-groups must be >= 1 (got {groups})")
    if not 1 <= prefix_tokens < input_tokens:
        raise BadInput(f"--prefix-tokens must be >= 1 and below --input-tokens {input_tokens} (got {prefix_tokens})")
    salt = new_salt() if salt is None else salt
    prefixes = [_ids(g, prefix_tokens, tokenize, f"{salt}:prefix:{seed}") for g in range(min(groups, n))]
    reqs = []
    for i in range(n):
        g = i % groups
        suffix = _ids(i, input_tokens - prefix_tokens, tokenize_plain, f"{salt}:suffix:{seed}")
        reqs.append(Planned(prompt=prefixes[g] + suffix, input_tokens=input_tokens, output_tokens=output_tokens,
                            group=g))
    method = (f"shared-prefix: {groups} group(s), each sharing a {prefix_tokens}-token prefix, then a distinct "
              f"{input_tokens - prefix_tokens}-token suffix (exact token ids; request i in group i mod {groups}; "
              f"prefixes fresh per level, seed {seed})")
    return Workload("shared-prefix", reqs, method, seed, {"prefix_groups": groups, "prefix_tokens": prefix_tokens})


def multi_turn(n: int, input_tokens: int, output_tokens: int, *, turns: int, tokenize: Tokenizer,
               tokenize_plain: Tokenizer, seed: int, salt: str | None = None) -> Workload:
    """ceil(n / turns) conversations of ``turns`` turns. Turn 1: a fresh ``input_tokens`` message; turn k > 1:
    its new ``input_tokens`` user message only (the runner prepends the history: :func:`follow_up_prompt`)."""
    if turns < 1:
        raise BadInput(f"--turns must be >= 1 (got {turns})")
    salt = new_salt() if salt is None else salt
    convs = max(1, math.ceil(n / turns))
    reqs = []
    for c in range(convs):
        for t in range(1, turns + 1):
            idx = c * turns + t - 1
            tok = tokenize if t == 1 else tokenize_plain
            reqs.append(Planned(prompt=_ids(idx, input_tokens, tok, f"{salt}:turn:{seed}"),
                                input_tokens=input_tokens if t == 1 else None, output_tokens=output_tokens,
                                group=c, turn=t))
    method = (f"multi-turn: {convs} conversation(s) x {turns} turn(s); each turn resends the history and the "
              f"previous answer (re-tokenized by the server), then a new {input_tokens}-token message; turns of a "
              f"conversation in sequence (seed {seed})")
    return Workload("multi-turn", reqs, method, seed, {"turns": turns, "conversations": convs}, turns=turns)


def follow_up_prompt(history: Sequence[int], answer_ids: Sequence[int], message: Sequence[int]) -> list[int]:
    """Turn k's prompt: turn k-1's prompt, the answer to it, the new user message (token ids)."""
    return [*history, *answer_ids, *message]


def read_lengths(path: str | Path, where: str = "--lengths") -> list[tuple[int, int, float]]:
    """(input, output, weight) pairs from a file: CSV/whitespace lines ``input,output[,weight]`` (``#`` comments
    and a header line skipped), or JSONL objects with ``input_tokens``/``output_tokens`` (or ``input_length``/
    ``output_length``) and an optional ``weight`` (or ``count``)."""
    lines = _read_lines(path, where)
    out: list[tuple[int, int, float]] = []
    for no, line in lines:
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise BadInput(f"{where} {path}: line {no} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise BadInput(f"{where} {path}: line {no}: expected a JSON object")
            vals = [obj.get("input_tokens", obj.get("input_length")), obj.get("output_tokens", obj.get("output_length")),
                    obj.get("weight", obj.get("count", 1))]
        else:
            vals = [v for v in line.replace(",", " ").replace("\t", " ").split() if v]
            if not out and vals and not _is_number(vals[0]):
                continue  # a header line
            if len(vals) not in (2, 3):
                raise BadInput(f"{where} {path}: line {no}: expected 'input,output[,weight]' (got {line[:60]!r})")
            if len(vals) == 2:
                vals.append("1")
        n_in, n_out, w = (_number(v, f"{where} {path}: line {no}") for v in vals)
        if n_in != int(n_in) or n_out != int(n_out) or n_in < 1 or n_out < 2:
            raise BadInput(f"{where} {path}: line {no}: input must be an integer >= 1 and output >= 2 tokens "
                           f"(TPOT needs two)")
        if not (math.isfinite(w) and w > 0):
            raise BadInput(f"{where} {path}: line {no}: weight must be a number > 0")
        out.append((int(n_in), int(n_out), w))
    if not out:
        raise BadInput(f"{where} {path}: no input/output pairs in the file")
    return out


def length_mix(n: int, pairs: Sequence[tuple[int, int, float]], *, build: Callable[[int, int], list[int] | str],
               seed: int, source: str) -> Workload:
    """``n`` requests whose (input, output) lengths are drawn with replacement from ``pairs`` (weight-proportional,
    seeded); ``build(index, input_tokens)`` makes request i's prompt."""
    rng = random.Random(seed)
    drawn = rng.choices([(a, b) for a, b, _ in pairs], weights=[w for _, _, w in pairs], k=n)
    reqs = [Planned(prompt=build(i, a), input_tokens=a, output_tokens=b) for i, (a, b) in enumerate(drawn)]
    ins, outs = [a for a, _ in drawn], [b for _, b in drawn]
    method = (f"length-mix: {len(pairs)} (input, output) pair(s) from {source}, drawn with replacement by weight "
              f"(seed {seed}): input {min(ins)}-{max(ins)}, output {min(outs)}-{max(outs)} tokens")
    return Workload("length-mix", reqs, method, seed, {"lengths": source, "pairs": len(pairs)})


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: str | Path, where: str = "--trace") -> list[TraceRecord]:
    """A Mooncake-format JSONL trace (see the module docstring), sorted by timestamp."""
    out = []
    for no, line in _read_lines(path, where):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise BadInput(f"{where} {path}: line {no} is not valid JSON (the Mooncake trace format: one object a "
                           "line with timestamp, input_length, output_length)") from None
        if not isinstance(obj, dict):
            raise BadInput(f"{where} {path}: line {no}: expected a JSON object")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in obj]
        if missing:
            raise BadInput(f"{where} {path}: line {no}: missing {', '.join(missing)} (Mooncake trace format)")
        ts = _number(obj["timestamp"], f"{where} {path}: line {no} timestamp")
        n_in = _number(obj["input_length"], f"{where} {path}: line {no} input_length")
        n_out = _number(obj["output_length"], f"{where} {path}: line {no} output_length")
        if ts < 0 or n_in != int(n_in) or n_out != int(n_out) or n_in < 1 or n_out < 1:
            raise BadInput(f"{where} {path}: line {no}: timestamp must be >= 0 ms, lengths integers >= 1")
        ids = obj.get("hash_ids") or []
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise BadInput(f"{where} {path}: line {no}: hash_ids must be a list of integers")
        out.append(TraceRecord(ts, int(n_in), max(2, int(n_out)), tuple(ids)))
        if len(out) > MAX_RECORDS:
            raise BadInput(f"{where} {path}: more than {MAX_RECORDS} records")
    if not out:
        raise BadInput(f"{where} {path}: no records")
    return sorted(out, key=lambda r: r.timestamp_ms)


def trace_workload(records: Sequence[TraceRecord], n: int, *, tokenize: Tokenizer, tokenize_plain: Tokenizer,
                   seed: int, source: str, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                   salt: str | None = None) -> Workload:
    """The first ``n`` records of a trace as requests: arrival offsets from the first record; prompts from the
    records' ``hash_ids`` blocks (equal id = equal ``block_tokens`` ids, the first block with special tokens),
    filled with distinct tokens where the blocks do not cover the input length."""
    recs = list(records[:n])
    salt = new_salt() if salt is None else salt
    blocks: dict[tuple[int, bool], list[int]] = {}

    def block(h: int, first: bool) -> list[int]:
        key = (h, first)
        if key not in blocks:
            blocks[key] = _ids(h, block_tokens, tokenize if first else tokenize_plain, f"{salt}:block:{seed}")
        return blocks[key]

    reqs = []
    t0 = recs[0].timestamp_ms
    for i, r in enumerate(recs):
        ids: list[int] = []
        for j, h in enumerate(r.hash_ids):
            if len(ids) >= r.input_tokens:
                break
            ids.extend(block(h, j == 0))
        if len(ids) < r.input_tokens:
            ids.extend(_ids(i, r.input_tokens - len(ids), tokenize if not ids else tokenize_plain,
                            f"{salt}:fill:{seed}"))
        reqs.append(Planned(prompt=ids[: r.input_tokens], input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                            offset_s=(r.timestamp_ms - t0) / 1000.0))
    span = reqs[-1].offset_s or 0.0
    native = (len(reqs) - 1) / span if span > 0 else None
    shared = sum(1 for r in recs if r.hash_ids)
    method = (f"trace: {len(reqs)} request(s) of {source} (Mooncake JSONL), span {span:.3f} s"
              + (f", native rate {native:.3f}/s" if native else " (all at one instant)")
              + (f"; {shared} with hash_ids ({block_tokens}-token blocks shared by id)" if shared else "")
              + f" (seed {seed})")
    return Workload("trace", reqs, method, seed, {"trace": source, "records": len(reqs), "span_s": span,
                                                  "native_rate": native},
                    offsets=[r.offset_s or 0.0 for r in reqs])


def scaled_offsets(offsets: Sequence[float], rate: float) -> tuple[list[float], float]:
    """The trace's offsets scaled so its mean rate ((n - 1) / span) is ``rate``; (offsets, scale factor)."""
    span = max(offsets) - min(offsets) if offsets else 0.0
    if len(offsets) < 2 or span <= 0:
        raise BadInput("--dataset trace with --rate: the trace's requests all arrive at one instant, so it has no "
                       "rate to scale (give --concurrency levels instead)")
    native = (len(offsets) - 1) / span
    k = native / rate
    return [o * k for o in offsets], k


def _read_lines(path: str | Path, where: str) -> list[tuple[int, str]]:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise BadInput(f"{where} {path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{where} {path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{where} {path}: is a folder, not a file") from None
    except UnicodeDecodeError:
        raise BadInput(f"{where} {path}: not UTF-8 text") from None
    except OSError as exc:
        raise BadInput(f"{where} {path}: cannot read ({exc.strerror})") from None
    return [(i, s) for i, line in enumerate(text.splitlines(), 1) if (s := line.strip()) and not s.startswith("#")]


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool):
        raise BadInput(f"{where}: expected a number, got {v!r}")
    try:
        x = float(v) if not isinstance(v, str) or len(v) <= 30 else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise BadInput(f"{where}: expected a number, got {str(v)[:30]!r}")
    return x

