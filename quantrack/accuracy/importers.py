"""Import GSM8K results measured by other tools into quantrack's result form.

Formats (the fields each one carries are documented in engine-facts.md (project reference notes) §5
and in the lm-evaluation-harness source cited below):

* ``vllm``: ``tests/evals/gsm8k/gsm8k_eval.py --save-results`` JSON: ``accuracy``,
  ``invalid_rate``, ``num_questions``, ``num_shots``, ``max_tokens``, ... (``vllm@4ba787ec9`` L222-L233,
  L485-L503). Accuracy only: no per-question records.
* ``sglang``: ``python -m sglang.test.run_eval --eval-name gsm8k`` metrics JSON: ``score`` plus
  ``latency``/``output_throughput`` (``sglang@v0.5.23:python/sglang/test/run_eval.py:L265-L274``).
  It does not say how many questions were scored: pass ``num_questions`` for an interval.
* ``lm-eval``: lm-evaluation-harness ``results_<date>.json`` (``results.<task>["exact_match,<filter>"]``,
  ``n-samples.<task>.effective``; ``lm_eval/evaluator_utils.py:L157-L165``, ``lm_eval/result_schema.py``)
  and, when ``--log_samples`` was on, ``samples_<task>_<date>.jsonl`` beside it, one line per
  (question, filter) with ``doc_id``, ``prompt_hash``, ``resps``, ``filtered_resps``, ``filter``,
  ``exact_match`` (``lm_eval/evaluator.py:L644-L667``, ``lm_eval/loggers/evaluation_tracker.py:L344-L346``),
  all at ``EleutherAI/lm-evaluation-harness@4e7e0d47f33bc71070c1d38394bafbb52b117163`` (and lm-eval
  0.4.13 from PyPI, whose output the integration test imports). ``<task>`` is any GSM8K-family task:
  ``gsm8k``, ``gsm8k_cot``, ``gsm8k_cot_llama``, a local copy such as ``gsm8k_local_firstn`` (a task
  whose name or dataset mentions gsm8k); ``task_name`` picks one when the file holds several. Both
  filters are kept: the chosen one is the accuracy, the other rides along (``extra``). With samples
  the import has per-question records, so a paired comparison is possible.

Imported accuracy is labelled ``imported:<format>``; an interval is derived from the counts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from quantrack.accuracy.gsm8k import (
    LM_EVAL_FALLBACK,
    EvalResult,
    lm_eval_normalize,
    result_from_records,
)
from quantrack.accuracy.records import QuestionRecord, load_records, read_meta
from quantrack.engines.evaltools import ENGINE_RESULT_FORMATS, SGLANG_RUN_EVAL, VLLM_GSM8K
from quantrack.errors import BadInput, did_you_mean, unknown

FORMATS = ("auto", *ENGINE_RESULT_FORMATS, "lm-eval")
LM_EVAL_FILTERS = ("strict-match", "flexible-extract")


def import_result(path: str | Path, fmt: str = "auto", *, num_questions: int | None = None,
                  lm_eval_filter: str | None = None, task_name: str | None = None, metric: str | None = None
                  ) -> tuple[EvalResult, dict[int, QuestionRecord] | None]:
    """Read another tool's GSM8K output, or lm-eval's output of any task: (result, per-question records or None).

    ``task_name`` (lm-eval only): which task of a results file to import; needed only when the file holds
    several. GSM8K-family tasks are read as before (``lm_eval_filter`` default ``strict-match``); any other task,
    or any task with ``metric`` given, by :mod:`quantrack.accuracy.lmeval` (its rules for metric and filter)."""
    from quantrack.accuracy import lmeval

    if fmt not in FORMATS:
        raise unknown("format", fmt, FORMATS)
    p = lmeval.regular_file(Path(path))
    if task_name is not None and fmt not in ("auto", "lm-eval"):
        raise BadInput(f"--task-name applies to lm-eval results, not --format {fmt}")
    if metric is not None and fmt not in ("auto", "lm-eval"):
        raise BadInput(f"--metric applies to lm-eval results, not --format {fmt}")
    if p.suffix == ".jsonl":
        if fmt not in ("auto", "lm-eval"):
            raise BadInput(f"{p}: a .jsonl file is lm-eval samples; --format {fmt} expects a JSON file")
        if metric is not None or not _gsm8k_samples(p):
            return lmeval.import_samples(p, task=task_name, metric=metric, filt=lm_eval_filter)
        lm_eval_filter = _gsm8k_filter(lm_eval_filter)
        records = _lm_eval_samples(p, lm_eval_filter)
        res = result_from_records(records, num_questions=max(records) + 1 if records else 0, style="lm-eval",
                                  records_path=str(p), source="imported:lm-eval")
        res.settings = {"filter": lm_eval_filter}
        task = _task_from_samples_name(p)
        if task is not None:
            res.task = task
        return res, records
    data = _load_json(p)
    kind = _detect(p, data) if fmt == "auto" else fmt
    if task_name is not None and kind != "lm-eval":
        raise BadInput(f"--task-name applies to lm-eval results; {p} is a {kind} file")
    if kind == VLLM_GSM8K:
        return _from_vllm(p, data), None
    if kind == SGLANG_RUN_EVAL:
        return _from_sglang(p, data, num_questions), None
    if kind == "lm-eval":
        other = _any_task(p, data, task_name, metric)
        if other is not None:
            return _lm_eval_any_task(p, data, *other, metric=metric, filt=lm_eval_filter)
    if metric is not None:
        raise BadInput(f"--metric applies to lm-eval results; {p} is a {kind} file")
    return _from_lm_eval(p, data, _gsm8k_filter(lm_eval_filter), task_name)


def _gsm8k_filter(filt: str | None) -> str:
    if filt is None:
        return "strict-match"
    if filt not in LM_EVAL_FILTERS:
        raise unknown("lm-eval filter", filt, LM_EVAL_FILTERS)
    return filt


def _gsm8k_samples(p: Path) -> bool:
    """A samples file read by the GSM8K rules: its name's task is GSM8K-family (``samples_gsm8k*_<date>``), or its
    name gives no task and its first line is ``exact_match`` alone under a GSM8K filter; else the any-task rules."""
    from quantrack.accuracy.lmeval import task_from_name

    named = task_from_name(p)
    if named is not None:
        return is_gsm8k_family(named, None)
    first = _first_object(p) or {}
    metrics = first.get("metrics", ["exact_match"])
    return first.get("filter", "strict-match") in LM_EVAL_FILTERS and metrics == ["exact_match"]


def _any_task(p: Path, data: dict[str, Any], task_name: str | None, metric: str | None
              ) -> tuple[str, Path | None] | None:
    """(task, its samples file or None) when a results file is read by the any-task rules, else None (GSM8K).

    Any task with ``--metric``; without it, the GSM8K task when the file holds one (unchanged), else a task that
    has its samples file beside the results (the sample lines name their metrics)."""
    results = data.get("results")
    if not isinstance(results, dict):
        return None
    configs, groups = _obj(data, "configs"), _obj(data, "group_subtasks")
    tasks = sorted(t for t in results if not groups.get(t))
    if task_name is not None:
        if task_name not in results:
            return None  # the GSM8K path says it is not there, with a did-you-mean
        chosen = task_name
    else:
        family = [t for t in tasks if is_gsm8k_family(t, configs.get(t))]
        if family and metric is None:
            return None
        if len(tasks) != 1:
            if metric is None and not any(_find_samples(p, t) for t in tasks):
                return None
            raise BadInput(f"{p}: several tasks in results ({', '.join(tasks)}); pass --task-name")
        chosen = tasks[0]
    samples = _find_samples(p, chosen)
    if metric is None and (samples is None or is_gsm8k_family(chosen, configs.get(chosen))):
        return None
    return chosen, samples


def _lm_eval_any_task(p: Path, data: dict[str, Any], task: str, samples: Path | None, *, metric: str | None,
                      filt: str | None) -> tuple[EvalResult, dict[int, QuestionRecord] | None]:
    """Any lm-eval task of a results file: from its samples file (:func:`quantrack.accuracy.lmeval.from_results`),
    else its accuracy alone (``results.<task>["<metric>,<filter>"]``, needs ``--metric``)."""
    from quantrack.accuracy import lmeval

    metrics = data["results"].get(task)
    if not isinstance(metrics, dict):
        raise BadInput(f"{p}: results.{task} is not an object")
    counts = _obj(_obj(data, "n-samples"), task)
    n = _count(p, counts["effective"], f"n-samples.{task}.effective", low=1) if "effective" in counts else None
    n_shot = _obj(data, "n-shot").get(task)
    version = data.get("lm_eval_version")
    settings: dict[str, Any] = {"n-shot": n_shot if isinstance(n_shot, int) and not isinstance(n_shot, bool) else None,
                                "lm_eval_version": version if isinstance(version, str) else None}
    if samples is not None:
        return lmeval.from_results(p, samples, task=task, metrics=metrics, n=n, settings=settings, metric=metric,
                                   filt=filt)
    if metric is None:
        raise BadInput(f"{p}: no samples file for task {task!r} beside it; pass --metric to import its accuracy alone")
    found = [k.split(",", 1)[1] for k in metrics if isinstance(k, str) and k.startswith(f"{metric},")]
    if not found:
        raise BadInput(f"{p}: results.{task} has no {metric!r} (found: {', '.join(sorted(map(str, metrics)))})")
    if filt is None:
        if len(found) > 1:
            raise BadInput(f"{p}: results.{task} has {metric} under several filters ({', '.join(found)}); "
                           "pass --filter")
        filt = found[0]
    elif filt not in found:
        raise BadInput(f"--filter {filt!r}: results.{task} has {metric} under {', '.join(found)}")
    acc = _number(p, metrics, f"{metric},{filt}")
    res = _from_counts(accuracy=acc, n=n, invalid=None, source=lmeval.SOURCE, style=lmeval.STYLE, p=p,
                       settings={**settings, "lm_eval_task": task, "lm_eval_metric": metric,
                                 "metric_rule": "--metric", "filter": filt})
    res.task = task
    return res, None


def _load_json(p: Path) -> dict[str, Any]:
    from quantrack.accuracy.lmeval import parse_json

    try:
        data = parse_json(p.read_text(encoding="utf-8"), str(p))
    except UnicodeDecodeError:
        raise BadInput(f"{p}: not valid JSON") from None
    if not isinstance(data, dict):
        raise BadInput(f"{p}: expected a JSON object")
    return data


def _detect(p: Path, data: dict[str, Any]) -> str:
    if isinstance(data.get("results"), dict):
        return "lm-eval"
    if "accuracy" in data and "invalid_rate" in data:
        return VLLM_GSM8K
    if "score" in data:
        return SGLANG_RUN_EVAL
    raise BadInput(f"{p}: not a vLLM --save-results, SGLang run_eval or lm-eval results file; "
                   "pass --format vllm|sglang|lm-eval")


MAX_QUESTIONS = 10_000_000  # far beyond any benchmark split; a larger count is a corrupt file


def _number(p: Path, data: dict[str, Any], key: str) -> float:
    val = data.get(key)
    if isinstance(val, bool) or not isinstance(val, int | float):
        raise BadInput(f"{p}: field {key!r} missing or not a number (got {type(val).__name__})")
    if isinstance(val, float) and not math.isfinite(val):
        raise BadInput(f"{p}: field {key!r} is {val}, not a finite number")
    return float(val)


def _count(p: Path, value: Any, key: str, *, low: int = 0) -> int:
    """A whole number of questions from an imported file: an int (or an integral float), in [low, 10^7]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise BadInput(f"{p}: field {key!r} is {str(value)[:40]!r}, not a whole number of questions")
    n = int(value)
    if not low <= n <= MAX_QUESTIONS:
        raise BadInput(f"{p}: field {key!r} is {n:,}; expected {low} to {MAX_QUESTIONS:,}")
    return n


