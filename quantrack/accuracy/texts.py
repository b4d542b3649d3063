"""Fixed texts for teacher-forced fidelity scoring (`quantrack eval kl`).

A text is a (prompt, continuation) pair; only the continuation's tokens are scored. The default set is the
GSM8K test split shipped in the package (``quantrack/data/gsm8k/test.jsonl``), in file order:
prompt ``"Question: <q>\\nAnswer:"`` and continuation ``" " + <reference answer>`` with GSM8K's calculator
annotations (``<<48/2=24>>``) removed, because no model writes them and they are not part of the answer's prose.
``--texts FILE`` replaces the set with a JSONL of ``{"prompt": ..., "continuation": ...}`` objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quantrack.errors import BadInput, EnvironmentMissing

_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class TextPair:
    """One scored text: the prompt is context only; the continuation's tokens are scored."""

    prompt: str
    continuation: str
    source: str = ""  # where it came from, e.g. "gsm8k/test.jsonl:12"


def gsm8k_pair(question: str, answer: str, source: str = "") -> TextPair:
    """The default prompt/continuation for one GSM8K item."""
    return TextPair(prompt=f"Question: {question.strip()}\nAnswer:",
                    continuation=" " + _CALCULATOR.sub("", answer.strip()), source=source)


def gsm8k_path() -> Path:
    from quantrack.resources import data_dir

    return data_dir() / "gsm8k" / "test.jsonl"


def default_texts(path: Path | None = None) -> Iterator[TextPair]:
    """GSM8K test questions with their reference answers, in file order (lazy: read only what is scored)."""
    path = path or gsm8k_path()
    if not path.is_file():
        raise EnvironmentMissing(
            f"the GSM8K test split is not installed at {path}; reinstall quantrack, or pass --texts FILE "
            '(JSONL of {"prompt": ..., "continuation": ...})')
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                yield gsm8k_pair(item["question"], item["answer"], source=f"gsm8k/test.jsonl:{line_no}")
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise BadInput(f"{path}:{line_no}: not a GSM8K record with question/answer ({exc})") from None


def load_texts(path: str | Path) -> list[TextPair]:
    """Read a ``--texts`` JSONL file: one ``{"prompt": str, "continuation": str}`` object per line."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"--texts: no such file: {p}")
    out: list[TextPair] = []
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"--texts {p}: not a text file (not UTF-8): expected JSON lines") from None
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"--texts {p}:{line_no}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise BadInput(f"--texts {p}:{line_no}: expected an object with prompt and continuation")
        prompt, cont = item.get("prompt"), item.get("continuation")
        if not isinstance(prompt, str) or not isinstance(cont, str):
            raise BadInput(f"--texts {p}:{line_no}: needs string fields \"prompt\" and \"continuation\"")
        if not cont:
            raise BadInput(f"--texts {p}:{line_no}: empty continuation (nothing to score)")
        out.append(TextPair(prompt=prompt, continuation=cont, source=f"{p.name}:{line_no}"))
    if not out:
        raise BadInput(f"--texts {p}: no texts in the file")
    return out
