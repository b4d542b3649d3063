"""GSM8K 5-shot against a running OpenAI-compatible server: prompts, exemplars, scoring, the runner.

Two styles, each following one tool end to end:

* ``vllm`` (default): vLLM's ``tests/evals/gsm8k/gsm8k_eval.py`` (v0.33.0, ``vllm@4ba787ec9``), so
  numbers compare with vLLM's CI. Shots are the first ``num_shots`` train examples as
  ``"Question: {q}\\nAnswer: {a}\\n\\n"`` (L175-L203), the question is ``"Question: {q}\\nAnswer:"``,
  stop ``["Question", "Assistant:", "<|separator|>"]`` (L303), answer = last run of digits after
  removing commas, ``INVALID = -9999999`` (L67-L76), ``/v1/completions`` with temperature and seed 42
  (L100-L110).
* ``lm-eval``: lm-evaluation-harness's ``gsm8k`` task as of lm-eval 0.4.13 (checked against the PyPI
  release and ``EleutherAI/lm-evaluation-harness@4e7e0d47f33bc71070c1d38394bafbb52b117163``):
  exemplars drawn by its default sampler with its few-shot seed 1234 (:func:`fewshot_ids`), the
  same ``"Question: {q}\\nAnswer: {a}"`` turns joined by ``"\\n\\n"`` (target delimiter ``" "``),
  ``lm_eval/tasks/gsm8k/gsm8k.yaml`` strict-match ``"#### (\\-?[0-9\\.\\,]+)"`` first match (L33-L37),
  flexible-extract ``"(-?[$0-9.,]{2,})|(-?[0-9]+)"`` last match (L38-L43), stop ``until``
  ``["Question:", "</s>", "<|im_end|>"]`` (L24-L27), exact_match with ``ignore_case`` and
  ``regexes_to_ignore`` ``[",", "\\$", "(?s).*#### ", "\\.$"]`` (L13-L22), fallback ``"[invalid]"``
  (``lm_eval/filters/extraction.py:L28``, tuple groups L49-L58), request seed 1234
  (``lm_eval/models/api_models.py:L126``). ``--fewshot-sampler first_n`` gives lm-eval's
  ``first_n`` sampler instead (= vLLM's exemplars).

Data ships in the package (``quantrack/data/gsm8k``: upstream test and train splits), checked by
SHA-256 when loaded. The transport (httpx, threads) is separate from the pure prompt/score/parse
functions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack.accuracy.records import (
    QuestionRecord,
    RecordWriter,
    check_resume_meta,
    load_records,
    write_meta,
)
from quantrack.engines.evaltools import VLLM_GSM8K
from quantrack.errors import BadInput, EngineError, MeasurementError, unknown

# gsm8k: the test split (the headline score); gsm8k-train: the train split less the exemplars; gsm8k-all: both, for
# paired deltas that need more questions than the test split holds (docs/accuracy.md, "A larger pool")
TASKS = ("gsm8k", "gsm8k-train", "gsm8k-all")
STYLES = (VLLM_GSM8K, "lm-eval")
SAMPLERS = ("first_n", "lm-eval")
ORDERS = ("natural", "shuffled")  # shuffled: a permutation of the pool seeded by the request seed
FULL_TEST_SIZE = 1319
FULL_TRAIN_SIZE = 7473
MAX_POOL = FULL_TEST_SIZE + FULL_TRAIN_SIZE  # gsm8k-all with 0 shots
# a train question's id: its train-split index plus this offset, so ids never collide across splits and records
# written before train questions could be asked (test ids 0..1318) read as they did
TRAIN_ID_OFFSET = 100_000


def split_of(qid: int) -> str:
    return "train" if qid >= TRAIN_ID_OFFSET else "test"


def outcome_position(qid: int) -> int:
    """Where a question's outcome sits in the outcome string (``Tag.GSM8K_CORRECT``): test ids first, then the
    train split by index (the exemplars' positions stay '.')."""
    return qid if qid < TRAIN_ID_OFFSET else FULL_TEST_SIZE + (qid - TRAIN_ID_OFFSET)


def pool_ids(task: str, *, num_shots: int, sampler: str, test_size: int = FULL_TEST_SIZE,
             train_size: int = FULL_TRAIN_SIZE) -> list[int]:
    """The question ids a task may ask, in natural order. Train questions never include an exemplar: the pools
    with train questions need fixed exemplars (first_n, train rows 0..k-1), which are left out."""
    if task not in TASKS:
        raise unknown("task", task, TASKS)
    test = list(range(test_size))
    if task == "gsm8k":
        return test
    if sampler != "first_n" and num_shots > 0:
        raise BadInput(f"task {task} asks train questions: its exemplars must be fixed (--fewshot-sampler first_n, "
                       "the vllm style's), so that no question is ever one of its own exemplars")
    train = [TRAIN_ID_OFFSET + j for j in range(num_shots, train_size)]
    return train if task == "gsm8k-train" else test + train


def pool_size(task: str, num_shots: int) -> int:
    return {"gsm8k": FULL_TEST_SIZE, "gsm8k-train": FULL_TRAIN_SIZE - num_shots,
            "gsm8k-all": MAX_POOL - num_shots}[task]

# Upstream hashes (openai/grade-school-math data/{train,test}.jsonl, as served by vLLM's CI bucket).
TEST_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"

# vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py:L67 and L303
INVALID = -9999999
STOP_VLLM = ["Question", "Assistant:", "<|separator|>"]
# lm-evaluation-harness@4e7e0d4:lm_eval/tasks/gsm8k/gsm8k.yaml:L24-L27, L36, L42, L18-L22
STOP_LM_EVAL = ["Question:", "</s>", "<|im_end|>"]
LM_EVAL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
LM_EVAL_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
LM_EVAL_IGNORE = [r",", r"\$", r"(?s).*#### ", r"\.$"]
LM_EVAL_FALLBACK = "[invalid]"
# lm-evaluation-harness@4e7e0d4: fewshot_random_seed default (lm_eval/config/evaluate_config.py:L31, the 4th of
# DEFAULT_SEED [0, 1234, 1234, 1234]; lm_eval/evaluator.py:L84) and local-completions' request seed
# (lm_eval/models/api_models.py:L126)
LM_EVAL_FEWSHOT_SEED = 1234
LM_EVAL_REQUEST_SEED = 1234
VLLM_REQUEST_SEED = 42  # vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py --seed default

REQUEST_TIMEOUT_S = 600.0  # vLLM's script: request timeout 600 s


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Gsm8kData:
    test: list[dict[str, str]]
    train: list[dict[str, str]]  # the whole train split, in file order (the few-shot pool)
    test_sha256: str
    source: str  # "shipped" or the --data-dir path
    num_shots: int = 5

    @property
    def shots(self) -> list[dict[str, str]]:
        """The first ``num_shots`` train examples (the ``first_n`` exemplars)."""
        return self.train[:self.num_shots]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    with path.open(encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            if not line.strip() or line.startswith("#"):  # vLLM skips '#' lines (gsm8k_eval.py:L63)
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or "question" not in row or "answer" not in row:
                raise BadInput(f"{path}:{no}: expected an object with 'question' and 'answer'")
            out.append(row)
    return out


def load_data(num_shots: int, data_dir: Path | None = None) -> Gsm8kData:
    """The test split and the whole train split (the few-shot pool), both hash-checked.

    The package ships both upstream files (openai/grade-school-math); ``data_dir`` must hold
    upstream ``test.jsonl`` and ``train.jsonl`` too (checked against the same hashes).
    """
    if data_dir is None:
        from quantrack.resources import data_dir as shipped_root

        root = shipped_root() / "gsm8k"
    else:
        root = data_dir
    paths = {}
    for name, want in (("test.jsonl", TEST_SHA256), ("train.jsonl", TRAIN_SHA256)):
        path = root / name
        got = _sha256(path) if path.is_file() else None
        if data_dir is None and got != want:
            raise BadInput(f"shipped GSM8K {name} is " + ("missing" if got is None else
                           f"damaged (sha256 {got[:12]}..., expected {want[:12]}...)") +
                           "; reinstall quantrack or pass --data-dir")
        if got is None:
            raise BadInput(f"--data-dir {data_dir}: {name} not found")
        if got != want:
            raise BadInput(f"--data-dir {data_dir}: {name} sha256 {got[:12]}... does not match upstream "
                           f"{want[:12]}... (openai/grade-school-math)")
        paths[name] = path
    train = _read_jsonl(paths["train.jsonl"])
    if num_shots > len(train):
        raise BadInput(f"--num-shots {num_shots}: the train split has only {len(train)} examples")
    return Gsm8kData(_read_jsonl(paths["test.jsonl"]), train, TEST_SHA256,
                     "shipped" if data_dir is None else str(data_dir), num_shots)


# ---------------------------------------------------------------- few-shot exemplars (pure)


def default_sampler(style: str) -> str:
    """The exemplar choice of the tool a style follows: vLLM takes the first train examples, lm-eval draws."""
    return "first_n" if style == VLLM_GSM8K else "lm-eval"


def fewshot_ids(sampler: str, *, num_questions: int, num_shots: int, pool_size: int,
                seed: int = LM_EVAL_FEWSHOT_SEED) -> list[list[int]]:
    """Train-split indices of the exemplars of each of the first ``num_questions`` test questions.

    * ``first_n``: ``[0 .. num_shots-1]`` for every question — vLLM's ``gsm8k_eval.py``
      (``range(num_shots)``, vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py:L175-L203) and lm-eval's
      ``FirstNSampler`` (``pool[:n]``, lm-evaluation-harness@4e7e0d4:lm_eval/api/samplers.py:L96-L106).
    * ``lm-eval``: lm-eval's default ``ContextSampler``. One ``random.Random(seed)`` for the task
      (``set_fewshot_seed``, lm_eval/api/task.py:L560-L563, seed 1234 from ``fewshot_random_seed``,
      lm_eval/evaluator.py:L84 and L347), then for each test document in order
      (``build_all_requests``, task.py:L332-L345) ``rnd.sample(train, n)`` (samplers.py:L57-L62) — the
      ``eval_doc`` path (draw n+1, drop the document) is taken only when the few-shot split is the
      test split (task.py:L982-L986), which for GSM8K (train vs test) it is not. ``Random.sample``
      uses only the pool's length, so sampling indices draws the same exemplars.

    The draws for question i depend on every question before it, so a run of the first N questions
    equals lm-eval's ``--limit N`` and the first N of a full run.
    """
    if sampler not in SAMPLERS:
        raise unknown("few-shot sampler", sampler, SAMPLERS)
    if not 0 <= num_shots <= pool_size:
        raise BadInput(f"--num-shots {num_shots}: must be 0..{pool_size}")
    if sampler == "first_n" or num_shots == 0:
        return [list(range(num_shots)) for _ in range(num_questions)]
    rnd = random.Random(seed)
    return [rnd.sample(range(pool_size), num_shots) for _ in range(num_questions)]


# ---------------------------------------------------------------- prompt


def build_fewshot(shots: list[dict[str, str]]) -> str:
    """vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py:L175-L203 with gen_prefix ''."""
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def build_prompt(fewshot: str, question: str) -> str:
    return fewshot + f"Question: {question}\nAnswer:"


def prompt_sha256(prompt: str) -> str:
    """sha256 of the UTF-8 prompt: the same hash lm-eval logs as ``prompt_hash``."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def stop_strings(style: str) -> list[str]:
    return list(STOP_VLLM if style == VLLM_GSM8K else STOP_LM_EVAL)


# ---------------------------------------------------------------- scoring (pure)


def extract_vllm(text: str) -> int:
    """vLLM's ``get_answer_value``: last ``\\d+`` after removing commas, else ``INVALID``.

    Same corner cases as ``ast.literal_eval`` there: a leading zero ("05") or a non-ASCII digit
    is a SyntaxError in vLLM, so INVALID here too.
    """
    numbers = re.findall(r"\d+", text.replace(",", ""))
    if not numbers:
        return INVALID
    last = numbers[-1]
    if not last.isascii() or (len(last) > 1 and last[0] == "0" and last.strip("0")):
        return INVALID
    if len(last) > 4000:  # beyond int()'s digit limit; vLLM would crash, we call it invalid
        return INVALID
    return int(last)


def lm_eval_filter(text: str, pattern: re.Pattern[str], group_select: int) -> str:
    """lm-eval's RegexFilter: findall, pick ``group_select``, first non-empty group, strip."""
    found = pattern.findall(text)
    if not found:
        return LM_EVAL_FALLBACK
    match = found[group_select]
    if isinstance(match, tuple):
        nonempty = [m for m in match if m]
        if not nonempty:
            return LM_EVAL_FALLBACK
        match = nonempty[0]
    return str(match).strip()


def lm_eval_normalize(text: str) -> str:
    """exact_match preprocessing of gsm8k.yaml: regexes_to_ignore in order, then lower case."""
    for rx in LM_EVAL_IGNORE:
        text = re.sub(rx, "", text)
    return text.lower()


@dataclass(frozen=True)
class Score:
    extracted: Any  # None when invalid
    gold: Any
    correct: bool
    extra: dict[str, Any] = field(default_factory=dict)


def score(style: str, response: str, gold_answer: str) -> Score:
    """Score one response against the dataset's answer text (``... #### 18``)."""
    if style == VLLM_GSM8K:
        pred, gold = extract_vllm(response), extract_vllm(gold_answer)
        return Score(None if pred == INVALID else pred, gold, pred == gold)
    gold_norm = lm_eval_normalize(gold_answer)
    strict = lm_eval_filter(response, LM_EVAL_STRICT, 0)
    flexible = lm_eval_filter(response, LM_EVAL_FLEXIBLE, -1)
    flex_ok = lm_eval_normalize(flexible) == gold_norm
    return Score(
        None if strict == LM_EVAL_FALLBACK else strict,
        gold_norm,
        lm_eval_normalize(strict) == gold_norm,
        {"extracted_flexible": None if flexible == LM_EVAL_FALLBACK else flexible, "correct_flexible": flex_ok},
    )


# ---------------------------------------------------------------- HTTP payloads (pure)


def build_payload(prompt: str, *, style: str, max_tokens: int, temperature: float, seed: int,
                  model: str | None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stop": stop_strings(style),
        "temperature": temperature,
        "seed": seed,
    }
    if model:
        payload["model"] = model
    return payload


def parse_completion(body: Any) -> tuple[str, int | None, int | None]:
    """(text, prompt_tokens, completion_tokens) from a /v1/completions response body."""
    if not isinstance(body, dict):
        raise TypeError("response is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("response has no choices")
    text = choices[0].get("text")
    if not isinstance(text, str):
        raise TypeError("choices[0].text is missing")
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return text, pt if isinstance(pt, int) else None, ct if isinstance(ct, int) else None


def normalize_base_url(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise BadInput(f"--base-url {base_url!r}: expected http://HOST:PORT")
    if "@" in url.split("/")[2]:
        raise BadInput("--base-url: put no credentials in the URL; use --api-key or OPENAI_API_KEY")
    url = url.removesuffix("/v1")
    return url


# ---------------------------------------------------------------- result


@dataclass
class EvalResult:
    """An accuracy measurement (or import). ``accuracy`` is over answered questions only;
    it is ``None`` when nothing was answered: then every report prints FILL IN."""

    task: str
    style: str | None
    num_questions: int  # asked for
    n: int  # answered (server replied)
    correct: int
    invalid: int | None  # answered, but no answer could be extracted (None: the imported file does not say)
    errors: int  # server errors: neither right nor wrong
    accuracy: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    records_path: str | None = None
    source: str = "measured"  # or "imported:vllm" ...
    settings: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. lm-eval flexible-extract accuracy

    @property
    def invalid_rate(self) -> float | None:
        return self.invalid / self.n if (self.n and self.invalid is not None) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task, "style": self.style, "source": self.source,
            "num_questions": self.num_questions, "n": self.n, "correct": self.correct,
            "invalid": self.invalid, "invalid_rate": self.invalid_rate, "errors": self.errors,
            "accuracy": self.accuracy, "se": self.se, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "ci_method": "wilson 95%" if self.ci_low is not None else None,
            "records_path": self.records_path, "settings": self.settings, "extra": self.extra,
        }


def result_from_records(records: dict[int, QuestionRecord], *, num_questions: int, style: str | None,
                        records_path: str | None, source: str = "measured",
                        settings: dict[str, Any] | None = None, ids: set[int] | None = None,
                        task: str = "gsm8k") -> EvalResult:
    """Counts, accuracy, SE and Wilson interval from per-question records (``ids``, or ids < num_questions).
    A pool with train questions also gets the accuracy per split (``extra["by_split"]``): only the test split's
    compares with published scores."""
    from quantrack.accuracy.stats import proportion

    recs = [r for qid, r in records.items() if (qid in ids if ids is not None else qid < num_questions)]
    answered = [r for r in recs if r.answered]
    errors = sum(1 for r in recs if not r.answered)
    k = sum(1 for r in answered if r.correct)
    prop = proportion(k, len(answered))
    extra: dict[str, Any] = {}
    for other in ("flexible", "strict"):  # the lm-eval filter that is not the record's own verdict
        verdicts = [r.extra.get(f"correct_{other}") for r in answered if f"correct_{other}" in r.extra]
        if answered and len(verdicts) == len(answered):
            fp = proportion(sum(1 for f in verdicts if f), len(verdicts))
            extra[f"accuracy_{other}"] = fp.p
            extra[f"ci_{other}"] = [fp.ci_low, fp.ci_high]
    if task in TASKS and task != "gsm8k":
        by: dict[str, Any] = {}
        for split in ("test", "train"):
            rs = [r for r in answered if split_of(r.id) == split]
            if rs:
                sp = proportion(sum(1 for r in rs if r.correct), len(rs))
                by[split] = {"n": sp.n, "correct": sp.k, "accuracy": sp.p, "ci": [sp.ci_low, sp.ci_high]}
        extra["by_split"] = by
    return EvalResult(
        task=task, style=style, num_questions=num_questions, n=len(answered), correct=k,
        invalid=sum(1 for r in answered if r.invalid), errors=errors, accuracy=prop.p, se=prop.se,
        ci_low=prop.ci_low, ci_high=prop.ci_high, records_path=records_path, source=source,
        settings=settings or {}, extra=extra,
    )


def small_sample_warning(result: EvalResult) -> str | None:
    """Below the full 1319 questions: the SE and the smallest difference the run can detect."""
    from quantrack.accuracy.stats import (
        detectable_multiplier,
        min_detectable_difference,
        planning_se,
    )

    if result.n >= FULL_TEST_SIZE or result.n == 0:
        return None
    se = planning_se(result.accuracy, result.n)
    mdd = min_detectable_difference(se)
    basis = "observed accuracy" if result.accuracy not in (None, 0.0, 1.0) else "worst case p=0.5"
    return (f"warning: {result.n} answered questions (< {FULL_TEST_SIZE}): SE {se * 100:.1f} pts ({basis}); "
            f"smallest difference detectable against another run of this size: {mdd * 100:.1f} pts "
            f"(= (z0.975 + z0.80) x sqrt(2) x SE = {detectable_multiplier():.2f} x sqrt(2) x SE; 80% power, "
            f"two-sided alpha 0.05). Report the full {FULL_TEST_SIZE}.")


def format_result(result: EvalResult) -> list[str]:
    """Human-readable lines; accuracy only when measured or imported, else FILL IN."""
    acc = "FILL IN" if result.accuracy is None else f"{result.accuracy * 100:.2f}%"
    task = "" if result.task in ("gsm8k", None) else f", task {result.task}"
    filt = f", {result.settings['filter']}" if result.settings.get("filter") else ""
    lines = [f"GSM8K ({result.style or 'unknown'} scoring{filt}, {result.source}{task})"]
    lines.append(f"  accuracy        {acc}   (correct {result.correct} / answered {result.n})")
    if result.ci_low is not None and result.ci_high is not None and result.se is not None:
        lines.append(f"  95% CI (Wilson) [{result.ci_low * 100:.2f}%, {result.ci_high * 100:.2f}%]   "
                     f"SE {result.se * 100:.2f} pts")
    elif result.accuracy is not None:
        lines.append("  95% CI          unknown (the source gives no question count; pass --num-questions)")
    rate = result.invalid_rate
    if result.invalid is None:
        lines.append("  invalid         not recorded in the imported file")
    else:
        lines.append(f"  invalid         {result.invalid}" + (f" ({rate * 100:.1f}% of answered)" if rate is not None else ""))
    lines.append(f"  errors          {result.errors} of {result.num_questions} asked (not counted as wrong)")
    for other, label in (("flexible", "flexible-extract"), ("strict", "strict-match")):
        if result.extra.get(f"accuracy_{other}") is not None:
            lines.append(f"  {label:<15} {result.extra[f'accuracy_{other}'] * 100:.2f}%")
    if result.records_path:
        lines.append(f"  records         {result.records_path}")
    return lines


# ---------------------------------------------------------------- runner (I/O)


ProgressFn = Callable[[int, int, int], None]  # (done, total, errors)


def run_gsm8k(
    base_url: str,
    *,
    num_questions: int = FULL_TEST_SIZE,
    num_shots: int = 5,
    max_tokens: int = 256,
    concurrency: int = 8,
    seed: int | None = None,
    temperature: float = 0.0,
    style: str = VLLM_GSM8K,
    fewshot_sampler: str | None = None,
    fewshot_seed: int | None = None,
    records_path: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    api_key: str | None = None,
    model: str | None = None,
    data_dir: str | Path | None = None,
    engine: str | None = None,
    progress: ProgressFn | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
    task: str = "gsm8k",
    order: str = "natural",
    stop_rule: Callable[[QuestionRecord], bool] | None = None,
) -> EvalResult:
    """Ask the first ``num_questions`` GSM8K test questions, score them, write one record each.

    A server error on a question is recorded (``error`` set) and counted separately; accuracy is
    over answered questions. ``resume`` skips questions already answered in ``records_path``.
    ``timeout_s`` bounds each request (read; connect 10 s): a server that never answers fails within it.

    ``fewshot_sampler`` (default: the style's own, :func:`default_sampler`) picks the exemplars;
    ``fewshot_seed`` (default 1234, lm-eval's) seeds the ``lm-eval`` sampler and is refused with
    ``first_n``. ``seed`` is the request seed (default 42 for vllm, 1234 for lm-eval: each tool's own).

    ``task`` picks the pool (:func:`pool_ids`), ``order`` shuffles it by ``seed``; ``stop_rule`` is called with
    each record as it is written (a resumed run's earlier records first, in file order) and stops the run when it
    returns True: questions not yet sent are not asked, the ones in flight are still recorded.
    """
    from quantrack.measure.client import check_timeout, http_timeout

    check_timeout(timeout_s)
    if style not in STYLES:
        raise unknown("style", style, STYLES)
    sampler, shot_seed, seed = _sampling(style, fewshot_sampler, fewshot_seed, seed)
    if order not in ORDERS:
        raise unknown("question order", order, ORDERS)
    pool = pool_ids(task, num_shots=num_shots, sampler=sampler)  # refuses an unknown task or a drawn sampler
    _check_sizes(num_questions, len(pool), task, num_shots, max_tokens, concurrency, temperature)
    url = normalize_base_url(base_url)
    data = load_data(num_shots, Path(data_dir) if data_dir is not None else None)
    asked, shot_ids, items = _plan(pool, data, order=order, seed=seed, num_questions=num_questions,
                                   sampler=sampler, num_shots=num_shots, shot_seed=shot_seed)

    settings: dict[str, Any] = {
        "task": task, "order": order, "style": style, "num_shots": num_shots, "max_tokens": max_tokens,
        "temperature": temperature, "seed": seed, "data_sha256": data.test_sha256,
        "num_questions": num_questions, "concurrency": concurrency, "base_url": url, "engine": engine,
        "model": model, "data": data.source, "endpoint": "/v1/completions", "stop": stop_strings(style),
        "fewshot_sampler": sampler, "fewshot_seed": shot_seed,
    }

    path = Path(records_path) if records_path is not None else None
    done: dict[int, QuestionRecord] = {}
    if path is not None:
        if resume and path.exists():
            check_resume_meta(path, settings)
            done = {qid: r for qid, r in load_records(path).items() if r.answered}
        elif path.exists() and not overwrite:
            raise BadInput(f"--output {path} exists: pass --resume to continue it, or choose another --output")

    prompts = {q: build_prompt(build_fewshot([data.train[j] for j in shot_ids[q]]), items[q]["question"])
               for q in asked}
    # a finished record only counts if it was asked with this very prompt
    done = {qid: r for qid, r in done.items() if qid in prompts and r.prompt_sha256 == prompt_sha256(prompts[qid])}
    todo = [q for q in asked if q not in done]

    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=http_timeout(timeout_s)) as client:
        if todo and model is None:
            model = _served_model(client, url)
        settings["model"] = model
        if path is not None:
            write_meta(path, settings)
        writer = RecordWriter(path, resume=resume) if path is not None else None
        records: dict[int, QuestionRecord] = dict(done)
        if stop_rule is not None and any(stop_rule(r) for r in done.values()):
            todo = []  # a resumed run that had already settled asks nothing more
        try:
            _ask_all(client, todo, prompts, shot_ids, {q: items[q]["answer"] for q in todo}, style=style, max_tokens=max_tokens,
                     temperature=temperature, seed=seed, model=model, concurrency=concurrency, writer=writer,
                     records=records, progress=progress, already=len(done), total=num_questions,
                     stop_rule=stop_rule)
        finally:
            if writer is not None:
                writer.close()
    return result_from_records(records, num_questions=num_questions, style=style,
                               records_path=str(path) if path else None, settings=settings, ids=set(asked),
                               task=task)


def _check_sizes(num_questions: int, pool: int, task: str, num_shots: int, max_tokens: int, concurrency: int,
                 temperature: float) -> None:
    if not 1 <= num_questions <= pool:
        raise BadInput(f"--num-questions {num_questions}: must be 1..{pool} (the {task} pool)")
    if num_shots < 0:
        raise BadInput(f"--num-shots {num_shots}: must be >= 0")
    if max_tokens < 1:
        raise BadInput(f"--max-tokens {max_tokens}: must be >= 1")
    if not 1 <= concurrency <= 1024:
        raise BadInput(f"--concurrency {concurrency}: must be 1..1024")
    if temperature < 0:
        raise BadInput(f"--temperature {temperature}: must be >= 0")


def _plan(pool: list[int], data: Gsm8kData, *, order: str, seed: int, num_questions: int, sampler: str,
          num_shots: int, shot_seed: int | None
          ) -> tuple[list[int], dict[int, list[int]], dict[int, dict[str, str]]]:
    """The ids asked (in order), each one's exemplar ids and its item (question and answer)."""
    pool = list(pool)
    if order == "shuffled":
        random.Random(seed).shuffle(pool)
    asked = pool[:num_questions]
    test_asked = [q for q in asked if q < TRAIN_ID_OFFSET]
    # lm-eval's draws for test question i depend on the questions before it: draw for the test split up to the
    # highest test id asked, so a question gets the exemplars it gets in a natural-order run
    draws = fewshot_ids(sampler, num_questions=(max(test_asked) + 1) if test_asked else 0, num_shots=num_shots,
                        pool_size=len(data.train), seed=shot_seed if shot_seed is not None else LM_EVAL_FEWSHOT_SEED)
    shot_ids = {q: (draws[q] if q < TRAIN_ID_OFFSET else list(range(num_shots))) for q in asked}
    items = {q: (data.test[q] if q < TRAIN_ID_OFFSET else data.train[q - TRAIN_ID_OFFSET]) for q in asked}
    return asked, shot_ids, items


def _sampling(style: str, fewshot_sampler: str | None, fewshot_seed: int | None, seed: int | None
              ) -> tuple[str, int | None, int]:
    """(sampler, its seed or None for first_n, request seed): each defaults to the style's own tool."""
    sampler = default_sampler(style) if fewshot_sampler is None else fewshot_sampler
    if sampler not in SAMPLERS:
        raise unknown("few-shot sampler", sampler, SAMPLERS)
    if sampler == "first_n" and fewshot_seed is not None:
        raise BadInput("--fewshot-seed applies to --fewshot-sampler lm-eval only (first_n draws nothing)")
    shot_seed = (LM_EVAL_FEWSHOT_SEED if fewshot_seed is None else fewshot_seed) if sampler == "lm-eval" else None
    if seed is None:
        seed = VLLM_REQUEST_SEED if style == VLLM_GSM8K else LM_EVAL_REQUEST_SEED
    return sampler, shot_seed, seed


def _served_model(client: Any, url: str) -> str | None:
    """The first model id from /v1/models (vLLM and SGLang reject a completion without one)."""
    import httpx

    try:
        resp = client.get("/v1/models")
    except httpx.HTTPError as exc:
        from quantrack.measure.client import describe_error

        raise EngineError(f"cannot reach the server at {url}: {describe_error(exc)}") from None
    if resp.status_code in (401, 403):
        raise EngineError(f"{url}/v1/models answered HTTP {resp.status_code}: pass --api-key or set OPENAI_API_KEY")
    if resp.status_code != 200:
        raise EngineError(f"{url}/v1/models answered HTTP {resp.status_code}; pass --model")
    try:
        data = resp.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        raise EngineError(f"{url}/v1/models did not return an OpenAI model list; pass --model") from None


def _ask_all(client: Any, todo: list[int], prompts: dict[int, str], shot_ids: dict[int, list[int]],
             golds: dict[int, str], *,
             style: str, max_tokens: int, temperature: float, seed: int, model: str | None, concurrency: int,
             writer: RecordWriter | None, records: dict[int, QuestionRecord], progress: ProgressFn | None,
             already: int, total: int, stop_rule: Callable[[QuestionRecord], bool] | None = None) -> None:
    asks = (functools.partial(_ask_one, client, qid, prompts[qid], shot_ids[qid], golds[qid], style=style,
                              max_tokens=max_tokens, temperature=temperature, seed=seed, model=model) for qid in todo)
    ask_in_flight(asks, concurrency=concurrency, writer=writer, records=records, progress=progress,
                  already=already, total=total, stop_rule=stop_rule, name="gsm8k")


def ask_in_flight(asks: Iterable[Callable[[], QuestionRecord]], *, concurrency: int, writer: RecordWriter | None,
                  records: dict[Any, QuestionRecord], progress: ProgressFn | None, already: int, total: int,
                  stop_rule: Callable[[QuestionRecord], bool] | None = None, name: str = "ask") -> None:
    """Run the asks with at most ``concurrency`` in flight, the next sent when one returns; each record is written
    the moment it returns. A ``stop_rule`` that settles sends nothing more: only what is already in flight is still
    answered (and recorded). On Ctrl-C what has not started is dropped; finished records are already on disk."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    errors = 0
    finished = already
    if progress:
        progress(finished, total, errors)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=name)
    pending = iter(asks)
    inflight: set[Future[QuestionRecord]] = set()

    def send_next() -> None:
        ask = next(pending, None)
        if ask is not None:
            inflight.add(pool.submit(ask))

    try:
        for _ in range(concurrency):
            send_next()
        stopped = False
        while inflight:
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for fut in done:
                inflight.discard(fut)
                rec = fut.result()
                records[rec.id] = rec
                if writer is not None:
                    writer.write(rec)
                finished += 1
                errors += 0 if rec.answered else 1
                if progress:
                    progress(finished, total, errors)
                if not stopped and stop_rule is not None and stop_rule(rec):
                    stopped = True
                if not stopped:
                    send_next()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ask_one(client: Any, qid: int, prompt: str, shots: list[int], gold_answer: str, *, style: str, max_tokens: int,
             temperature: float, seed: int, model: str | None) -> QuestionRecord:
    import httpx

    payload = build_payload(prompt, style=style, max_tokens=max_tokens, temperature=temperature, seed=seed,
                            model=model)
    sha = prompt_sha256(prompt)
    t0 = time.perf_counter()
    try:
        resp = client.post("/v1/completions", json=payload)
        latency = time.perf_counter() - t0
        if resp.status_code != 200:
            raise ValueError(f"HTTP {resp.status_code}: {_short(resp.text)}")
        text, pt, ct = parse_completion(resp.json())
    except (httpx.HTTPError, ValueError, TypeError) as exc:
        return QuestionRecord(id=qid, prompt_sha256=sha, response=None, extracted=None, gold=None, correct=None,
                              error=f"{type(exc).__name__}: {_short(str(exc))}",
                              latency_s=round(time.perf_counter() - t0, 4), style=style, fewshot_ids=list(shots))
    sc = score(style, text, gold_answer)
    return QuestionRecord(id=qid, prompt_sha256=sha, response=text, extracted=sc.extracted, gold=sc.gold,
                          correct=sc.correct, error=None, latency_s=round(latency, 4), prompt_tokens=pt,
                          completion_tokens=ct, style=style, extra=dict(sc.extra), fewshot_ids=list(shots))


def _short(text: str, limit: int = 200) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[:limit] + "..."


def raise_if_errors(result: EvalResult) -> None:
    """The run fails (exit 1) when any question errored, unless the caller allows it."""
    if result.errors:
        where = f"; records kept in {result.records_path}, rerun with --resume to retry them" if result.records_path else ""
        raise MeasurementError(f"{result.errors} of {result.num_questions} questions got a server error{where} "
                               "(or pass --allow-errors)")


__all__ = [
    "INVALID",
    "LM_EVAL_FEWSHOT_SEED",
    "MAX_POOL",
    "ORDERS",
    "SAMPLERS",
    "STOP_LM_EVAL",
    "STOP_VLLM",
    "TASKS",
    "TRAIN_ID_OFFSET",
    "EvalResult",
    "build_fewshot",
    "build_payload",
    "build_prompt",
    "default_sampler",
    "extract_vllm",
    "fewshot_ids",
    "format_result",
    "lm_eval_filter",
    "lm_eval_normalize",
    "load_data",
    "outcome_position",
    "parse_completion",
    "pool_ids",
    "pool_size",
    "prompt_sha256",
    "raise_if_errors",
    "result_from_records",
    "run_gsm8k",
    "score",
    "small_sample_warning",
    "split_of",
]
