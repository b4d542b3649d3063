"""``quantrack rules``: list, explain and validate the rulebook (rules/rules-*.toml, rules/methods.toml)."""

from __future__ import annotations

import click


@click.group("rules")
def rules() -> None:
    """List, explain and validate the rulebook."""


@rules.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def list_rules(fmt: str) -> None:
    """Every rule: id, verdict and a short message."""
    import json

    from quantrack.hardware.rulebook import load_rules
    from quantrack.render import render

    found = load_rules()
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in found], indent=2))
        return
    rows = [{"id": r.id, "verdict": r.verdict, "message": _short(r.message)} for r in found]
    click.echo(render(rows, "table"))
    click.echo(f"{len(found)} rules; `quantrack rules explain ID` for match, fix and source")


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@rules.command("explain")
@click.argument("rule_id")
def explain(rule_id: str) -> None:
    """The full rule: message, when it matches, fix, the log lines to expect and its source."""
    from quantrack.hardware.rulebook import get_rule

    r = get_rule(rule_id)
    click.echo(f"{r.id} [{r.verdict}]  ({r.file})")
    click.echo(f"message: {r.message}")
    if r.check:
        click.echo(f"computed: '{r.check}' check over rules/methods.toml (per-engine lists and min capability)")
    if r.match:
        click.echo("matches when: " + ", ".join(f"{k} = {v}" for k, v in r.match.items()))
    elif not r.check:
        click.echo("matches when: always")
    if r.fix:
        click.echo(f"fix: {r.fix}")
    for line in r.log_lines:
        click.echo(f"expect in the log: {line}")
    if r.notes:
        click.echo(f"notes: {r.notes}")
    click.echo(f"source: {r.source}")


@rules.command("check")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
def check(directory: str | None) -> None:
    """Validate every rule file (unknown keys, bad ranges, bad verdicts, duplicate ids)."""
    from quantrack.errors import BadInput
    from quantrack.hardware.rulebook import check_rules, load_rules, rule_files
    from quantrack.resources import rules_dir

    where = directory or str(rules_dir())
    problems = check_rules(where)
    if problems:
        for p in problems[1:]:
            click.echo(f"quantrack: error: {p}", err=True)
        raise BadInput(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    from pathlib import Path

    n = len(load_rules(where))
    files = rule_files(Path(where))
    click.echo(f"OK: {n} rules in {len(files)} files ({', '.join(f.name for f in files)}) + methods.toml")
