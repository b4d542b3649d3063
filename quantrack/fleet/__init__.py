"""Fleet: one study's arms spread over many GPU nodes (Ray) or exported as cloud tasks (SkyPilot).

This package owns the study file's ``[fleet]`` table (validated by ``quantrack.fleet.spec``, which the study schema
calls)
and the plan it implies: one job per (GPU type x arm). Ray and SkyPilot are imported only by
``ray_runner`` and ``skypilot`` inside the functions that need them.

``[fleet]`` keys::

    gpus = ["H100", "A100-80GB"]       # GPU types to run every arm on (catalog names); default: [gpu] name
    resource = "gpu_type:{gpu}"        # Ray resource a node must hold; default "accelerator_type:{ray}"
    resource_amount = 1.0              # how much of it one arm takes (1 = one arm per node at a time)
    num_gpus = 1                       # Ray num_gpus per arm; default [gpu] count (0 for llamacpp)
    gpu_override = "H100"              # GPU to assume on nodes without NVML (labelled "from catalog")
    max_retries = 2                    # re-runs of an arm whose node died, then FAILED
    clouds = ["aws", "gcp"]            # SkyPilot: candidate clouds (any_of)
    regions = ["us-east-1"]            # SkyPilot: candidate regions (any_of)
    any_of = [{cloud = "aws", region = "us-east-1"}]   # SkyPilot: explicit candidates
    use_spot = false                   # SkyPilot
    secrets = ["MLFLOW_TRACKING_URI", "HF_TOKEN"]       # env names passed as SkyPilot secrets
    install = "quantrack==0.1.0"       # what `setup` pip-installs (a spec or a git URL)

Placeholders in ``resource``: ``{gpu}`` the name as written in ``gpus``, ``{name}`` the catalog's
canonical name, ``{ray}`` Ray's accelerator label, ``{sky}`` SkyPilot's accelerator name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quantrack.arms import Arm
from quantrack.fleet.spec import FleetSpec, fleet_spec

if TYPE_CHECKING:
    from quantrack.study import Study

@dataclass(frozen=True)
class FleetJob:
    """One (GPU type x arm): the unit Ray schedules and retries."""

    gpu: str | None  # as written in [fleet] gpus (None: any node)
    arm: Arm
    resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources
    num_gpus: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.gpu or 'any'}/{self.arm.name}"


def parse_fleet(study: Study) -> FleetSpec:
    """Validate ``study.fleet``; every problem is one line naming the study file and key."""
    return fleet_spec(study.fleet, study.gpu.name, study.source)


def resource_name(spec: FleetSpec, gpu: str) -> str:
    """The Ray resource a node must hold to run ``gpu``'s arms (placeholders filled)."""
    from quantrack.fleet.skypilot import ray_accelerator_type, skypilot_accelerator
    from quantrack.hardware.catalog import get_gpu

    entry = get_gpu(gpu)
    needs_sky = "{sky}" in spec.resource
    return spec.resource.format(
        gpu=gpu, name=entry.name, ray=ray_accelerator_type(entry.name),
        sky=skypilot_accelerator(entry.name) if needs_sky else "",
    )


def plan_jobs(study: Study, spec: FleetSpec | None = None) -> list[FleetJob]:
    """Every (GPU type x arm) of the study with the Ray resources it asks for, in study order."""
    spec = spec or parse_fleet(study)
    if spec.num_gpus is not None:
        num_gpus = spec.num_gpus
    else:
        from quantrack.engines import get_adapter

        num_gpus = float(study.gpu.count) if get_adapter(study.engine.kind).install.needs_gpu else 0.0
    default_amount = 0.001 if spec.resource.startswith("accelerator_type:") else 1.0
    amount = spec.resource_amount if spec.resource_amount is not None else default_amount
    jobs: list[FleetJob] = []
    for gpu in spec.gpus or (None,):
        res = {resource_name(spec, gpu): amount} if gpu else {}
        for arm in study.arms:
            jobs.append(FleetJob(gpu=gpu, arm=arm, resources=res, num_gpus=num_gpus))
    return jobs


__all__ = ["FleetJob", "FleetSpec", "parse_fleet", "plan_jobs", "resource_name"]
