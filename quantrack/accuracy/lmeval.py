"""lm-evaluation-harness per-sample results of ANY task, read into quantrack's per-question records.

The GSM8K family keeps its own reader (:mod:`quantrack.accuracy.importers`: both filters, ``exact_match``); this
module reads every other task an lm-eval ``--log_samples`` run holds: multiple-choice (``acc``, ``acc_norm``),
generative (``exact_match``), ``pass@1`` and any metric whose per-sample value is a right/wrong verdict (0 or 1).

What a sample line holds (lm-eval 0.4.13, the version the integration test runs):

* ``doc_id``, ``doc``, ``target``, ``arguments``, ``resps``, ``filtered_resps``, ``filter``, ``metrics`` (the
  names, in the order the task's ``process_results`` returned them), ``doc_hash`` (sha256 of the JSON doc),
  ``prompt_hash`` (sha256 of the first request's context string), ``target_hash`` (sha256 of ``str(target)``),
  then one key per metric with its per-sample value: ``lm_eval/evaluator.py:644-666`` (``hash_string`` is
  ``hashlib.sha256(s.encode("utf-8")).hexdigest()``, ``lm_eval/utils.py:129-130``).
* One line per (doc, filter), in ``samples_<task>_<date_id>.jsonl`` beside ``results_<date_id>.json``; ``target``
  is written as ``str(target)``: ``lm_eval/loggers/evaluation_tracker.py:344-373``.
* Multiple-choice ``process_results`` returns ``acc`` before ``acc_norm``: ``lm_eval/api/task.py:1555-1561``.

Rules (docs/accuracy.md, "lm-eval per-sample results of any task"):

* **metric**: ``--metric NAME``, else the first name in the sample lines' ``metrics`` list whose value is a number
  (so ``acc`` for multiple choice, the task's first ``metric_list`` entry for a generative task). Every line's value
  must be 0 or 1 (a paired test needs a verdict per sample): NaN, negative, above 1 or fractional is refused.
* **filter**: ``--filter NAME``, else the file's only filter; several filters and no ``--filter`` is refused.
* **records**: keyed by ``doc_id``; ``prompt_sha256`` is the sample's ``prompt_hash``, and ``doc_hash`` /
  ``target_hash`` ride in ``extra``. A duplicate ``doc_id`` within the chosen filter is refused.
* **pairing** (:func:`drop_unmatched`, used by ``eval compare``): a doc pairs only when its ``prompt_hash`` (and its
  doc and target hashes) are the same on both sides; the others are dropped and counted.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from quantrack.accuracy.gsm8k import EvalResult, result_from_records
from quantrack.accuracy.records import QuestionRecord
from quantrack.errors import BadInput

SOURCE = "imported:lm-eval"
STYLE = "lm-eval"
HASHES = ("doc_hash", "prompt_hash", "target_hash")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_DOC_ID = 10_000_000  # as importers.MAX_QUESTIONS: a larger index is a corrupt file
RULE = "first metric of the sample lines' 'metrics' list with a number value"


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` with every way it can fail on hostile text as one line (deep nesting: RecursionError)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadInput(f"{where}: not valid JSON") from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply to be an lm-eval file") from None


def regular_file(p: Path) -> Path:
    """``p`` when it is a regular file; a FIFO or a device (``/dev/zero``) is refused without being opened."""
    if not p.exists():
        raise BadInput(f"file not found: {p}")
    if not p.is_file():
        raise BadInput(f"{p}: not a regular file")
    return p


def read_lines(p: Path) -> list[str]:
    try:
        return regular_file(p).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise BadInput(f"{p}: not a text file (not UTF-8): expected lm-eval sample lines") from None


def _short(value: Any) -> str:
    return repr(value)[:40]


def _verdict(where: str, metric: str, value: Any) -> bool:
    """A per-sample metric value as right/wrong: 0 or 1 (bool, int or float), anything else one line."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, int | float):
        raise BadInput(f"{where}: {metric} {_short(value)} is not a number (a per-sample verdict, 0 or 1)")
    if isinstance(value, float) and math.isnan(value):
        raise BadInput(f"{where}: {metric} is NaN, not a per-sample verdict (0 or 1)")
    if not 0 <= value <= 1:
        raise BadInput(f"{where}: {metric} {value} is outside [0, 1]")
    if value not in (0, 1):
        raise BadInput(f"{where}: {metric} {value} is not 0 or 1: a paired test needs a right/wrong verdict per "
                       "sample (pass --metric with a 0/1 metric)")
    return bool(value)


