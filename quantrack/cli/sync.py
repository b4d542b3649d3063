"""`quantrack sync`: upload runs spooled while the tracking server was unreachable; with ``--stale``, also end the
runs a killed quantrack (``kill -9``, a lost machine) left RUNNING."""

from __future__ import annotations

import click


@click.command("sync")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="Upload here instead of the server each run was meant for.")
@click.option("--stale", is_flag=True,
              help="Then end KILLED the store's RUNNING runs whose quantrack process is gone (this host, same boot, "
                   "that pid no longer running), tagged quantrack.ended_by; a run of another host or a live process "
                   "is left RUNNING and said.")
def sync(tracking_uri: str | None, stale: bool) -> None:
    """Upload every spooled run (params, metrics with steps, tags, status, artifacts). Idempotent:
    a run already on the server (same quantrack.run_uuid) is skipped. Exit code 1 if any run is left."""
    from quantrack.store.tracking import end_stale_runs, spool_dir, sync_spool

    def say(m: str) -> None:
        click.echo(f"quantrack: {m}", err=True)

    res = sync_spool(tracking_uri, progress=say)
    for run_uuid, reason in res.failed:
        click.echo(f"quantrack: not synced {run_uuid[:8]}: {reason}", err=True)
    click.echo(f"uploaded {len(res.uploaded)}, already there {len(res.skipped)}, statuses set "
               f"{len(res.terminated)}, left in {spool_dir()}: {len(res.failed)}"
               + (f", step checkpoints left: {len(res.held)} (their quantrack is alive, or unknown)" if res.held else ""))
    if stale:
        st = end_stale_runs(tracking_uri, progress=say)
        click.echo(f"stale: ended KILLED {len(st.ended)} (process gone), left RUNNING {len(st.alive)} (process "
                   f"alive) and {len(st.unknown)} (unknown: another host or no process tags)")
    if res.failed:
        raise SystemExit(1)
