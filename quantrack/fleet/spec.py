"""The study file's ``[fleet]`` table, validated (``FleetSpec``): below the study schema, which checks ``[fleet]``
with it before anything starts, and below the rest of ``quantrack.fleet`` (the plan, Ray, SkyPilot). The keys are
described in ``quantrack/fleet/__init__.py`` and docs/fleet.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quantrack.errors import BadInput, did_you_mean

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


def fleet_spec(table: Mapping[str, Any], study_gpu: str, source: str | None) -> FleetSpec:
    """Validate a ``[fleet]`` table (``study_gpu``: the study's ``[gpu] name``, the default GPU type); every problem
    is one line naming the study file and key."""
    raw: dict[str, Any] = dict(table)
    src = source or "<study>"

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
    if not gpus and study_gpu.lower() != "auto":
        gpus = (study_gpu,)
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
