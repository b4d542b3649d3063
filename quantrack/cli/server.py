"""``quantrack server info``: what a running engine server is and what it holds (live queries)."""

from __future__ import annotations

import json

import click

from quantrack.engines import ENGINE_KINDS


@click.group("server")
def server() -> None:
    """Query a running engine server."""


@server.command("info")
@click.option("--engine", required=True, type=click.Choice(ENGINE_KINDS))
@click.option("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
@click.option("--timeout", type=float, default=10.0, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def info(engine: str, base_url: str, timeout: float, fmt: str) -> None:
    """Version, model, KV capacity and slots as the server reports them (measured, live)."""
    import httpx

    from quantrack.engines import get_adapter
    from quantrack.errors import BadInput, EngineError
    from quantrack.measure.client import check_base_url, check_timeout, describe_error

    if not base_url.startswith(("http://", "https://")):
        raise BadInput(f"--base-url must start with http:// or https:// (got {base_url!r})")
    base_url = check_base_url(base_url)
    timeout = check_timeout(timeout)
    try:
        live = get_adapter(engine).query(base_url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise EngineError(f"cannot query {engine} at {base_url}: {describe_error(exc)}") from None
    except (ValueError, TypeError, AttributeError, KeyError):  # JSON that is not JSON, or not the engine's shape
        raise BadInput(f"--base-url {base_url} answered something that is not a {engine} server's JSON "
                       "(wrong --engine or not an engine server?)") from None
    if not live.facts:
        # every endpoint refused (HTTP 500 everywhere): nothing live to show, and no table pretending otherwise
        raise EngineError(f"{engine} server at {base_url} answered none of its info endpoints with HTTP 200")
    facts = live.to_dict()
    if fmt == "json":
        click.echo(json.dumps(facts, indent=2, default=str))
        return
    from quantrack.render import render

    rows = [{"field": k, "value": json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}
            for k, v in facts.items()]
    click.echo(render(rows, "table", title=f"{engine} server at {base_url} (live)"))
