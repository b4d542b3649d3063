"""Which engine wrote a log: per-line scoring of every engine's markers, with the evidence.

Owns the marker catalogue and the decision rule. Each marker is a regular expression searched in every line
of the log's head (logger file names, process prefixes, message texts, error texts, banners), with a weight:
how strongly one occurrence says "this engine". A marker counts once per log (the first line it is seen on is
its evidence), so a TP-8 log that repeats one line eight times is not eight times more certain.

Decision: the engine with the highest score wins when it reaches ``MIN_SCORE`` and leads the runner-up by a
margin (``MARGIN`` points and ``RATIO`` times its score). Otherwise no engine is named: the caller says which
engines came closest and asks for ``--engine``. Markers are searched anywhere in a line (not anchored), so the
wrapper prefixes other programs add (``vLLM STDOUT: ``, docker compose ``llama-1  | ``, a ``[pid]``, a ``> ``
quote) do not hide them, and a few lines pasted from the middle of a log are enough.

The markers live with their engine (each adapter's ``markers``, in its module): each names where it was seen, a
format string (``repo@sha:path:Lnn``, engine-facts.md) or a public log kept verbatim in tests/data/public-logs/
(named by its file there), and literal anchors every match contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from quantrack.engines import registry as _engines
from quantrack.engines.base import Marker
from quantrack.engines.registry import ENGINE_KINDS as ENGINES  # the one registry

MIN_SCORE = 3
MARGIN = 3
RATIO = 2.0
DETECT_BYTES = 1024 * 1024  # the head read for detection; a clear winner is almost always in the first lines
MAX_DETECT_BYTES = 8 * 1024 * 1024  # read on (block by block) while no engine is clear


def markers() -> tuple[Marker, ...]:
    """Every registered engine's markers (each adapter's ``markers``, in its module), in registry order."""
    return tuple(m for adapter in _engines.adapters() for m in adapter.markers)


_compiled_markers: tuple[tuple[Marker, ...], list[tuple[int, re.Pattern[str], tuple[str, ...]]]] = ((), [])
_compiled_generation = -1


def _compiled() -> tuple[tuple[Marker, ...], list[tuple[int, re.Pattern[str], tuple[str, ...]]]]:
    global _compiled_markers, _compiled_generation
    if _compiled_generation != _engines.registry_generation():
        ms = markers()
        _compiled_markers = (ms, [(i, re.compile(m.pattern), m.anchors) for i, m in enumerate(ms)])
        _compiled_generation = _engines.registry_generation()
    return _compiled_markers


@dataclass
class Detection:
    """The outcome: ``engine`` (None when no engine is clear), the scores, the evidence lines of the winner
    (or of every candidate when there is none), and a one-line reason."""

    engine: str | None
    scores: dict[str, int]
    evidence: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    lines_scanned: int = 0

    @property
    def candidates(self) -> list[str]:
        """Engines with any score, best first."""
        return [k for k, v in sorted(self.scores.items(), key=lambda kv: -kv[1]) if v > 0]

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "method": "auto", "scores": dict(self.scores), "reason": self.reason,
                "candidates": self.candidates, "lines_scanned": self.lines_scanned}


def _evidence(found: dict[int, tuple[int, str]], marks: tuple[Marker, ...], engine: str,
              limit: int = 5) -> list[dict[str, Any]]:
    rows = [(marks[i], no, line) for i, (no, line) in found.items() if marks[i].engine == engine]
    rows.sort(key=lambda r: (-r[0].weight, r[1]))
    return [{"engine": m.engine, "marker": m.label, "weight": m.weight, "line_no": no, "line": line[:300],
             "source": m.source} for m, no, line in rows[:limit]]


class Scorer:
    """Incremental scoring over chunks of text (one pass, C-speed regex over each chunk)."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[int, str]] = {}  # marker index -> (line number, line)
        self.lines = 0
        self.markers, self._compiled = _compiled()

    def feed(self, text: str) -> None:
        base = self.lines
        for idx, rx, anchors in self._compiled:
            if idx in self.found or not any(a in text for a in anchors):
                continue
            m = rx.search(text)
            if m is None:
                continue
            start = m.start()
            ls = text.rfind("\n", 0, start) + 1
            le = text.find("\n", start)
            self.found[idx] = (base + text.count("\n", 0, start) + 1, text[ls: le if le >= 0 else len(text)].strip())
        self.lines = base + text.count("\n") + (0 if text.endswith("\n") or not text else 1)

    def scores(self) -> dict[str, int]:
        out = dict.fromkeys(ENGINES, 0)
        for i in self.found:
            out[self.markers[i].engine] += self.markers[i].weight
        return out

    def decide(self) -> Detection:
        scores = self.scores()
        ranked = sorted(ENGINES, key=lambda k: -scores[k])
        best, second = ranked[0], ranked[1]
        b, s = scores[best], scores[second]
        if b < MIN_SCORE:
            reason = ("no engine markers found" if b == 0 else
                      f"too few engine markers (best: {best} with {b} point{'s' if b != 1 else ''})")
            evidence = [e for k in ranked if scores[k] for e in _evidence(self.found, self.markers, k, 2)]
            return Detection(None, scores, evidence, reason, self.lines)
        if b - s < MARGIN or b < RATIO * s:
            reason = f"no clear engine: {best} {b} points vs {second} {s}"
            evidence = [e for k in (best, second) for e in _evidence(self.found, self.markers, k, 2)]
            return Detection(None, scores, evidence, reason, self.lines)
        return Detection(best, scores, _evidence(self.found, self.markers, best), f"{best}: {b} points (next: {second} {s})",
                         self.lines)

    @property
    def clear(self) -> bool:
        return self.decide().engine is not None


def detect_text(text: str) -> Detection:
    """Detection over a whole text (tests, pasted excerpts)."""
    sc = Scorer()
    sc.feed(text)
    return sc.decide()


def detect_file(path: str) -> Detection:
    """Detection over a file's head, read in growing blocks (8 KiB, 32 KiB, ... up to ``MAX_DETECT_BYTES``)
    until an engine is clear: most logs name their engine in the first lines. Bounded memory whatever the size."""
    sc = Scorer()
    carry = b""
    read, size = 0, 8 * 1024
    with open(path, "rb") as fh:
        while read < MAX_DETECT_BYTES:
            chunk = fh.read(size)
            size = min(size * 4, DETECT_BYTES)
            if not chunk:
                if carry:
                    sc.feed(carry.decode("utf-8", errors="replace"))
                break
            read += len(chunk)
            block = carry + chunk
            cut = block.rfind(b"\n")
            if cut < 0:
                carry = block[-65536:]
                continue
            sc.feed(block[: cut + 1].decode("utf-8", errors="replace"))
            carry = block[cut + 1:]
            if sc.clear:
                break
    return sc.decide()


__all__ = ["ENGINES", "Detection", "Marker", "Scorer", "detect_file", "detect_text", "markers"]
