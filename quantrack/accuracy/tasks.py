"""A task of the user's own (a JSONL file) or HumanEval, asked of a running server and scored per question.

The file format (docs/accuracy.md, "Your own task"): one JSON object per line, ``id`` (a unique non-empty string),
``prompt`` (text, sent to ``/v1/completions``) or ``messages`` (a chat, sent to ``/v1/chat/completions``),
``reference`` (a string, a number, a list of acceptable answers, or a choice letter), optional ``choices`` (list of
strings) and, for the ``code`` scorer, an optional ``entry_point``. Blank lines are skipped. The whole file is
checked before any request (:func:`load_task`); its SHA-256 goes into the records' meta sidecar and the result.

Records are the GSM8K ones (:class:`quantrack.accuracy.records.QuestionRecord`) with the item's string id, so
``eval compare`` pairs two runs of a task by id and prompt hash exactly as it pairs GSM8K runs. The metric is named
after the task (the file's stem, or ``humaneval``).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.accuracy.records import QuestionRecord, RecordWriter, check_resume_meta, load_records, write_meta
from quantrack.errors import BadInput, unknown

HUMANEVAL = "humaneval"
ENDPOINT_COMPLETIONS = "/v1/completions"
ENDPOINT_CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Task:
    name: str
    items: list[dict[str, Any]]  # in file order, each validated
    sha256: str
    source: str  # the file path, or "shipped:humaneval"
    default_scorer: str | None = None
    stop: tuple[str, ...] = ()


def _fail(path: Path, no: int, why: str) -> BadInput:
    return BadInput(f"{path}:{no}: {why}")


def _check_item(path: Path, no: int, row: Any, seen: dict[str, int]) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise _fail(path, no, "expected a JSON object with id, prompt or messages, and reference")
    qid = row.get("id")
    if qid is None:
        raise _fail(path, no, "no 'id'")
    if not isinstance(qid, str) or not qid.strip():
        raise _fail(path, no, f"'id' must be a non-empty string, got {qid!r}")
    if qid in seen:
        raise _fail(path, no, f"duplicate id {qid!r} (first on line {seen[qid]})")
    seen[qid] = no
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        raise _fail(path, no, f"item {qid!r}: give exactly one of 'prompt' (text) and 'messages' (chat)")
    if prompt is not None and not isinstance(prompt, str):
        raise _fail(path, no, f"item {qid!r}: 'prompt' must be a string")
    if messages is not None and not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise _fail(path, no, f"item {qid!r}: 'messages' must be a non-empty list of {{role, content}} strings")
    if "reference" not in row or row["reference"] is None:
        raise _fail(path, no, f"item {qid!r}: no 'reference'")
    ref = row["reference"]
    refs = ref if isinstance(ref, list) else [ref]
    if not refs or not all(isinstance(r, (str, int, float)) and not isinstance(r, bool) for r in refs):
        raise _fail(path, no, f"item {qid!r}: 'reference' must be a string, a number, or a non-empty list of them")
    choices = row.get("choices")
    if choices is not None and not (isinstance(choices, list) and choices
                                    and all(isinstance(c, str) for c in choices)):
        raise _fail(path, no, f"item {qid!r}: 'choices' must be a non-empty list of strings")
    return row


def load_task(path: str | Path) -> Task:
    """Read and check a task file: the first bad line is refused with its number, before anything is asked."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"--task {p}: file not found")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"--task {p}: not UTF-8 text (expected JSON lines)") from None
    items: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(p, no, f"not valid JSON ({exc.msg})") from None
        items.append(_check_item(p, no, row, seen))
    if not items:
        raise BadInput(f"--task {p}: no items")
    return Task(p.stem, items, hashlib.sha256(raw).hexdigest(), str(p))


def humaneval_task() -> Task:
    """HumanEval as a task: the benchmark's prompt (a completion), its tests as the reference, scorer ``code``."""
    from quantrack.accuracy.humaneval import STOP, load_problems

    problems, sha = load_problems()
    items = [{"id": p["task_id"], "prompt": p["prompt"], "reference": p["test"], "entry_point": p["entry_point"]}
             for p in problems]
    return Task(HUMANEVAL, items, sha, "shipped:humaneval", default_scorer="code", stop=tuple(STOP))


def resolve_task(task: str) -> Task:
    if task == HUMANEVAL:
        return humaneval_task()
    if task.endswith(".jsonl") or Path(task).is_file():
        return load_task(task)
    from quantrack.accuracy.gsm8k import TASKS
    from quantrack.errors import did_you_mean

    known = (*TASKS, HUMANEVAL)
    raise BadInput(f"--task: expected one of {', '.join(known)} or a task file PATH.jsonl, got \"{task}\""
                   f"{did_you_mean(task, known)}")


# ---------------------------------------------------------------- prompts and payloads (pure)


