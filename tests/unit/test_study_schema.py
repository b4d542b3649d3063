"""The study file's schema: every key typed and ranged once, refused before anything starts, one line naming
the table and the key (quantrack.settings + quantrack.study)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.errors import BadInput
from quantrack.settings import fields_of
from quantrack.study import EngineSpec, EvalSpec, GpuSpec, LatencySpec, Study, SweepSpec, load_study

HEAD = """name = "s"
[model]
name = "Llama-3-8B"
path = "/models/llama"
[engine]
kind = "{engine}"
{engine_keys}
[sweep]
{sweep_keys}
[eval]
{eval_keys}
[[arms]]
name = "bf16"
[[arms]]
name = "fp8"
weights = "fp8"
{arm_keys}
{top_keys}
"""


def write(tmp_path: Path, engine: str = "vllm", **keys: str) -> Path:
    text = HEAD.format(engine=engine, **{k: keys.get(k, "") for k in
                                         ("engine_keys", "sweep_keys", "eval_keys", "arm_keys")},
                       top_keys=keys.get("top_keys", ""))
    # top-level keys must come before the first table: move them up
    if keys.get("top_keys"):
        text = keys["top_keys"] + "\n" + text.replace(keys["top_keys"], "")
    p = tmp_path / "s.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_int_or_none_fields_take_integers(tmp_path: Path) -> None:
    """Issue #14: `[sweep] input_tokens = 512` was refused ("must be a string") because its default is None."""
    s = load_study(write(tmp_path, sweep_keys="input_tokens = 512\noutput_tokens = 64\nconcurrency = [1, 4]"))
    assert (s.sweep.input_tokens, s.sweep.output_tokens, s.sweep.concurrency) == (512, 64, (1, 4))
    s = load_study(write(tmp_path, eval_keys='task = "gsm8k"\nkl = { tokens = 300, baseline_util = 0.4 }'))
    assert (s.eval.task, s.eval.kl_tokens, s.eval.kl_baseline_util) == ("gsm8k", 300, 0.4)


BAD = [
    # (section, text, message after "study file '<path>': ")
    ("sweep_keys", 'input_tokens = "x"', '[sweep] input_tokens: expected an integer ≥ 1, got "x"'),
    ("sweep_keys", "input_tokens = 0", "[sweep] input_tokens: expected an integer ≥ 1, got 0"),
    ("sweep_keys", "output_tokens = 1", "[sweep] output_tokens: expected an integer ≥ 2, got 1"),
    ("sweep_keys", 'concurrency = ["a", "b"]', '[sweep] concurrency: expected a list of integers in 1..28232 (one connection per request in flight: the default Linux ephemeral port range 32768-60999), got ["a", "b"]'),
    ("sweep_keys", "concurrency = [1, 0]", "[sweep] concurrency: expected a list of integers in 1..28232 (one connection per request in flight: the default Linux ephemeral port range 32768-60999), got [1, 0]"),
    ("sweep_keys", "concurrency = 4", "[sweep] concurrency: expected a list of integers in 1..28232 (one connection per request in flight: the default Linux ephemeral port range 32768-60999), got 4"),
    ("sweep_keys", "requests_per_level = -3", "[sweep] requests_per_level: expected an integer in 0..1000000 (every prompt of a level is built before its first request), got -3"),
    ("sweep_keys", "concurency = [1]", "[sweep]: unknown key 'concurency' (did you mean 'concurrency'?)"),
    ("eval_keys", 'task = "mmlu"', '[eval] task: expected one of gsm8k, gsm8k-train, gsm8k-all, humaneval or a task file PATH.jsonl, got "mmlu"'),
    ("eval_keys", 'task = "gsm8"', "(did you mean 'gsm8k'?)"),
    ("eval_keys", "num_questions = -4", "[eval] num_questions: expected an integer in 1..8792, got -4"),
    ("eval_keys", "num_questions = 2000", "[eval] num_questions 2000: the gsm8k pool has 1319 questions at 5 shots"),
    ("eval_keys", 'style = "bogus"', '[eval] style: expected one of vllm, lm-eval, got "bogus"'),
    ("eval_keys", "concurrency = 0", "[eval] concurrency: expected an integer in 1..1024, got 0"),
    ("eval_keys", "max_tokens = 0", "[eval] max_tokens: expected an integer ≥ 1, got 0"),
    ("eval_keys", "num_shots = -1", "[eval] num_shots: expected an integer ≥ 0, got -1"),
    ("eval_keys", 'task = "gsm8k"\nnum_shots = 8', "[eval] num_shots: 5 exemplars ship with quantrack, got 8"),
    ("eval_keys", "seed = 1.5", "[eval] seed: expected an integer, got 1.5"),
    ("eval_keys", "kl = { tokens = 100, top_k = 500 }", "[eval] kl.top_k: expected an integer in 1..100, got 500"),
    ("engine_keys", "ready_timeout_s = -5", "[engine] ready_timeout_s: expected a finite number > 0, got -5"),
    ("engine_keys", "ready_timeout_s = nan", "[engine] ready_timeout_s: expected a finite number > 0, got nan"),
    ("engine_keys", "ready_timeout_s = inf", "[engine] ready_timeout_s: expected a finite number > 0, got inf"),
    ("engine_keys", "args = [1, 2]", "[engine] args: expected a list of strings, got [1, 2]"),
    ("engine_keys", 'args = "--foo"', '[engine] args: expected a list of strings, got "--foo"'),
    ("engine_keys", "env = { A = 1 }", '[engine] env: expected a table of strings, like { NAME = "value" }, got {"A": 1}'),
    ("engine_keys", "port = 70000", "[engine] port: expected an integer in 0..65535, got 70000"),
    ("engine_keys", "port = -1", "[engine] port: expected an integer in 0..65535, got -1"),
    ("engine_keys", "port = true", "[engine] port: expected an integer in 0..65535, got true"),
    ("engine_keys", 'host = ""', '[engine] host: expected a non-empty string, got ""'),
    ("arm_keys", 'env = "FOO=1"', '[[arms]] #2 (fp8) env: expected a table of strings, like { NAME = "value" }, got "FOO=1"'),
    ("arm_keys", "args = [1, 2]", "[[arms]] #2 (fp8) args: expected a list of strings, got [1, 2]"),
    ("arm_keys", 'baseline = "yes"', '[[arms]] #2 (fp8) baseline: expected true or false, got "yes"'),
    ("arm_keys", 'kv = "fp7"', "[[arms]] #2 (fp8): unknown KV-cache dtype 'fp7'"),
    ("arm_keys", 'wieghts = "fp8"', "[[arms]] #2 (fp8): unknown key 'wieghts' (did you mean 'weights'?)"),
    ("top_keys", "context_len = 0", "context_len: expected an integer ≥ 1, got 0"),
    ("top_keys", 'parallel = "2"', 'parallel: expected an integer in 1..28232 (a slot serves one request in flight: one connection per request in flight: the default Linux ephemeral port range 32768-60999), got "2"'),
    ("top_keys", "contxt_len = 4096", "unknown key 'contxt_len' (did you mean 'context_len'?)"),
    ("top_keys", "baseline = 3", "baseline: expected the name of an arm, got 3"),
]