def _row(p: Path, no: int, line: str) -> dict[str, Any]:
    where = f"{p}:{no}"
    row = parse_json(line, where)
    if not isinstance(row, dict):
        raise BadInput(f"{where}: not an lm-eval sample line (expected a JSON object)")
    if "doc_id" not in row:
        raise BadInput(f"{where}: no doc_id (not an lm-eval sample line)")
    doc = row["doc_id"]
    if isinstance(doc, bool) or not isinstance(doc, int) or not 0 <= doc < MAX_DOC_ID:
        raise BadInput(f"{where}: doc_id {_short(doc)} is not a document index (a whole number >= 0)")
    for key in HASHES:
        h = row.get(key)
        if not (isinstance(h, str) and _SHA256.fullmatch(h)):
            got = "missing" if h is None else f"{_short(h)}, not a sha256 hex digest"
            raise BadInput(f"{where}: {key} {got}; pairing needs lm-eval's sample hashes "
                           "(lm_eval/evaluator.py:655-664)")
    filt = row.get("filter", "none")
    if not isinstance(filt, str) or not filt:
        raise BadInput(f"{where}: filter {_short(filt)} is not a filter name")
    return row


def _choose_metric(p: Path, first: dict[str, Any], metric: str | None) -> tuple[str, str]:
    """(metric, how it was chosen) from the first line of the chosen filter."""
    listed = first.get("metrics")
    if metric is not None:
        return metric, "--metric"
    if not isinstance(listed, list) or not all(isinstance(m, str) for m in listed):
        raise BadInput(f"{p}: the sample lines have no 'metrics' list (lm-eval before 0.4.5?); pass --metric")
    for name in listed:
        value = first.get(name)
        if isinstance(value, int | float):  # bool included (an int)
            return name, RULE
    raise BadInput(f"{p}: no metric with a per-sample number in the sample lines (metrics: "
                   f"{', '.join(listed) or 'none'}); pass --metric")


def _response(row: dict[str, Any]) -> str | None:
    resps = row.get("resps")
    if isinstance(resps, list) and resps and isinstance(resps[0], list) and resps[0] and isinstance(resps[0][0], str):
        return resps[0][0]
    return None


def _extracted(row: dict[str, Any]) -> Any:
    """A generative sample's filtered answer; a multiple-choice sample's chosen choice (argmax loglikelihood)."""
    filtered = row.get("filtered_resps")
    if not isinstance(filtered, list) or not filtered:
        return None
    head = filtered[0]
    if isinstance(head, str):
        return head
    lls = [_number_or_none(f[0] if isinstance(f, list) and f else f) for f in filtered]
    if all(x is not None for x in lls):
        return max(range(len(lls)), key=lambda i: lls[i] or 0.0)
    return None


def _number_or_none(x: Any) -> float | None:
    """A loglikelihood as lm-eval logs it: a number, or its string (``sanitize_list`` turns the (ll, is_greedy)
    tuples into strings: lm_eval/loggers/evaluation_tracker.py:359-362)."""
    if isinstance(x, bool):
        return None
    try:
        v = float(x) if isinstance(x, int | float | str) else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def read_samples(p: Path, *, task: str, metric: str | None = None, filt: str | None = None,
                 settings: dict[str, Any] | None = None) -> tuple[EvalResult, dict[int, QuestionRecord]]:
    """Per-sample records of one task's samples file (the rules in the module docstring)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    filters: list[str] = []
    for no, line in enumerate(read_lines(p), 1):
        if not line.strip():
            continue
        row = _row(p, no, line)
        if row.get("filter", "none") not in filters:
            filters.append(row.get("filter", "none"))
        rows.append((no, row))
    if not rows:
        raise BadInput(f"{p}: no sample lines")
    if filt is None:
        if len(filters) > 1:
            raise BadInput(f"{p}: several filters ({', '.join(filters)}); pass --filter")
        filt = filters[0]
    elif filt not in filters:
        raise BadInput(f"--filter {filt!r}: not in {p.name} (filters: {', '.join(filters)})")
    mine = [(no, row) for no, row in rows if row.get("filter", "none") == filt]
    metric, how = _choose_metric(p, mine[0][1], metric)
    records: dict[int, QuestionRecord] = {}
    line_of: dict[int, int] = {}
    for no, row in mine:
        where = f"{p}:{no}"
        if metric not in row:
            raw = row.get("metrics")
            listed: list[Any] = raw if isinstance(raw, list) else []
            raise BadInput(f"{where}: no {metric!r} (metrics: {', '.join(map(str, listed)) or 'none'})")
        correct = _verdict(where, metric, row[metric])
        doc_id = int(row["doc_id"])
        if doc_id in records:
            old = records[doc_id]
            same = (old.prompt_sha256 == row["prompt_hash"] and old.extra["doc_hash"] == row["doc_hash"]
                    and old.extra["target_hash"] == row["target_hash"])
            why = "with the same hashes (the file was written twice?)" if same else "with different hashes"
            raise BadInput(f"{where}: doc_id {doc_id} already on line {line_of[doc_id]} for filter {filt!r} {why}; "
                           "the file is mixed")
        target = row.get("target")
        records[doc_id] = QuestionRecord(
            id=doc_id, prompt_sha256=row["prompt_hash"], response=_response(row), extracted=_extracted(row),
            gold=target if isinstance(target, str | int | float) and not isinstance(target, bool) else None,
            correct=correct, error=None, style=STYLE,
            extra={"doc_hash": row["doc_hash"], "target_hash": row["target_hash"]},
        )
        line_of[doc_id] = no
    info = {**(settings or {}), "lm_eval_task": task, "lm_eval_metric": metric, "metric_rule": how, "filter": filt,
            "lm_eval_filters": filters}
    res = result_from_records(records, num_questions=len(records), ids=set(records), style=STYLE,
                              records_path=str(p), source=SOURCE, settings=info, task=task)
    return res, records


def task_from_name(p: Path) -> str | None:
    """``samples_<task>_<date_id>.jsonl`` -> ``<task>`` (lm_eval/loggers/evaluation_tracker.py:344-346)."""
    stem = p.stem
    if not stem.startswith("samples_") or stem.count("_") < 2:
        return None
    return stem.removeprefix("samples_").rsplit("_", 1)[0] or None


def import_samples(p: Path, *, task: str | None, metric: str | None, filt: str | None
                   ) -> tuple[EvalResult, dict[int, QuestionRecord]]:
    """A samples file given directly: the task is ``--task-name``, else the file name's, else its stem."""
    named = task_from_name(p)
    if task is not None and named is not None and task != named:
        raise BadInput(f"--task-name {task!r}: {p.name} holds task {named!r}")
    return read_samples(p, task=task or named or p.stem, metric=metric, filt=filt,
                        settings={} if (task or named) else {"task_name_from": "file stem"})