def item_prompt_text(item: dict[str, Any]) -> str:
    """What the prompt hash covers: the prompt text, or the messages as canonical JSON."""
    if item.get("messages") is not None:
        return json.dumps(item["messages"], ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return str(item["prompt"])


def item_messages(item: dict[str, Any]) -> list[dict[str, str]]:
    if item.get("messages") is not None:
        return list(item["messages"])
    return [{"role": "user", "content": str(item["prompt"])}]


def build_request(item: dict[str, Any], *, chat: bool, max_tokens: int, temperature: float, seed: int,
                  stop: list[str], model: str | None) -> tuple[str, dict[str, Any]]:
    """(endpoint, payload): messages (or ``chat``) go to the chat endpoint, a prompt to completions."""
    payload: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stream": False}
    if stop:
        payload["stop"] = list(stop)
    if model:
        payload["model"] = model
    if chat or item.get("messages") is not None:
        payload["messages"] = item_messages(item)
        return ENDPOINT_CHAT, payload
    payload["prompt"] = item["prompt"]
    return ENDPOINT_COMPLETIONS, payload


def parse_answer(endpoint: str, body: Any) -> tuple[str, int | None, int | None]:
    from quantrack.accuracy.gsm8k import parse_completion

    if endpoint == ENDPOINT_COMPLETIONS:
        return parse_completion(body)
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise ValueError("response has no choices")
    msg = body["choices"][0].get("message") if isinstance(body["choices"][0], dict) else None
    text = msg.get("content") if isinstance(msg, dict) else None
    if not isinstance(text, str):
        raise TypeError("choices[0].message.content is missing")
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return text, pt if isinstance(pt, int) else None, ct if isinstance(ct, int) else None


# ---------------------------------------------------------------- runner (I/O)


ProgressFn = Callable[[int, int, int], None]


def run_task(base_url: str, task: Task, *, scorer: str | None = None, num_questions: int | None = None,
             max_tokens: int = 256, concurrency: int = 8, seed: int = 42, temperature: float = 0.0,
             chat: bool = False, stop: list[str] | None = None, records_path: str | Path | None = None,
             resume: bool = False, overwrite: bool = False, api_key: str | None = None, model: str | None = None,
             engine: str | None = None, progress: ProgressFn | None = None, timeout_s: float = 600.0,
             code_timeout_s: float = 10.0, order: str = "natural",
             stop_rule: Callable[[QuestionRecord], bool] | None = None) -> Any:
    """Ask the first ``num_questions`` items (default all), score each with ``scorer``, write one record each.
    ``order = "shuffled"`` asks them in a permutation seeded by ``seed`` (the items asked are then the first
    ``num_questions`` of it, as for GSM8K); ``stop_rule`` is called with each record as it is written (a resumed
    run's earlier records first) and sends nothing more once it returns true (the sequential budget test).
    Returns an :class:`quantrack.accuracy.gsm8k.EvalResult` whose ``task`` is the task's name."""
    from quantrack.accuracy.gsm8k import ORDERS, _served_model, normalize_base_url, prompt_sha256, result_from_records
    from quantrack.accuracy.scorers import get_scorer
    from quantrack.measure.client import check_timeout, http_timeout

    check_timeout(timeout_s)
    spec = scorer or task.default_scorer
    if spec is None:
        raise BadInput(f"--task {task.source}: give --scorer (exact, numeric, choice, regex:PATTERN, code, "
                       "module:function)")
    score_fn = get_scorer(spec, code_timeout_s=code_timeout_s)
    n = len(task.items) if num_questions is None else num_questions
    if not 1 <= n <= len(task.items):
        raise BadInput(f"--num-questions {n}: must be 1..{len(task.items)} (the items of {task.name})")
    if max_tokens < 1 or not 1 <= concurrency <= 1024:
        raise BadInput("--max-tokens must be >= 1 and --concurrency 1..1024")
    if order not in ORDERS:
        raise unknown("question order", order, ORDERS)
    url = normalize_base_url(base_url)
    # HumanEval's stop strings end a completion; a chat answer (a fenced block) must not be cut at its first def
    stops = (list(task.stop) if not chat else []) if stop is None else list(stop)
    items = list(task.items)
    if order == "shuffled":  # the permutation GSM8K's pools use (gsm8k._plan): random.Random(seed).shuffle
        random.Random(seed).shuffle(items)
    items = items[:n]
    style = f"scorer:{spec}"
    settings: dict[str, Any] = {
        "task": task.name, "order": order, "style": style, "num_shots": 0, "max_tokens": max_tokens,
        "temperature": temperature, "seed": seed, "data_sha256": task.sha256, "task_sha256": task.sha256,
        "task_file": task.source, "scorer": spec, "chat": chat, "stop": stops, "num_questions": n,
        "concurrency": concurrency, "base_url": url, "engine": engine, "model": model,
        "fewshot_sampler": None, "fewshot_seed": None,
    }
    path = Path(records_path) if records_path is not None else None
    done: dict[Any, QuestionRecord] = {}
    if path is not None:
        if resume and path.exists():
            check_resume_meta(path, settings)
            done = {q: r for q, r in load_records(path).items() if r.answered}
        elif path.exists() and not overwrite:
            raise BadInput(f"--output {path} exists: pass --resume to continue it, or choose another --output")
    hashes = {it["id"]: prompt_sha256(item_prompt_text(it)) for it in items}
    done = {q: r for q, r in done.items() if q in hashes and r.prompt_sha256 == hashes[q]}
    todo = [it for it in items if it["id"] not in done]
    if stop_rule is not None and any(stop_rule(r) for r in done.values()):
        todo = []  # a resumed run whose verdict had settled asks nothing more

    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    records: dict[Any, QuestionRecord] = dict(done)
    with httpx.Client(base_url=url, headers=headers, timeout=http_timeout(timeout_s)) as client:
        if todo and model is None:
            model = _served_model(client, url)
        settings["model"] = model
        if path is not None:
            write_meta(path, settings)
        writer = RecordWriter(path, resume=resume) if path is not None else None
        try:
            _ask_all(client, todo, hashes, score_fn, settings, writer, records, progress, len(done), n,
                     chat=chat, stops=stops, model=model, stop_rule=stop_rule)
        finally:
            if writer is not None:
                writer.close()
    return result_from_records(records, num_questions=n, style=style, records_path=str(path) if path else None,
                               settings=settings, ids=set(hashes), task=task.name)


def _ask_all(client: Any, todo: list[dict[str, Any]], hashes: dict[str, str], score_fn: Any,
             settings: dict[str, Any], writer: RecordWriter | None, records: dict[Any, QuestionRecord],
             progress: ProgressFn | None, already: int, total: int, *, chat: bool, stops: list[str],
             model: str | None, stop_rule: Callable[[QuestionRecord], bool] | None = None) -> None:
    import functools

    from quantrack.accuracy.gsm8k import ask_in_flight

    asks = (functools.partial(_ask_one, client, it, hashes[it["id"]], score_fn, settings, chat=chat, stops=stops,
                              model=model) for it in todo)
    ask_in_flight(asks, concurrency=settings["concurrency"], writer=writer, records=records, progress=progress,
                  already=already, total=total, stop_rule=stop_rule, name="task")


def _ask_one(client: Any, item: dict[str, Any], sha: str, score_fn: Any, settings: dict[str, Any], *, chat: bool,
             stops: list[str], model: str | None) -> QuestionRecord:
    import httpx

    from quantrack.accuracy.gsm8k import _short

    endpoint, payload = build_request(item, chat=chat, max_tokens=settings["max_tokens"],
                                      temperature=settings["temperature"], seed=settings["seed"], stop=stops,
                                      model=model)
    style = settings["style"]
    t0 = time.perf_counter()
    try:
        resp = client.post(endpoint, json=payload)
        latency = time.perf_counter() - t0
        if resp.status_code != 200:
            raise ValueError(f"HTTP {resp.status_code}: {_short(resp.text)}")
        text, pt, ct = parse_answer(endpoint, resp.json())
    except (httpx.HTTPError, ValueError, TypeError) as exc:
        return QuestionRecord(id=item["id"], prompt_sha256=sha, response=None, extracted=None, gold=None,
                              correct=None, error=f"{type(exc).__name__}: {_short(str(exc))}",
                              latency_s=round(time.perf_counter() - t0, 4), style=style)
    try:
        verdict = score_fn(text, item)
    except Exception as exc:  # noqa: BLE001 - a user's scorer: stop with one line naming the item
        raise BadInput(f"scorer {settings['scorer']} raised {type(exc).__name__} on item {item['id']!r}: "
                       f"{_short(str(exc))}") from None
    gold = item["reference"] if settings["scorer"] != "code" else None  # code: the tests, not worth a copy per record
    return QuestionRecord(id=item["id"], prompt_sha256=sha, response=text, extracted=verdict.extracted, gold=gold,
                          correct=verdict.correct, error=None, latency_s=round(latency, 4), prompt_tokens=pt,
                          completion_tokens=ct, style=style, extra=dict(verdict.extra))


def format_task_result(result: Any) -> list[str]:
    """Human-readable lines, headed by the task's name (its metric)."""
    acc = "FILL IN" if result.accuracy is None else f"{result.accuracy * 100:.2f}%"
    s = result.settings
    lines = [f"{result.task} (scorer {s.get('scorer')}, {result.source}; task sha256 {str(s.get('task_sha256'))[:12]}...)"]
    lines.append(f"  accuracy        {acc}   (correct {result.correct} / answered {result.n})")
    if result.ci_low is not None and result.ci_high is not None:
        lines.append(f"  95% CI (Wilson) [{result.ci_low * 100:.2f}%, {result.ci_high * 100:.2f}%]")
    lines.append(f"  not extracted   {result.invalid}")
    lines.append(f"  errors          {result.errors} of {result.num_questions} asked (not counted as wrong)")
    if result.records_path:
        lines.append(f"  records         {result.records_path}")
    return lines
