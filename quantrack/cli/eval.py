"""`quantrack eval`: GSM8K against a running server; `compare`, `import` and (lazily) `kl` below it."""

from __future__ import annotations

import importlib
import json
from typing import Any

import click

from quantrack.cli.options import setting_option
from quantrack.engines.evaltools import ENGINE_RESULT_FORMATS
from quantrack.errors import BadInput
from quantrack.study import EngineSpec, EvalSpec

# sub-commands written in other modules, imported on first use; a missing module just hides the command
LAZY_SUBCOMMANDS: dict[str, tuple[str, str]] = {"kl": ("quantrack.cli.eval_kl", "kl")}


class EvalGroup(click.Group):
    """`eval` runs GSM8K itself when no sub-command is given; `kl` is imported only when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n, (mod, _) in LAZY_SUBCOMMANDS.items() if _module_exists(mod))
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in LAZY_SUBCOMMANDS:
            return cmd
        mod, attr = LAZY_SUBCOMMANDS[cmd_name]
        if not _module_exists(mod):
            return None
        found: click.Command = getattr(importlib.import_module(mod), attr)
        return found


def _module_exists(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _progress(done: int, total: int, errors: int) -> None:
    tail = f", {errors} errors" if errors else ""
    click.echo(f"\rgsm8k: {done}/{total} questions{tail}", err=True, nl=done >= total)


@click.group("eval", cls=EvalGroup, invoke_without_command=True)
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine behind --base-url (recorded with the result).")
@click.option("--base-url", default=None, metavar="URL", help="The running server, e.g. http://127.0.0.1:8000.")
@click.option("--task", default="gsm8k", show_default=True, metavar="TASK",
              help="gsm8k, gsm8k-train, gsm8k-all, humaneval, or a task file PATH.jsonl (docs/accuracy.md, "
                   "\"Your own task\").")
@click.option("--scorer", default=None, metavar="NAME",
              help="Scorer of a task file: exact, numeric, choice, regex:PATTERN, code or module:function "
                   "[humaneval: code].")
@click.option("--chat", is_flag=True, help="Task file: send 'prompt' items as one user message to "
              "/v1/chat/completions (the server's chat template) instead of /v1/completions.")
@setting_option(EvalSpec, "num_questions")
@setting_option(EvalSpec, "order")
@setting_option(EvalSpec, "num_shots", help="Few-shot exemplars from the train split.")
@setting_option(EvalSpec, "max_tokens")
@click.option("--temperature", default=0.0, show_default=True, type=float)
@setting_option(EvalSpec, "seed", default=None,
                help="Request seed [default: 42 with --style vllm, 1234 with --style lm-eval, each tool's own].")
@setting_option(EvalSpec, "concurrency")
@setting_option(EvalSpec, "style", help="vllm: vLLM gsm8k_eval.py (first five train examples, last integer); "
                "lm-eval: lm-evaluation-harness gsm8k (its seeded exemplar draws, strict/flexible match).")
@click.option("--fewshot-sampler", type=click.Choice(["first_n", "lm-eval"]), default=None,
              help="Exemplars: first_n = train rows 0..k-1 (vLLM gsm8k_eval.py, lm-eval first_n); lm-eval = "
                   "lm-eval's default sampler, k random train rows per question [default: the --style's own].")
@click.option("--fewshot-seed", type=int, default=None,
              help="Seed of the lm-eval sampler [default: 1234, lm-eval's fewshot seed].")
@click.option("--model", default=None, help="Model name for the request (default: first of /v1/models).")
@click.option("--output", "output", default="records.jsonl", show_default=True, type=click.Path(dir_okay=False),
              help="Per-question records, written as answers arrive.")
@click.option("--resume", is_flag=True, help="Continue --output: skip questions already answered there.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output instead of refusing.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              help="A full GSM8K copy (test.jsonl + train.jsonl, checked against upstream hashes).")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, show_envvar=True,
              help="Bearer token for the server (never printed or saved).")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds the server may take to answer one question (vLLM's gsm8k_eval.py: 600; connect: 10 s).")
@click.option("--allow-errors", is_flag=True, help="Exit 0 even if some questions got a server error.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def eval_group(ctx: click.Context, engine: str | None, base_url: str | None, task: str, scorer: str | None, chat: bool,
               num_questions: int, order: str,
               num_shots: int, max_tokens: int, temperature: float, seed: int | None, concurrency: int, style: str,
               fewshot_sampler: str | None, fewshot_seed: int | None, model: str | None, output: str, resume: bool,
               overwrite: bool, data_dir: str | None, api_key: str | None, timeout: float, allow_errors: bool,
               as_json: bool) -> None:
    """Accuracy of one arm: GSM8K 5-shot against a running OpenAI-compatible server.

    --style vllm (default) follows vLLM's tests/evals/gsm8k/gsm8k_eval.py (first five train examples,
    last-integer scoring), so the number compares with vLLM's CI; --style lm-eval follows
    lm-evaluation-harness's gsm8k task (its seeded exemplar draws, stop strings, strict/flexible match).
    Sub-commands: compare (paired test of two runs), import (other tools' results), kl.
    """
    if ctx.invoked_subcommand is not None:
        return
    from quantrack.accuracy.gsm8k import (
        TASKS,
        format_result,
        raise_if_errors,
        run_gsm8k,
        small_sample_warning,
    )

    if task not in TASKS:
        return _eval_task(ctx, task, scorer, chat, base_url)
    if scorer or chat:
        raise BadInput(f"--scorer and --chat apply to a task file or humaneval, not to {task} (scored by --style)")
    if not base_url:
        raise BadInput("--base-url is required (or use a sub-command: compare, import, kl)")
    import math

    if not (math.isfinite(temperature) and 0.0 <= temperature <= 2.0):
        raise BadInput(f"--temperature {temperature}: a number from 0 to 2 (0 = greedy, the GSM8K default)")
    from quantrack.store.files import check_writable, special_target

    check_writable(output, "--output")
    kind = special_target(output, "--output")
    if kind is not None:  # before any request: the records are resumed and get a .meta.json beside them
        raise BadInput(f"--output {output} is a {kind}: the records file must be a regular file (it is resumed "
                       "and its settings are written beside it)")
    result = run_gsm8k(base_url, num_questions=num_questions, num_shots=num_shots, max_tokens=max_tokens,
                       concurrency=concurrency, seed=seed, temperature=temperature, style=style,
                       fewshot_sampler=fewshot_sampler, fewshot_seed=fewshot_seed, records_path=output, resume=resume,
                       overwrite=overwrite, api_key=api_key, model=model, data_dir=data_dir, engine=engine,
                       progress=_progress, timeout_s=timeout, task=task, order=order)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo("\n".join(format_result(result)))
    warning = small_sample_warning(result)
    if warning:
        click.echo(warning, err=True)
    if not allow_errors:
        raise_if_errors(result)


def _eval_task(ctx: click.Context, task: str, scorer: str | None, chat: bool, base_url: str | None) -> None:
    """`eval --task PATH.jsonl|humaneval`: the task is checked whole before --base-url is even needed."""
    from quantrack.accuracy.gsm8k import raise_if_errors
    from quantrack.accuracy.tasks import format_task_result, resolve_task, run_task
    from quantrack.store.files import check_writable

    p = ctx.params
    for name, flag in (("num_shots", "--num-shots"), ("style", "--style"), ("fewshot_sampler", "--fewshot-sampler"),
                       ("fewshot_seed", "--fewshot-seed"), ("data_dir", "--data-dir")):
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise BadInput(f"{flag} applies to the GSM8K tasks, not to --task {task} (a task file's prompts are sent "
                           "as written and scored by --scorer)")
    spec = resolve_task(task)
    if not base_url:
        raise BadInput("--base-url is required (or use a sub-command: compare, import, kl)")
    check_writable(p["output"], "--output")
    given = ctx.get_parameter_source("num_questions") is not click.core.ParameterSource.DEFAULT
    seed = 42 if p["seed"] is None else p["seed"]

    def progress(done: int, total: int, errors: int) -> None:
        tail = f", {errors} errors" if errors else ""
        click.echo(f"\r{spec.name}: {done}/{total} questions{tail}", err=True, nl=done >= total)

    result = run_task(base_url, spec, scorer=scorer, num_questions=p["num_questions"] if given else None,
                      max_tokens=p["max_tokens"], concurrency=p["concurrency"], seed=seed,
                      temperature=p["temperature"], chat=chat, records_path=p["output"], resume=p["resume"],
                      overwrite=p["overwrite"], api_key=p["api_key"], model=p["model"], engine=p["engine"],
                      progress=progress, timeout_s=p["timeout"], order=p["order"])
    click.echo(json.dumps(result.to_dict(), indent=2) if p["as_json"] else "\n".join(format_task_result(result)))
    if not p["allow_errors"]:
        raise_if_errors(result)


@eval_group.command("compare")
@click.argument("base", type=click.Path(dir_okay=False))
@click.argument("arm", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--budget", default=None, metavar="PP",
              help="Accuracy budget, e.g. 1pp: verdict within / exceeds / undecided on the 95% interval of Delta "
                   "(the spellings of report --max-accuracy-drop).")
@click.option("--sequential", is_flag=True,
              help="Judge the budget question by question in the order the arm answered, with a confidence "
                   "sequence valid under optional stopping; report the first point at which it settled.")
@click.option("--metric", default=None, metavar="NAME",
              help="lm-eval files of any task: the per-sample metric (acc, acc_norm, exact_match, pass@1 ...); "
                   "default: the first the sample lines list.")
@click.option("--filter", "lm_eval_filter", default=None, metavar="NAME",
              help="lm-eval files: the filter whose lines are scored (needed when a task has several).")
def compare(base: str, arm: str, fmt: str, budget: str | None, sequential: bool, metric: str | None,
            lm_eval_filter: str | None) -> None:
    """Paired comparison of two runs on the questions both answered.

    BASE and ARM are records JSONL files from `quantrack eval`, result JSON from `eval import --out`,
    or lm-eval samples of any task (paired by doc_id, only where the prompt hashes agree; the others are
    dropped and counted). Delta = arm - base with a 95% Newcombe interval, exact McNemar test.
    With --budget: the budget verdict (docs/accuracy.md, "The budget verdict").
    """
    from quantrack.accuracy.paired import compare_runs
    from quantrack.constraints import parse_accuracy_drop

    frac = None if budget is None else parse_accuracy_drop(budget, "--budget")
    if sequential and frac is None:
        raise BadInput("--sequential judges a budget: give --budget too (e.g. --budget 1pp)")
    report = compare_runs(base, arm, budget=frac, sequential=sequential, metric=metric, lm_eval_filter=lm_eval_filter)
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_comparison(report))


@eval_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["auto", *ENGINE_RESULT_FORMATS, "lm-eval"]), default="auto",
              show_default=True)
@click.option("--filter", "lm_eval_filter", default=None, metavar="NAME",
              help="lm-eval filter to import: GSM8K strict-match (default) or flexible-extract; another task's "
                   "filter (default: its only one).")
@click.option("--task-name", default=None,
              help="lm-eval task to import when the results file holds several tasks "
                   "(gsm8k, gsm8k_cot, a local copy, any other task with its samples file ...).")
@click.option("--metric", default=None, metavar="NAME",
              help="lm-eval: the per-sample metric of any task (acc, acc_norm, exact_match, pass@1 ...); default: "
                   "GSM8K exact_match, another task the first metric its sample lines list.")
@click.option("--num-questions", type=int, default=None,
              help="Questions scored, for sources that do not record it (SGLang run_eval).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the result (with per-question records when the source has them).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def import_cmd(file: str, fmt: str, lm_eval_filter: str | None, task_name: str | None, metric: str | None,
               num_questions: int | None, out: str | None, as_json: bool) -> None:
    """Read GSM8K results from vLLM gsm8k_eval.py --save-results, SGLang run_eval or lm-eval (any GSM8K task;
    both filters are kept, --filter picks the headline one), and lm-eval --log_samples output of any other task
    (multiple choice, generative ...: docs/accuracy.md)."""
    from quantrack.accuracy.importers import format_imported, import_result, result_json

    result, records = import_result(file, fmt, num_questions=num_questions, lm_eval_filter=lm_eval_filter,
                                    task_name=task_name, metric=metric)
    if out:
        from quantrack.store.files import atomic_write_text

        atomic_write_text(out, result_json(result, records), flag="--out")
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo("\n".join(format_imported(result)))
        click.echo("  per-question    " + (f"{len(records)} records (paired comparison possible)" if records
                                          else "none (accuracy only: a paired comparison is impossible)"))


def _pct(value: float | None) -> str:
    return "FILL IN" if value is None else f"{value * 100:.2f}%"


def render_comparison(report: dict[str, Any]) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    lines = []
    metric = "GSM8K" if report.get("task") in (None, "gsm8k") else str(report["task"])  # named after the task
    if report.get("metric"):  # an lm-eval import of any task: the task and its per-sample metric
        metric = f"{report['task']} {report['metric']}"
    if not report["paired"]:
        rows = [[side, report[side]["path"], report[side]["source"], _pct(report[side]["accuracy"]), report[side]["n"]]
                for side in ("base", "arm")]
        lines.append(tabulate(rows, headers=["", "file", "source", metric, "answered"]))
        lines.append(report["reason"] + ".")
        return "\n".join(lines)
    c = report["comparison"]
    rows = [["base", report["base"]["path"], _pct(c["base_accuracy"]), c["base_correct"]],
            ["arm", report["arm"]["path"], _pct(c["arm_accuracy"]), c["arm_correct"]]]
    lines.append(f"Paired on {c['n']} questions both runs answered (measured/imported records)")
    lines.append(tabulate(rows, headers=["", "file", metric, "correct"]))
    lines.append(f"Delta (arm - base)  {c['delta'] * 100:+.2f} pts   95% CI [{c['delta_ci_low'] * 100:+.2f}, "
                 f"{c['delta_ci_high'] * 100:+.2f}] pts (Newcombe 1998 method 10, paired)")
    lines.append(f"discordant: base-only correct {c['base_only']}, arm-only correct {c['arm_only']}; "
                 f"exact McNemar p = {c['mcnemar_p']:.3g}")
    ex = report["excluded"]
    if any(ex[k] for k in ("only_in_base", "only_in_arm", "errored_in_either")):
        lines.append(f"excluded: {ex['only_in_base']} only in base, {ex['only_in_arm']} only in arm, "
                     f"{ex['errored_in_either']} with a server error in either")
    if "prompt_hash_differs" in ex:
        lines.append(f"dropped: {ex['prompt_hash_differs']} samples whose prompt_hash differs, "
                     f"{ex['doc_or_target_hash_differs']} whose doc or target hash differs (lm-eval {report['metric']}, "
                     f"filter {report['filter']})")
    lines.append(report["verdict"])
    if report.get("budget"):
        lines.append(budget_line(report["budget"]))
    return "\n".join(lines)


def budget_line(b: dict[str, Any]) -> str:
    from quantrack.accuracy.budget import BudgetVerdict

    return "Budget: " + BudgetVerdict(**b).sentence() + f". Method: {b['method_detail']}."
