"""The ``quantrack`` command line: the only package that imports click.

Sub-commands are registered by module path and imported only when invoked, so
``quantrack --help`` stays fast (no mlflow, pandas, pynvml or torch at start-up).
Every ``QuantrackError`` becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
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
    "verify": ("quantrack.cli.verify", "verify", "Recompute every arm's stored figures from its own artifacts; name each that disagrees."),
    "audit": ("quantrack.cli.audit", "audit", "Find fleet nodes that silently fell back to a slower kernel."),
    "report": ("quantrack.cli.report", "report", "The decision: which arm to deploy under your SLOs and accuracy budget."),
    "sync": ("quantrack.cli.sync", "sync", "Upload runs spooled locally while the tracking server was unreachable."),
    "probe": ("quantrack.cli.probe", "probe", "Time bf16 vs FP8 GEMMs on this node's GPU (needs quantrack[probe])."),
    "export": ("quantrack.cli.export", "export", "Export a study for other tools (SkyPilot task YAML)."),
}


class HelpContext(click.Context):
    """Help pages are quantrack's own text: printed without pattern redaction (``--api-key KEY`` and
    "Authorization: Bearer" are documentation), still scrubbed of known secret values."""

    def get_help(self) -> str:
        from quantrack.redact import verbatim

        return verbatim(super().get_help())


def _help_verbatim(cmd: click.Command) -> click.Command:
    cmd.context_class = HelpContext
    for sub in getattr(cmd, "commands", {}).values():
        _help_verbatim(sub)
    return cmd


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    context_class = HelpContext

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, spec in COMMANDS.items() if _module_exists(spec[0]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None or not _module_exists(spec[0]):
            return None
        module = importlib.import_module(spec[0])
        cmd: click.Command = getattr(module, spec[1])
        return _help_verbatim(cmd)

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
    """Console entry point: every failure is one line on stderr and an exit code, never a traceback.

    QuantrackError -> its message and exit code (2 = bad input); a usage error -> one line, exit 2;
    a file the OS refuses (missing folder, full disk, permissions) -> one line naming the path; anything
    else is a bug, still one line (exit 1; ``QUANTRACK_DEBUG=1`` shows the traceback). stdout and stderr
    are wrapped so that no known secret value is ever printed (``quantrack.redact.RedactingStream``).
    """
    from quantrack.redact import RedactingStream

    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)  # type: ignore[assignment]
    try:
        return _main(argv)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = saved
        if argv is None:  # the console command: a signal during the interpreter's shutdown must not kill it
            from quantrack.interrupts import ignore_signals_at_exit

            ignore_signals_at_exit()


def _fail(message: str, code: int) -> None:
    line = " ".join(str(message).split()) or "failed"
    click.echo(f"quantrack: error: {line}", err=True)
    sys.exit(code)


def _main(argv: list[str] | None) -> Any:
    if argv is None:  # the console command (not a test's in-process call): it ends when an interrupt ends it
        from quantrack.interrupts import exit_on_late_signals

        exit_on_late_signals()
    try:
        return cli.main(args=argv, prog_name="quantrack", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("quantrack: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        if _NO_ARGS_HELP is not None and isinstance(exc, _NO_ARGS_HELP):
            # click >= 8.2, `quantrack logs` alone: the help text is the answer (8.1 prints it and exits 0)
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message(), err=True)
            sys.exit(exc.exit_code)
        # one line instead of click's Usage/Try/Error block
        where = f"; see `{exc.ctx.command_path} --help`" if exc.ctx is not None else ""
        _fail(exc.format_message().rstrip(".") + where, exc.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except QuantrackError as exc:
        _fail(str(exc), exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("quantrack: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # `quantrack compare | head`: the reader left; nothing to say
        with contextlib.suppress(OSError):
            sys.stderr.flush()
        os._exit(0)
    except OSError as exc:
        _fail(describe_os_error(exc), 1 if exc.errno in _DEVICE_ERRNOS else 2)
    except UnicodeError as exc:
        _fail(f"input is not UTF-8 text ({exc})", 2)
    except Exception as exc:
        if os.environ.get("QUANTRACK_DEBUG"):
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        _fail(f"unexpected {type(exc).__name__}: {first} (a bug: QUANTRACK_DEBUG=1 shows the traceback)", 1)
    return None


_NO_ARGS_HELP: type[click.UsageError] | None = getattr(click.exceptions, "NoArgsIsHelpError", None)
# out of space / quota / I/O: the machine's fault, not the user's input
_DEVICE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


def describe_os_error(exc: OSError) -> str:
    """One line for an OS refusal, naming the path (``no space left on device: /mnt/x/record.json``)."""
    what = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENOSPC:
        what = "no space left on device"
    path = exc.filename if exc.filename is not None else None
    if path is not None and exc.filename2 is not None:
        return f"{what}: {path} -> {exc.filename2}"
    return f"{what}: {path}" if path is not None else f"{what} ({exc})"
