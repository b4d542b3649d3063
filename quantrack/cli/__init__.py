"""The ``quantrack`` command line: the only package that imports click.

Sub-commands are registered by module path and imported only when invoked, so
``quantrack --help`` stays fast (no mlflow, pandas, pynvml or torch at start-up).
Every ``QuantrackError`` becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from quantrack import __version__
from quantrack.errors import QuantrackError

# name -> (module, attribute, one-line help). Help text is here so --help needs no import.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("quantrack.cli.plan", "plan", "Derived capacity per arm: weights, KV budget, tokens, concurrency."),
    "preflight": ("quantrack.cli.preflight", "preflight", "Check arms against the rulebook on a GPU before renting or running."),
    "rules": ("quantrack.cli.rules", "rules", "List, explain and validate the rulebook (rules/*.toml)."),
    "catalog": ("quantrack.cli.catalog", "catalog", "List the built-in GPU and model catalogs."),
    "logs": ("quantrack.cli.logs", "logs", "Parse engine startup logs; reconcile them with the capacity plan."),
    "serve": ("quantrack.cli.serve", "serve", "Start one arm's engine server in the foreground (managed lifecycle)."),
    "server": ("quantrack.cli.server", "server", "Query a running engine server: what it is and what it holds."),
    "latency": ("quantrack.cli.latency", "latency", "Batch-1 TTFT/TPOT/ITL against a running OpenAI-compatible server."),
    "sweep": ("quantrack.cli.sweep", "sweep", "Throughput and latency at several concurrency levels; speedup plot."),
    "eval": ("quantrack.cli.eval", "eval_group", "Accuracy: GSM8K 5-shot, paired comparison, importers, KL fidelity."),
    "run": ("quantrack.cli.run", "run", "Run a study: every arm preflighted, served, measured and logged to MLflow."),
    "log": ("quantrack.cli.log", "log", "Record results measured elsewhere as an MLflow arm run."),
    "compare": ("quantrack.cli.compare", "compare", "The study table from the tracking store (FILL IN where unmeasured)."),
    "audit": ("quantrack.cli.audit", "audit", "Find fleet nodes that silently fell back to a slower kernel."),
    "report": ("quantrack.cli.report", "report", "The decision: which arm to deploy under your SLOs and accuracy budget."),
    "sync": ("quantrack.cli.sync", "sync", "Upload runs spooled locally while the tracking server was unreachable."),
    "probe": ("quantrack.cli.probe", "probe", "Time bf16 vs FP8 GEMMs on this node's GPU (needs quantrack[probe])."),
    "export": ("quantrack.cli.export", "export", "Export a study for other tools (SkyPilot task YAML)."),
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, spec in COMMANDS.items() if _module_exists(spec[0]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None or not _module_exists(spec[0]):
            return None
        module = importlib.import_module(spec[0])
        cmd: click.Command = getattr(module, spec[1])
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="quantrack")
def cli() -> None:
    """quantrack: which quantization format runs on which GPU, what capacity it buys,
    how much faster it decodes and what accuracy it costs, measured and tracked in MLflow.

    Every figure is labelled: "derived" (arithmetic) or "measured". Accuracy that was not
    measured or imported is printed as FILL IN.
    """


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: QuantrackError -> one line on stderr + its exit code."""
    try:
        return cli.main(args=argv, prog_name="quantrack", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("quantrack: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        # usage errors: click's own one-line form, exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except QuantrackError as exc:
        click.echo(f"quantrack: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("quantrack: interrupted", err=True)
        sys.exit(130)