def from_results(p: Path, samples: Path, *, task: str, metrics: dict[str, Any], n: int | None,
                 settings: dict[str, Any], metric: str | None, filt: str | None
                 ) -> tuple[EvalResult, dict[int, QuestionRecord]]:
    """One task of a results file ``p`` read from its samples file, checked against the results' mean
    (``metrics["<metric>,<filter>"]``) and ``n`` (``n-samples.<task>.effective``)."""
    res, records = read_samples(samples, task=task, metric=metric, filt=filt, settings=settings)
    key = f"{res.settings['lm_eval_metric']},{res.settings['filter']}"
    if n is not None and len(records) != n:
        raise BadInput(f"{samples}: {len(records)} samples for filter {res.settings['filter']!r} but {p.name} "
                       f"says n-samples effective {n}; the samples file is partial or from another run")
    want = metrics.get(key)
    if want is not None:
        if isinstance(want, bool) or not isinstance(want, int | float) or not math.isfinite(want):
            raise BadInput(f"{p}: results.{task}[{key!r}] is {_short(want)}, not a finite number")
        if res.accuracy is None or abs(res.accuracy - want) > 1e-9:
            raise BadInput(f"{samples}: per-sample {key} gives {res.accuracy} but {p.name} says {want}; "
                           "the two files are from different runs")
    return res, records


def format_result(result: EvalResult) -> list[str]:
    """``eval import`` lines of an any-task import: headed by the task and the metric."""
    s = result.settings
    acc = "FILL IN" if result.accuracy is None else f"{result.accuracy * 100:.2f}%"
    head = (f"{result.task} {s.get('lm_eval_metric')} (lm-eval, filter {s.get('filter')}, {result.source}; "
            f"metric chosen by {s.get('metric_rule')})")
    lines = [head]
    lines.append(f"  {s.get('lm_eval_metric')!s:<15} {acc}   (correct {result.correct} / samples {result.n})")
    if result.ci_low is not None and result.ci_high is not None:
        lines.append(f"  95% CI (Wilson) [{result.ci_low * 100:.2f}%, {result.ci_high * 100:.2f}%]")
    elif result.accuracy is not None:
        lines.append("  95% CI          unknown (the results file gives no sample count)")
    if len(s.get("lm_eval_filters") or []) > 1:
        lines.append(f"  filters         {', '.join(s['lm_eval_filters'])} (this import: {s.get('filter')})")
    if result.records_path:
        lines.append(f"  records         {result.records_path}")
    return lines


def drop_unmatched(base: dict[Any, QuestionRecord], arm: dict[Any, QuestionRecord]
                   ) -> tuple[dict[Any, QuestionRecord], dict[Any, QuestionRecord], dict[str, int]]:
    """The docs of both sides whose prompt, doc and target hashes agree; the rest dropped and counted.

    A doc asked with another prompt (other shots, template or data) is not the same question: it is dropped,
    not paired. Returns (base kept, arm kept, {"prompt_hash_differs": n, "doc_or_target_hash_differs": m})."""
    prompt = other = 0
    keep_b, keep_a = dict(base), dict(arm)
    for q in sorted(set(base) & set(arm), key=str):
        b, a = base[q], arm[q]
        if b.prompt_sha256 != a.prompt_sha256:
            prompt += 1
        elif any(b.extra.get(k) != a.extra.get(k) for k in ("doc_hash", "target_hash")):
            other += 1
        else:
            continue
        del keep_b[q], keep_a[q]
    return keep_b, keep_a, {"prompt_hash_differs": prompt, "doc_or_target_hash_differs": other}
