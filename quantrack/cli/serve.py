"""``quantrack serve``: one arm's engine server in the foreground; Ctrl-C stops it cleanly."""

from __future__ import annotations

import click

from quantrack.cli.options import setting_option
from quantrack.study import EngineSpec, GpuSpec, Study


@click.command("serve")
@click.argument("study_file", required=False, metavar="[STUDY.toml]", type=click.Path(dir_okay=False))
@click.option("--arm", "arm_name", required=True,
              help="Arm name in the study, or (without a study) a preset / weights=…,kv=… / a llama.cpp KV type.")
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine (without a study).")
@click.option("--model", default=None, help="What the engine serves: HF id, local dir or GGUF file (without a study).")
@setting_option(EngineSpec, "host")
@setting_option(EngineSpec, "port")
@setting_option(Study, "context_len", default=None, help="Context length (--max-model-len / llama.cpp -c; default: "
                "the engine's).")
@setting_option(Study, "parallel")
@setting_option(GpuSpec, "util", default=None)
@setting_option(GpuSpec, "count", name="tp")
@click.option("--log", "log_path", default=None, type=click.Path(dir_okay=False), help="Server log file.")
@setting_option(EngineSpec, "ready_timeout_s", name="timeout")
@click.option("--dry-run", is_flag=True, help="Print the launch command and exit.")
def serve(study_file: str | None, arm_name: str, engine: str | None, model: str | None, host: str, port: int,
          context_len: int | None, parallel: int, util: float | None, tp: int, log_path: str | None,
          timeout: float, dry_run: bool) -> None:
    """Start one managed server: prints the base URL and log path; stops cleanly on Ctrl-C."""
    from quantrack.engines.lifecycle import server_for_arm, server_for_study
    from quantrack.errors import BadInput
    from quantrack.redact import redact_argv, secret_values
    from quantrack.store.files import check_regular_target

    if log_path is not None:  # before anything is resolved or started: never a link, never a device (issue #43)
        check_regular_target(log_path, "--log", "the engine's log is parsed")
    if study_file:
        from quantrack.study import load_study

        if engine or model:
            raise BadInput("give either STUDY.toml or --engine/--model, not both")
        study = _resolved_for_arm(load_study(study_file), arm_name)
        srv = server_for_study(study, arm_name, log_path=log_path)
    else:
        if not engine or not model:
            raise BadInput("without STUDY.toml, --engine and --model are required")
        srv = server_for_arm(engine, model, _arm(engine, arm_name), host=host, port=port, context_len=context_len,
                             util=util, tp=tp, parallel=parallel, log_path=log_path, startup_timeout=timeout)
    srv.log_flag = "--log" if log_path is not None else None
    shown = " ".join(redact_argv(srv.argv, secret_values(srv.env)))
    warning = exposure_warning(srv.host, srv.argv)
    if warning:
        click.echo(f"quantrack: warning: {warning}", err=True)
    click.echo(f"command: {shown}")
    if dry_run:
        return
    click.echo(f"log: {srv.log_path}")
    srv.start()
    click.echo(f"ready: {srv.base_url} (pid {srv.pid}); Ctrl-C to stop")
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        srv.stop()
        click.echo("stopped")
        return
    click.echo("server exited")




def exposure_warning(host: str, argv: list[str] | tuple[str, ...], subject: str = "--host",
                     env: dict[str, str] | None = None) -> str | None:
    """A server bound beyond loopback (``0.0.0.0``, ``::``, a LAN address) is reachable by anyone who can reach
    the machine; without ``--api-key`` its API (generation, and model loading on some engines) is open. The host
    is the ``host`` setting, or a ``--host X`` / ``--host=X`` in the engine's arguments (vLLM, SGLang and
    llama.cpp spell it so; the last one wins, as with their parsers), or llama.cpp's ``LLAMA_ARG_HOST``."""
    bound = [(host, subject)]
    for i, a in enumerate(argv):
        if a == "--host" and i + 1 < len(argv):
            bound.append((argv[i + 1], "[engine] args --host"))
        elif a.startswith("--host="):
            bound.append((a.split("=", 1)[1], "[engine] args --host"))
    if env and env.get("LLAMA_ARG_HOST"):
        bound.append((env["LLAMA_ARG_HOST"], "env LLAMA_ARG_HOST ="))
    exposed = [(h, where) for h, where in bound if not _is_loopback(h)]
    if not exposed:
        return None
    host, subject = exposed[0]
    keyed = any(a == "--api-key" or a.startswith("--api-key=") for a in argv)
    if keyed:
        return f"{subject} {host}: the engine is reachable from the network (protected only by its API key)"
    return (f"{subject} {host} exposes an unauthenticated engine to every machine that can reach this one; "
            "bind 127.0.0.1 (the default) or give the engine an --api-key")


def _is_loopback(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    return h in ("127.0.0.1", "localhost", "::1", "0:0:0:0:0:0:0:1") or h.startswith("127.")


def _resolved_for_arm(study, arm_name: str):  # type: ignore[no-untyped-def]
    """The study with the served arm's model references (smollm2:F16) replaced by local files, like `run`.

    Only this arm (and the study's [model]) is provisioned; an unknown arm is left for server_for_study
    to refuse. Provisioning progress goes to stderr, so --dry-run's stdout stays the command."""
    from dataclasses import replace

    from quantrack.models.ref import is_ref, resolve

    arm = next((a for a in study.arms if a.name == arm_name), None)
    if arm is None:
        return study

    notes: set[str] = set()

    def local(value: str | None) -> str | None:
        if not is_ref(value):
            return value
        assert value is not None
        found = resolve(value, progress=lambda msg: click.echo(msg, err=True))
        if found.note and found.note not in notes:
            notes.add(found.note)
            click.echo(found.note, err=True)
        return str(found.path)

    # what the engine serves: the arm's own model, else the study's (lifecycle.launch_spec_for_study)
    if arm.model:
        arms = tuple(replace(a, model=local(a.model)) if a.name == arm_name else a for a in study.arms)
        return replace(study, arms=arms)
    model = study.model
    for key in ("path", "gguf"):
        if getattr(model, key):
            return replace(study, model=replace(model, **{key: local(getattr(model, key))}))
    return study


def _arm(engine: str, spec: str):  # type: ignore[no-untyped-def]
    """``--arm``: a preset or key=value spec, as the engine reads it (llama.cpp: a bare KV type, q8_0, means K
    and V cache of that type: ``EngineAdapter.serve_arm``)."""
    from quantrack.arms import parse_arm_spec
    from quantrack.engines import get_adapter

    return get_adapter(engine).serve_arm(spec) if engine else parse_arm_spec(spec)
