"""``quantrack export``: hand a study to other tools (SkyPilot task YAML)."""

from __future__ import annotations

import click


@click.group("export")
def export() -> None:
    """Export a study for other tools."""


@export.command("skypilot")
@click.argument("study_file", metavar="STUDY.toml", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for one task YAML (+ narrowed study file) per GPU type.")
def skypilot(study_file: str, out_dir: str) -> None:
    """One SkyPilot task YAML per GPU type; secrets are passed at launch, never written."""
    from quantrack.fleet.skypilot import export_skypilot
    from quantrack.study import load_study

    study = load_study(study_file)
    tasks = export_skypilot(study, out_dir)
    for t in tasks:
        click.echo(f"{t.gpu} -> accelerators {t.accelerator}: {t.yaml_path} (study: {t.study_path.name})")
        for note in t.notes:
            click.echo(f"  note: {note}")
    secrets = sorted({s for t in tasks for s in _secret_names(t.yaml_path)})
    flags = " ".join(f"--secret {s}" for s in secrets)
    click.echo(f"launch: cd {out_dir} && sky launch -c <cluster> <task>.sky.yaml {flags}".rstrip())


def _secret_names(path: object) -> list[str]:
    import yaml  # type: ignore[import-untyped]

    with open(str(path), encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    return list((data.get("secrets") or {}).keys())
