"""Scorers of a task's answers, by name: ``(response, item) -> Verdict`` (pure, except ``code``, which runs the
answer in :mod:`quantrack.accuracy.sandbox`, and ``module:function``, which imports the user's code).

* ``exact``: the response equals the reference (or one of a list) after :func:`normalize`.
* ``numeric``: the last number of the response as lm-eval's gsm8k flexible-extract finds it
  (:data:`quantrack.accuracy.gsm8k.LM_EVAL_FLEXIBLE`, last match, sign kept), with the gsm8k normalisation
  (commas, ``$`` and a trailing period removed, :func:`quantrack.accuracy.gsm8k.lm_eval_normalize`), equal to the
  reference as a decimal number (``18.0`` equals ``18``).
* ``choice``: the letter the response answers with (:func:`extract_choice`), or the choice text it gives, equal to
  the reference letter.
* ``regex:PATTERN``: the first match of PATTERN in the response (its first group if it has groups), normalised, equals
  a normalised reference.
* ``code``: the answer's code (:func:`quantrack.accuracy.humaneval.extract_code`) followed by the reference (test
  code) and ``check(entry_point)`` when the item names one, exits 0 in the sandbox.
* ``module:function``: ``function(response, item)`` returns a bool (``item`` is the task line as a dict).
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from quantrack.errors import BadInput

BUILTIN = ("exact", "numeric", "choice", "regex:PATTERN", "code", "module:function")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: Any  # what was compared (None: nothing could be extracted)
    extra: dict[str, Any] = field(default_factory=dict)


ScoreFn = Callable[[str, dict[str, Any]], Verdict]


def normalize(text: str) -> str:
    """exact's normalisation: Unicode case folding, whitespace runs to one space, stripped, then one trailing
    period and surrounding quotes removed."""
    out = " ".join(str(text).casefold().split())
    out = out.removesuffix(".").strip()
    if len(out) >= 2 and out[0] == out[-1] and out[0] in "\"'`":
        out = out[1:-1].strip()
    return out


def references(item: dict[str, Any]) -> list[Any]:
    ref = item["reference"]
    return list(ref) if isinstance(ref, list) else [ref]


def score_exact(response: str, item: dict[str, Any]) -> Verdict:
    got = normalize(response)
    return Verdict(any(got == normalize(str(r)) for r in references(item)), got)


def _decimal(text: Any) -> Decimal | None:
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_number(response: str) -> str | None:
    from quantrack.accuracy.gsm8k import LM_EVAL_FALLBACK, LM_EVAL_FLEXIBLE, lm_eval_filter, lm_eval_normalize

    found = lm_eval_filter(response, LM_EVAL_FLEXIBLE, -1)
    return None if found == LM_EVAL_FALLBACK else lm_eval_normalize(found)


def score_numeric(response: str, item: dict[str, Any]) -> Verdict:
    from quantrack.accuracy.gsm8k import lm_eval_normalize

    got = extract_number(response)
    value = _decimal(got) if got is not None else None
    refs = [_decimal(lm_eval_normalize(str(r))) for r in references(item)]
    return Verdict(value is not None and any(value == r for r in refs if r is not None), got)


_LETTER_PATTERNS = (
    re.compile(r"^\W*\(?([A-Z])\)?(?=[\s.:,)\]]|$)"),  # "B", "(B)", "B. text", "**B**"
    re.compile(r"answer\s*(?:is|:)?\s*\**\(?([A-Z])\)?(?=[\s.:,)*\]]|$)", re.IGNORECASE),  # "the answer is (B)"
)


def extract_choice(response: str, choices: list[str] | None) -> str | None:
    """The letter a response answers with: a leading letter, else "answer is X", else the choice whose text the
    response is (after :func:`normalize`). None when there is none."""
    text = response.strip()
    n = len(choices) if choices else len(LETTERS)
    for rx in _LETTER_PATTERNS:
        m = rx.search(text)
        if m and m.group(1).upper() in LETTERS[:n]:
            return m.group(1).upper()
    if choices:
        got = normalize(text)
        for i, choice in enumerate(choices):
            if got == normalize(choice):
                return LETTERS[i]
    return None


def score_choice(response: str, item: dict[str, Any]) -> Verdict:
    got = extract_choice(response, item.get("choices"))
    return Verdict(got is not None and any(got == str(r).strip().upper() for r in references(item)), got)


def regex_scorer(pattern: str) -> ScoreFn:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise BadInput(f"--scorer regex:{pattern}: not a regular expression ({exc})") from None

    def score(response: str, item: dict[str, Any]) -> Verdict:
        m = rx.search(response)
        if m is None:
            return Verdict(False, None)
        got = normalize(m.group(1) if rx.groups else m.group(0))
        return Verdict(any(got == normalize(str(r)) for r in references(item)), got)

    return score


def code_scorer(timeout_s: float) -> ScoreFn:
    def score(response: str, item: dict[str, Any]) -> Verdict:
        from quantrack.accuracy.humaneval import check_program, extract_code
        from quantrack.accuracy.sandbox import Limits, run_python

        entry = item.get("entry_point")
        code = extract_code(response, item.get("prompt") or "", entry or "")
        out = run_python(check_program(code, str(item["reference"]), entry), Limits(timeout_s=timeout_s))
        return Verdict(out.passed, out.status, {"sandbox": out.status, "sandbox_detail": out.detail,
                                          "sandbox_isolation": out.isolation, "sandbox_wall_s": round(out.wall_s, 3)})

    return score


def user_scorer(spec: str) -> ScoreFn:
    """``module:function``: imported from the current directory or sys.path; must be callable."""
    module, _, name = spec.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: any failure is theirs to see, in one line
        raise BadInput(f"--scorer {spec}: cannot import {module} ({type(exc).__name__}: {exc})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise BadInput(f"--scorer {spec}: {module} has no function {name!r}")

    def score(response: str, item: dict[str, Any]) -> Verdict:
        ok = fn(response, item)
        if not isinstance(ok, bool):
            raise TypeError(f"returned {type(ok).__name__}, expected True or False")
        return Verdict(ok, ok)

    return score


def get_scorer(spec: str, *, code_timeout_s: float = 10.0) -> ScoreFn:
    """The scorer named ``spec`` (one of :data:`BUILTIN`); an unknown name lists the known ones."""
    if spec == "exact":
        return score_exact
    if spec == "numeric":
        return score_numeric
    if spec == "choice":
        return score_choice
    if spec == "code":
        return code_scorer(code_timeout_s)
    if spec.startswith("regex:"):
        if not spec[len("regex:"):]:
            raise BadInput("--scorer regex:PATTERN: the pattern is empty")
        return regex_scorer(spec[len("regex:"):])
    if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec):
        return user_scorer(spec)
    raise BadInput(f"unknown scorer {spec!r}; known: {', '.join(BUILTIN)}")
