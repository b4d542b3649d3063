"""`quantrack sync`: upload runs spooled while the tracking server was unreachable."""

from __future__ import annotations

import click


@click.command("sync")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="Upload here instead of the server each run was meant for.")
def sync(tracking_uri: str | None) -> None:
    """Upload every spooled run (params, metrics with steps, tags, status, artifacts). Idempotent:
    a run already on the server (same quantrack.run_uuid) is skipped. Exit code 1 if any run is left."""
    from quantrack.store.tracking import spool_dir, sync_spool

    res = sync_spool(tracking_uri, progress=lambda m: click.echo(f"quantrack: {m}", err=True))
    for run_uuid, reason in res.failed:
        click.echo(f"quantrack: not synced {run_uuid[:8]}: {reason}", err=True)
    click.echo(f"uploaded {len(res.uploaded)}, already there {len(res.skipped)}, statuses set "
               f"{len(res.terminated)}, left in {spool_dir()}: {len(res.failed)}")
    if res.failed:
        raise SystemExit(1)