def _fraction(p: Path, value: float, what: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise BadInput(f"{p}: {what} {value} is not a fraction in [0, 1]")
    return value


def _counted(p: Path, accuracy: float, n: int, what: str) -> int:
    if not 0.0 <= accuracy <= 1.0:
        raise BadInput(f"{p}: {what} {accuracy} is not a fraction in [0, 1]")
    k = round(accuracy * n)
    if abs(k / n - accuracy) > 1e-6:  # the tools save the exact mean, so it must be some k/n
        raise BadInput(f"{p}: {what} {accuracy} is not a count out of {n} questions")
    return k


def _from_counts(*, accuracy: float, n: int | None, invalid: int | None, source: str, style: str | None,
                 settings: dict[str, Any], p: Path) -> EvalResult:
    from quantrack.accuracy.stats import proportion

    _fraction(p, accuracy, "accuracy")  # an SGLang score of 2 is not "200%"
    if n is None:  # accuracy known, count unknown: no interval can be derived
        return EvalResult(task="gsm8k", style=style, num_questions=0, n=0, correct=0, invalid=invalid, errors=0,
                          accuracy=accuracy, se=None, ci_low=None, ci_high=None, records_path=None, source=source,
                          settings=settings)
    k = _counted(p, accuracy, n, "accuracy")
    prop = proportion(k, n)
    return EvalResult(task="gsm8k", style=style, num_questions=n, n=n, correct=k, invalid=invalid, errors=0,
                      accuracy=accuracy, se=prop.se, ci_low=prop.ci_low, ci_high=prop.ci_high, records_path=None,
                      source=source, settings=settings)


def _from_vllm(p: Path, data: dict[str, Any]) -> EvalResult:
    acc = _number(p, data, "accuracy")
    n = _count(p, data.get("num_questions"), "num_questions", low=1)
    invalid = _counted(p, _number(p, data, "invalid_rate"), n, "invalid_rate")
    keep = ("num_questions", "num_shots", "max_tokens", "latency", "timestamp", "request_params")
    settings = {k: data[k] for k in keep if k in data}
    return _from_counts(accuracy=acc, n=n, invalid=invalid, source=f"imported:{VLLM_GSM8K}", style=VLLM_GSM8K,
                        settings=settings, p=p)


def _from_sglang(p: Path, data: dict[str, Any], num_questions: int | None) -> EvalResult:
    acc = _fraction(p, _number(p, data, "score"), "score")
    if num_questions is not None and not 1 <= num_questions <= MAX_QUESTIONS:
        raise BadInput(f"--num-questions {num_questions}: must be 1 to {MAX_QUESTIONS:,}")
    settings: dict[str, Any] = {k: data[k] for k in ("latency", "output_throughput") if k in data}
    if num_questions is None:
        settings["note"] = "SGLang run_eval does not record the question count; pass --num-questions for an interval"
    return _from_counts(accuracy=acc, n=num_questions, invalid=None, source=f"imported:{SGLANG_RUN_EVAL}", style=SGLANG_RUN_EVAL,
                        settings=settings, p=p)


def is_gsm8k_family(task: str, config: Any) -> bool:
    """A GSM8K task or a copy of one: its name, or its dataset (path, name or data files), mentions gsm8k."""
    if "gsm8k" in task.lower():
        return True
    if not isinstance(config, dict):
        return False
    dataset = [config.get("dataset_path"), config.get("dataset_name"), (config.get("dataset_kwargs") or {})]
    return "gsm8k" in json.dumps(dataset, default=str).lower()


def _lm_eval_task(p: Path, data: dict[str, Any], task_name: str | None) -> str:
    """The one GSM8K-family task of a results file (``task_name`` when several); groups are skipped."""
    results: dict[str, Any] = data["results"]
    configs = _obj(data, "configs")
    groups = _obj(data, "group_subtasks")
    found = sorted(results)
    family = [t for t in found if is_gsm8k_family(t, configs.get(t)) and not groups.get(t)]
    if task_name is not None:
        if task_name not in results:
            raise BadInput(f"--task-name {task_name!r}: not in {p.name}{did_you_mean(task_name, found)} "
                           f"(found: {', '.join(found) or 'none'})")
        if task_name not in family:
            why = "a group" if groups.get(task_name) else "not a GSM8K task (neither its name nor its dataset says gsm8k)"
            raise BadInput(f"--task-name {task_name!r}: {why}; GSM8K tasks in {p.name}: {', '.join(family) or 'none'}")
        return task_name
    if not family:
        raise BadInput(f"{p}: no GSM8K task in results (found: {', '.join(found) or 'none'})")
    if len(family) > 1:
        raise BadInput(f"{p}: several GSM8K tasks in results ({', '.join(family)}); pass --task-name")
    return family[0]


def _obj(data: dict[str, Any], key: str) -> dict[str, Any]:
    val = data.get(key)
    return val if isinstance(val, dict) else {}


def _other_filter(filt: str) -> str:
    return next(f for f in LM_EVAL_FILTERS if f != filt)


def _filter_key(filt: str) -> str:
    """The suffix quantrack's records and results use for a filter: ``flexible`` / ``strict``."""
    return filt.split("-", 1)[0]


def _from_lm_eval(p: Path, data: dict[str, Any], filt: str, task_name: str | None = None
                  ) -> tuple[EvalResult, dict[int, QuestionRecord] | None]:
    results = data.get("results")
    if not isinstance(results, dict):
        raise BadInput(f"{p}: no 'results' object (not an lm-eval results file)")
    task = _lm_eval_task(p, data, task_name)
    metrics = results[task]
    if not isinstance(metrics, dict):
        raise BadInput(f"{p}: results.{task} is not an object")
    key = f"exact_match,{filt}"
    if key not in metrics:
        raise BadInput(f"{p}: results.{task} has no {key!r} (found: {', '.join(sorted(metrics))})")
    acc = _number(p, metrics, key)
    other = _other_filter(filt)
    other_key = f"exact_match,{other}"
    other_acc = _number(p, metrics, other_key) if other_key in metrics else None
    n_samples = data.get("n-samples")
    counts = (n_samples.get(task) if isinstance(n_samples, dict) else None) or {}
    n = counts.get("effective") if isinstance(counts, dict) else None
    if n is not None:
        n = _count(p, n, f"n-samples.{task}.effective", low=1)
    settings: dict[str, Any] = {"filter": filt, "lm_eval_task": task,
                                "lm_eval_stderr": metrics.get(f"exact_match_stderr,{filt}"),
                                "n-shot": _obj(data, "n-shot").get(task),
                                "lm_eval_version": data.get("lm_eval_version")}
    config = _obj(data, "configs").get(task)
    if isinstance(config, dict):
        settings["fewshot_sampler"] = _obj(config, "fewshot_config").get("sampler") or "default"
        settings["fewshot_seed"] = _obj(data, "config").get("fewshot_seed")
    samples = _find_samples(p, task)
    if samples is None:
        res = _from_counts(accuracy=acc, n=n if isinstance(n, int) else None, invalid=None,
                           source="imported:lm-eval", style="lm-eval", settings=settings, p=p)
        res.task = task
        if other_acc is not None:
            res.extra[f"accuracy_{_filter_key(other)}"] = other_acc
        return res, None
    records = _lm_eval_samples(samples, filt)
    if isinstance(n, int) and len(records) != n:  # a cut-down samples file (real case: tests/data/eval/real)
        raise BadInput(f"{samples}: {len(records)} questions for filter {filt!r} but {p.name} says n-samples "
                       f"effective {n}; the samples file is partial or from another run "
                       "(move it away to import the accuracy alone)")
    res = result_from_records(records, num_questions=max(records) + 1 if records else 0, style="lm-eval",
                              records_path=str(samples), source="imported:lm-eval", settings=settings)
    res.task = task
    if res.accuracy is None or abs(res.accuracy - acc) > 1e-9:
        raise BadInput(f"{samples}: per-question records give accuracy {res.accuracy} but {p.name} says {acc}; "
                       "the two files are from different runs")
    other_rec = res.extra.get(f"accuracy_{_filter_key(other)}")
    if other_acc is not None and other_rec is not None and abs(other_rec - other_acc) > 1e-9:
        raise BadInput(f"{samples}: per-question records give {other} accuracy {other_rec} but {p.name} says "
                       f"{other_acc}; the two files are from different runs")
    return res, records


def _find_samples(results_path: Path, task: str) -> Path | None:
    """``results_<date>.json`` (or ``<stem>_<date>.json``) -> ``samples_<task>_<date>.jsonl`` beside it."""
    stem = results_path.stem
    date_id = stem.rsplit("_", 1)[1] if "_" in stem else None
    if date_id:
        cand = results_path.with_name(f"samples_{task}_{date_id}.jsonl")
        if cand.is_file():
            return cand
    found = sorted(results_path.parent.glob(f"samples_{task}_*.jsonl"))
    return found[0] if len(found) == 1 else None


def _task_from_samples_name(p: Path) -> str | None:
    """``samples_<task>_<date>.jsonl`` -> ``<task>`` (lm_eval/loggers/evaluation_tracker.py:L344-L346)."""
    stem = p.stem
    if not stem.startswith("samples_") or stem.count("_") < 2:
        return None
    return stem.removeprefix("samples_").rsplit("_", 1)[0] or None


def _sample_line(p: Path, no: int, line: str) -> dict[str, Any]:
    from quantrack.accuracy.lmeval import parse_json

    row = parse_json(line, f"{p}:{no}")
    if not isinstance(row, dict) or "doc_id" not in row or "exact_match" not in row:
        raise BadInput(f"{p}:{no}: not an lm-eval sample line (needs doc_id and exact_match)")
    doc = row["doc_id"]
    if isinstance(doc, bool) or not isinstance(doc, int) or not 0 <= doc < MAX_QUESTIONS:
        raise BadInput(f"{p}:{no}: doc_id {str(doc)[:40]!r} is not a question index (a whole number >= 0)")
    em = row["exact_match"]
    if isinstance(em, bool) or not isinstance(em, int | float) or em not in (0, 1):
        raise BadInput(f"{p}:{no}: exact_match {str(em)[:40]!r} is not 0 or 1")
    return row


def _extracted(row: dict[str, Any]) -> Any:
    filtered = row.get("filtered_resps") or [None]
    extracted = filtered[0] if isinstance(filtered, list) else filtered
    return None if extracted in (None, LM_EVAL_FALLBACK) else extracted


def _lm_eval_samples(p: Path, filt: str) -> dict[int, QuestionRecord]:
    """Per-question records from lm-eval's samples file: the lines of ``filt`` are the record, the
    other filter's verdict is kept in ``extra`` (``extracted_<other>``, ``correct_<other>``)."""
    out: dict[int, QuestionRecord] = {}
    others: dict[int, dict[str, Any]] = {}
    other = _other_filter(filt)
    for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = _sample_line(p, no, line)
        doc_id = int(row["doc_id"])
        line_filter = row.get("filter", filt)
        if line_filter == other:
            others[doc_id] = row
            continue
        if line_filter != filt:
            continue
        resps = row.get("resps") or [[None]]
        response = resps[0][0] if isinstance(resps, list) and resps and isinstance(resps[0], list) else None
        target = row.get("target")
        out[doc_id] = QuestionRecord(
            id=doc_id, prompt_sha256=row.get("prompt_hash"), response=response, extracted=_extracted(row),
            gold=lm_eval_normalize(str(target)) if target is not None else None,
            correct=bool(float(row["exact_match"])), error=None, style="lm-eval",
        )
    if not out:
        raise BadInput(f"{p}: no sample lines for filter {filt!r}")
    if others:
        missing = sorted(set(out) ^ set(others))
        if missing:
            raise BadInput(f"{p}: doc {missing[0]} has a line for one filter but not the other "
                           f"({len(missing)} such docs); the file is cut or mixed")
        suffix = _filter_key(other)
        for doc_id, rec in out.items():
            row = others[doc_id]
            if row.get("prompt_hash") != rec.prompt_sha256:
                raise BadInput(f"{p}: doc {doc_id}: the {filt} and {other} lines have different prompt_hash")
            rec.extra = {f"extracted_{suffix}": _extracted(row), f"correct_{suffix}": bool(float(row["exact_match"]))}
    return out


# ---------------------------------------------------------------- loading either kind for compare


def load_run(path: str | Path, *, metric: str | None = None, lm_eval_filter: str | None = None
             ) -> tuple[EvalResult, dict[int, QuestionRecord] | None]:
    """What ``eval compare`` accepts: a quantrack records JSONL, a result JSON written by
    ``eval import --out`` (with or without records), lm-eval samples or results of any task (``metric`` /
    ``lm_eval_filter`` as ``eval import``'s), or any importable file."""
    from quantrack.accuracy.lmeval import regular_file

    p = regular_file(Path(path))
    if p.suffix == ".jsonl":
        first = _first_object(p)
        if first is not None and "doc_id" in first:
            return import_result(p, "lm-eval", metric=metric, lm_eval_filter=lm_eval_filter)
        records = load_records(p)
        styles = {r.style for r in records.values()}
        if records and all(isinstance(q, int) for q in records):  # GSM8K ids: positions in the split
            res = result_from_records(records, num_questions=max(records) + 1,
                                      style=styles.pop() if len(styles) == 1 else None, records_path=str(p))
        else:  # a task file's string ids (quantrack.accuracy.tasks): named after the task in the meta sidecar
            meta = read_meta(p) or {}
            res = result_from_records(records, num_questions=len(records), ids=set(records),
                                      style=styles.pop() if len(styles) == 1 else None, records_path=str(p),
                                      task=str(meta.get("task") or p.stem), settings=meta)
        return res, records
    data = _load_json(p)
    if "task" in data and "source" in data and "accuracy" in data:  # quantrack result JSON
        return _from_result_json(p, data)
    return import_result(p, metric=metric, lm_eval_filter=lm_eval_filter)


def _first_object(p: Path) -> dict[str, Any] | None:
    from quantrack.accuracy.lmeval import parse_json

    try:
        with p.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    obj = parse_json(line, f"{p}: first line")
                    return obj if isinstance(obj, dict) else None
    except UnicodeDecodeError:
        raise BadInput(f"{p}: not a text file (not UTF-8): expected JSON lines") from None
    return None


def _from_result_json(p: Path, data: dict[str, Any]) -> tuple[EvalResult, dict[int, QuestionRecord] | None]:
    raw = data.get("records")
    records = None
    if isinstance(raw, list) and raw:
        records = {}
        for i, row in enumerate(raw):
            if not isinstance(row, dict):
                raise BadInput(f"{p}: records[{i}] is not an object")
            rec = QuestionRecord.from_dict(row, f"{p}: records[{i}]")
            records[rec.id] = rec
    fields = ("task", "style", "num_questions", "n", "correct", "invalid", "errors", "accuracy", "se", "ci_low",
              "ci_high", "records_path", "source", "settings", "extra")
    for key in ("num_questions", "n", "correct", "invalid", "errors"):
        if data.get(key) is not None:
            _count(p, data[key], key)
    for key in ("accuracy", "se", "ci_low", "ci_high"):
        if data.get(key) is not None:
            _fraction(p, _number(p, data, key), key)
    for key in ("task", "style", "records_path", "source"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise BadInput(f"{p}: field {key!r} is not a string")
    for key in ("settings", "extra"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise BadInput(f"{p}: field {key!r} is not an object")
    try:
        kwargs: dict[str, Any] = {k: data.get(k) for k in fields}
        res = EvalResult(**kwargs)
    except TypeError:
        raise BadInput(f"{p}: not a quantrack result file") from None
    if not res.settings:
        res.settings = {}
    if not res.extra:
        res.extra = {}
    return res, records


def format_imported(result: EvalResult) -> list[str]:
    """``eval import`` lines: an lm-eval import of any task is headed by its task and metric, the rest by GSM8K."""
    from quantrack.accuracy.gsm8k import format_result

    if result.settings.get("lm_eval_metric"):
        from quantrack.accuracy.lmeval import format_result as format_any_task

        return format_any_task(result)
    return format_result(result)


def result_json(result: EvalResult, records: dict[int, QuestionRecord] | None) -> str:
    """The ``eval import --out`` file: the result plus its records when there are any."""
    d = result.to_dict()
    if records:
        d["records"] = [json.loads(records[k].to_json()) for k in sorted(records)]
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"