@pytest.mark.parametrize("where, text, message", BAD, ids=[b[1] for b in BAD])
def test_bad_values_are_one_line_naming_table_and_key(tmp_path: Path, where: str, text: str, message: str) -> None:
    p = write(tmp_path, **{where: text})
    with pytest.raises(BadInput) as exc:
        load_study(p)
    got = str(exc.value)
    assert "\n" not in got
    assert got.startswith(f"study file '{p}': ")
    assert message in got, got


def test_sglang_may_ask_for_more_than_vllms_20_logprobs(tmp_path: Path) -> None:
    s = load_study(write(tmp_path, engine="sglang", eval_keys="kl = { tokens = 100, top_k = 50 }"))
    assert s.eval.kl_top_k == 50
    with pytest.raises(BadInput, match=r"\[eval\] kl.top_k: vLLM returns at most"):
        load_study(write(tmp_path, engine="vllm", eval_keys="kl = { tokens = 100, top_k = 50 }"))


def test_unknown_engine_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"\[engine\] kind: expected one of vllm, sglang, llamacpp, got \"vlm\" "
                                       r"\(did you mean 'vllm'\?\)"):
        load_study(write(tmp_path, engine="vlm"))


@pytest.mark.parametrize("cmd", [
    ["preflight", "--gpu", "H100", "--study", "{study}"],
    ["export", "skypilot", "{study}", "--out", "out"],
    ["run", "{study}"],
    ["serve", "{study}", "--arm", "bf16", "--dry-run"],
    ["log", "--study", "{study}", "--arm", "bf16"],
], ids=lambda c: c[0])
def test_commands_refuse_a_bad_study_before_starting(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, cmd: list[str]) -> None:
    """`[eval] task = "mmlu"` used to pass preflight and be logged as eval_task=mmlu after measuring GSM8K."""
    (tmp_path / "in").mkdir()
    p = write(tmp_path / "in", eval_keys='task = "mmlu"')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exc:
        main([a.replace("{study}", str(p)) for a in cmd])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err == f"quantrack: error: study file '{p}': [eval] task: expected one of gsm8k, gsm8k-train, gsm8k-all, humaneval or a task file PATH.jsonl, got \"mmlu\"\n"
    assert list(work.iterdir()) == []  # nothing created: no store, no spool, no export


def test_every_setting_has_help_and_a_checkable_type() -> None:
    """One definition per field: each carries its help text; the type comes from the hint."""
    for cls in (EngineSpec, GpuSpec, LatencySpec, SweepSpec, EvalSpec, Study):
        for name, (kind, check, _default) in fields_of(cls).items():
            assert check.help, f"{cls.__name__}.{name} has no help"
            assert kind.base in ("int", "float", "bool", "str", "list", "table", "dict")


def test_fleet_table_is_checked_at_load(tmp_path: Path) -> None:
    """[fleet] belongs to quantrack.fleet, but it is validated when the study is read, not when a fleet starts."""
    p = write(tmp_path, arm_keys="[fleet]\nmax_retries = -1")
    with pytest.raises(BadInput) as exc:
        load_study(p)
    assert str(exc.value) == f"study file '{p}': [fleet] max_retries must be an integer in 0..20, got -1"


def test_study_reference_doc_is_generated_from_the_schema() -> None:
    """docs/study-reference.md is `python -m quantrack.study`: regenerate it after changing a setting."""
    from quantrack.study import reference_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "study-reference.md"
    assert doc.read_text(encoding="utf-8") == reference_markdown()
