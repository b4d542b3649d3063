"""Fleet: one study's arms spread over many GPU nodes (Ray) or exported as cloud tasks (SkyPilot).

This package owns the study file's ``[fleet]`` table (validated here, not in ``quantrack.study``)
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
from typing import Any

from quantrack.arms import Arm
from quantrack.errors import BadInput, did_you_mean
from quantrack.study import Study

DEFAULT_RESOURCE = "accelerator_type:{ray}"
DEFAULT_SECRETS = ("MLFLOW_TRACKING_URI", "HF_TOKEN")
_KEYS = {"gpus", "resource", "resource_amount", "num_gpus", "gpu_override", "max_retries", "clouds", "regions",
         "any_of", "use_spot", "secrets", "install"}
_ANY_OF_KEYS = {"cloud", "region", "zone"}


@dataclass(frozen=True)
class FleetSpec:
    """The validated ``[fleet]`` table."""

    gpus: tuple[str, ...] = ()
    resource: str = DEFAULT_RESOURCE
    resource_amount: float | None = None  # None: 0.001 for accelerator_type (Ray's convention), else 1
    num_gpus: float | None = None
    gpu_override: str | None = None
    max_retries: int = 2
    clouds: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    any_of: tuple[dict[str, str], ...] = ()
    use_spot: bool = False
    secrets: tuple[str, ...] = DEFAULT_SECRETS
    install: str | None = None


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
    raw: dict[str, Any] = dict(study.fleet)
    src = study.source or "<study>"

    def bad(msg: str) -> BadInput:
        return BadInput(f"study file {src!r}: [fleet] {msg}")

    unknown = set(raw) - _KEYS
    if unknown:
        k = min(unknown)
        raise bad(f"unknown key {k!r}{did_you_mean(k, _KEYS)}; keys: {', '.join(sorted(_KEYS))}")

    def str_list(key: str) -> tuple[str, ...]:
        v = raw.get(key, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
            raise bad(f"{key} must be a list of non-empty strings")
        return tuple(x.strip() for x in v)

    gpus = str_list("gpus")
    if len({g.lower() for g in gpus}) != len(gpus):
        raise bad("gpus lists a GPU twice")
    if not gpus and study.gpu.name.lower() != "auto":
        gpus = (study.gpu.name,)
    resource = raw.get("resource", DEFAULT_RESOURCE)
    if not isinstance(resource, str) or not resource.strip():
        raise bad("resource must be a non-empty string such as 'gpu_type:{gpu}'")
    try:
        resource.format(gpu="x", name="x", ray="x", sky="x")
    except (KeyError, IndexError, ValueError) as exc:
        raise bad(f"resource {resource!r}: bad placeholder {exc}; use {{gpu}}, {{name}}, {{ray}} or {{sky}}") from None
    amount = raw.get("resource_amount")
    if amount is not None and (isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0):
        raise bad(f"resource_amount must be a positive number, got {amount!r}")
    num_gpus = raw.get("num_gpus")
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0):
        raise bad(f"num_gpus must be a number >= 0, got {num_gpus!r}")
    retries = raw.get("max_retries", 2)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        raise bad(f"max_retries must be an integer in 0..20, got {retries!r}")
    override = raw.get("gpu_override")
    if override is not None and (not isinstance(override, str) or not override.strip()):
        raise bad("gpu_override must be a GPU name")
    any_of_raw = raw.get("any_of", [])
    if not isinstance(any_of_raw, list) or not all(isinstance(x, dict) for x in any_of_raw):
        raise bad("any_of must be a list of tables like {cloud = \"aws\", region = \"us-east-1\"}")
    any_of: list[dict[str, str]] = []
    for i, cand in enumerate(any_of_raw, 1):
        extra = set(cand) - _ANY_OF_KEYS
        if extra:
            k = min(extra)
            raise bad(f"any_of #{i}: unknown key {k!r}{did_you_mean(k, _ANY_OF_KEYS)}")
        if not cand or not all(isinstance(v, str) and v for v in cand.values()):
            raise bad(f"any_of #{i} needs string values for cloud/region/zone")
        any_of.append({k: str(v) for k, v in cand.items()})
    use_spot = raw.get("use_spot", False)
    if not isinstance(use_spot, bool):
        raise bad("use_spot must be true or false")
    secrets = str_list("secrets") if "secrets" in raw else DEFAULT_SECRETS
    for s in secrets:
        if not s.replace("_", "").isalnum() or s[0].isdigit():
            raise bad(f"secrets: {s!r} is not an environment variable name")
    install = raw.get("install")
    if install is not None and (not isinstance(install, str) or not install.strip()):
        raise bad("install must be a pip requirement (e.g. 'quantrack==0.1.0') or a git URL")
    return FleetSpec(
        gpus=gpus, resource=resource.strip(), resource_amount=None if amount is None else float(amount),
        num_gpus=None if num_gpus is None else float(num_gpus), gpu_override=override.strip() if override else None,
        max_retries=retries, clouds=str_list("clouds"), regions=str_list("regions"), any_of=tuple(any_of),
        use_spot=use_spot, secrets=secrets, install=install.strip() if install else None,
    )


def resource_name(spec: FleetSpec, gpu: str) -> str:
    """The Ray resource a node must hold to run ``gpu``'s arms (placeholders filled)."""
    from quantrack.catalog import get_gpu
    from quantrack.fleet.skypilot import ray_accelerator_type, skypilot_accelerator

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
