"""Export a study as SkyPilot task YAMLs: one task per GPU type, secrets passed at launch.

For each GPU type of the study (``[fleet] gpus``, else ``[gpu] name``) this writes

* ``<study>-<gpu>.study.toml``: the study narrowed to that GPU, with ``[tracking] uri`` removed
  (the URI may carry credentials: it travels as the ``MLFLOW_TRACKING_URI`` secret instead), and every
  secret value left out: secret-named ``env`` entries (``HF_TOKEN``, ``WANDB_API_KEY``...) move to the
  task's ``secrets:`` by name, and an ``--api-key VALUE`` in ``args`` is dropped (the engine reads its key
  from the environment at launch); a final value-based redaction pass guards both files;
* ``<study>-<gpu>.sky.yaml``: ``resources.accelerators`` in SkyPilot's spelling, optional
  ``any_of`` clouds/regions, ``setup`` that pins quantrack and the engine, ``run`` that runs the
  narrowed study, and a ``secrets:`` section whose values are null (filled by
  ``sky launch --secret NAME``, never written to disk).

Launch from the export directory (``workdir: .`` uploads the study files)::

    cd DIR && sky launch -c qt-h100 <study>-h100.sky.yaml --secret MLFLOW_TRACKING_URI --secret HF_TOKEN
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.redact import (
    SECRET_FLAGS,
    is_secret_name,
    known_secrets,
    redact_argv,
    redact_text,
)
from quantrack.store.files import atomic_write_text
from quantrack.study import Study

# SkyPilot's accelerator names: skypilot-org/skypilot-catalog@03d79776:catalogs/v7/common/accelerators.csv
# (the file `sky` reads as common/accelerators.csv to canonicalize names). GPUs only.
SKYPILOT_ACCELERATORS = (
    "A10", "A100", "A100-80GB", "A100-80GB-SXM", "A10G", "A40", "A4000", "A6000", "B200", "GH200", "H100",
    "H100-MEGA", "H100-NVL", "H100-NVLINK", "H100-SXM", "H200", "H200-SXM", "K80", "L4", "L40", "L40S", "M60",
    "MI300X", "P100", "P4", "RTX3090", "RTX4090", "RTX5090", "RTX6000", "RTX6000-Ada", "RTXA6000", "T4", "T4g",
    "V100", "V100-32GB",
)
# Catalog spellings whose literal match would pick a one-provider SkyPilot name (H100-SXM exists only
# on RunPod in the file above); the multi-cloud name is what a user renting "an H100" means.
_PREFERRED = {
    "h100-sxm": "H100", "h100-sxm5": "H100", "h100": "H100", "h100-pcie": "H100",
    "h200-sxm": "H200", "h200": "H200",
    "a100-80gb": "A100-80GB", "a100-sxm4-80gb": "A100-80GB", "a100-80gb-sxm": "A100-80GB",
    "a100-pcie-80gb": "A100-80GB", "a100-40gb": "A100", "a100-sxm4-40gb": "A100", "a100": "A100",
    "v100-16gb": "V100", "v100-sxm2-16gb": "V100", "v100-32gb": "V100-32GB",
    "mi300x": "MI300X", "b200": "B200", "l40s": "L40S", "l4": "L4", "t4": "T4", "a10g": "A10G", "a10": "A10",
}


def _norm(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def skypilot_accelerator(gpu: str) -> str:
    """SkyPilot's name for a quantrack catalog GPU (unknown GPU: the catalog's did-you-mean error)."""
    from quantrack.hardware.catalog import get_gpu

    entry = get_gpu(gpu)
    names = [entry.name, *entry.aliases, gpu]
    for n in names:
        hit = _PREFERRED.get(_norm(n))
        if hit:
            return hit
    known = {_norm(a): a for a in SKYPILOT_ACCELERATORS}
    for n in names:
        hit = known.get(_norm(n))
        if hit:
            return hit
    raise BadInput(f"GPU {entry.name!r} has no SkyPilot accelerator name quantrack knows; "
                   f"SkyPilot names: {', '.join(SKYPILOT_ACCELERATORS)}")


def ray_accelerator_type(gpu: str) -> str:
    """The ``accelerator_type:<X>`` label Ray gives a node with this GPU.

    Ray derives it from the NVML name's model token ("NVIDIA A100-SXM4-80GB" -> "A100"), so 40 GB
    and 80 GB A100s share one label: use a custom resource (``[fleet] resource``) to tell them apart.
    Ray's rule is applied to the catalog's NVML-style alias when Ray is installed.
    """
    from quantrack.hardware.catalog import get_gpu

    entry = get_gpu(gpu)
    nvml = next((a for a in entry.aliases if a.startswith(("NVIDIA ", "Tesla "))), None)
    if nvml:
        try:
            from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
        except ImportError:
            pass
        else:
            label = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(nvml)
            if label:
                return str(label)
    return skypilot_accelerator(entry.name).split("-")[0]


@dataclass(frozen=True)
class ExportedTask:
    gpu: str  # catalog name
    accelerator: str  # SkyPilot spelling
    yaml_path: Path
    study_path: Path
    notes: tuple[str, ...] = ()


def engine_requirement(study: Study) -> str | None:
    """The pinned engine pip requirement, or None for llama.cpp (pinned by quantrack[cpu])."""
    from quantrack.engines import get_adapter

    kind, version = study.engine.kind, study.engine.version
    package = get_adapter(kind).install.pip_requirement
    if package is None:
        return None
    if not version:
        raise BadInput(f"study file {study.source!r}: [engine] version is required to export a {kind} study "
                       f"(nodes must run the same {kind}); e.g. version = \"0.11.0\"")
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
        raise BadInput(f"study file {study.source!r}: [engine] version {version!r} is not a version number")
    return f"{package}=={version}"


def _quantrack_requirement(study: Study, install: str | None) -> str:
    from quantrack import __version__

    if install:
        return install
    from quantrack.engines import get_adapter

    extra = get_adapter(study.engine.kind).install.quantrack_extra
    return f"quantrack{extra}=={__version__}"


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "x"


def export_skypilot(study: Study, out_dir: str | Path) -> list[ExportedTask]:
    """Write one SkyPilot task YAML (+ narrowed study file) per GPU type into ``out_dir``."""
    from quantrack.fleet.spec import fleet_spec
    from quantrack.hardware.catalog import get_gpu

    if not study.source or not Path(study.source).is_file():
        raise BadInput("export needs a study read from a file (load_study)")
    fleet = fleet_spec(study.fleet, study.gpu.name, study.source)
    if not fleet.gpus:
        raise BadInput(f"study file {study.source!r}: no GPU to export for; set [gpu] name or [fleet] gpus "
                       "(\"auto\" cannot be rented)")
    engine_req = engine_requirement(study)
    qt_req = _quantrack_requirement(study, fleet.install)
    raw = tomllib.loads(Path(study.source).read_text(encoding="utf-8"))
    hidden = _secret_values(raw)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {str(out)!r}: cannot create directory: {exc.strerror or exc}") from None
    tasks: list[ExportedTask] = []
    for gpu in fleet.gpus:
        entry = get_gpu(gpu)
        accel = skypilot_accelerator(gpu)
        notes: list[str] = []
        narrowed = _narrow_study(raw, entry.name, gpu, notes)
        moved = _strip_secrets(narrowed, notes)
        task_fleet = replace(fleet, secrets=tuple(dict.fromkeys([*fleet.secrets, *moved])))
        base = f"{_slug(study.name)}-{_slug(gpu)}"
        study_file = out / f"{base}.study.toml"
        yaml_file = out / f"{base}.sky.yaml"
        atomic_write_text(study_file, redact_text(toml_dumps(narrowed), hidden), flag="--out")
        task = _task_dict(study, task_fleet, accel, entry.name, study_file.name, qt_req, engine_req, base)
        atomic_write_text(yaml_file, redact_text(_yaml_dump(task), hidden), flag="--out")
        tasks.append(ExportedTask(gpu=entry.name, accelerator=accel, yaml_path=yaml_file, study_path=study_file,
                                  notes=tuple(notes)))
    return tasks


def _narrow_study(raw: dict[str, Any], gpu_name: str, as_written: str, notes: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(raw)
    data.setdefault("gpu", {})["name"] = gpu_name
    fleet = data.setdefault("fleet", {})
    fleet["gpus"] = [as_written]
    tracking = data.get("tracking")
    if isinstance(tracking, dict) and tracking.pop("uri", None) is not None:
        notes.append("[tracking] uri left out of the exported study: pass it with --secret MLFLOW_TRACKING_URI")
    return data


def _env_tables(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``env`` tables of a raw study: ``[engine] env`` and every arm's ``env``."""
    tables: list[dict[str, Any]] = []
    engine = data.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("env"), dict):
        tables.append(engine["env"])
    for arm in data.get("arm") or data.get("arms") or []:
        if isinstance(arm, dict) and isinstance(arm.get("env"), dict):
            tables.append(arm["env"])
    return tables


def _args_lists(data: dict[str, Any]) -> list[list[Any]]:
    lists: list[list[Any]] = []
    engine = data.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("args"), list):
        lists.append(engine["args"])
    for arm in data.get("arm") or data.get("arms") or []:
        if isinstance(arm, dict):
            for key in ("args", "engine_args"):
                if isinstance(arm.get(key), list):
                    lists.append(arm[key])
    return lists


def _secret_values(data: dict[str, Any]) -> list[str]:
    """Every secret value written in the study (env values by name, --api-key values, URL passwords)."""
    out: list[str] = [str(v) for t in _env_tables(data) for k, v in t.items() if is_secret_name(str(k)) and v]
    for args in _args_lists(data):
        redact_argv([str(a) for a in args])  # registers the values it hides
    out += sorted(known_secrets())
    return out


def _strip_secrets(data: dict[str, Any], notes: list[str]) -> list[str]:
    """Remove secret values from a raw study in place; returns env names to pass as SkyPilot secrets."""
    moved: list[str] = []
    for table in _env_tables(data):
        for name in [k for k in table if is_secret_name(str(k))]:
            table.pop(name)
            moved.append(str(name))
    for name in dict.fromkeys(moved):
        notes.append(f"env {name} left out of the exported study: passed with --secret {name}")
    for args in _args_lists(data):
        i = 0
        while i < len(args):
            a = str(args[i])
            flag = a.split("=", 1)[0]
            if flag.lower() in SECRET_FLAGS or (flag.startswith("--") and is_secret_name(flag)):
                drop = 1 if "=" in a or i + 1 >= len(args) else 2
                del args[i:i + drop]
                notes.append(f"engine argument {flag!r} (a secret) left out of the exported study: give the "
                             "engine its key through the environment at launch (--secret)")
                continue
            i += 1
    return list(dict.fromkeys(moved))


def _task_dict(study: Study, fleet: Any, accel: str, gpu_name: str, study_file: str, qt_req: str,
               engine_req: str | None, base: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"accelerators": f"{accel}:{study.gpu.count}"}
    if fleet.use_spot:
        resources["use_spot"] = True
    candidates: list[dict[str, str]] = [dict(c) for c in fleet.any_of]
    if not candidates and (fleet.clouds or fleet.regions):
        for cloud in fleet.clouds or (None,):
            for region in fleet.regions or (None,):
                cand = {k: v for k, v in (("cloud", cloud), ("region", region)) if v}
                candidates.append(cand)
    if len(candidates) == 1:
        resources.update(candidates[0])
    elif candidates:
        resources["any_of"] = candidates
    setup = ["set -euo pipefail", f"pip install {_shell_quote(qt_req)}"]
    if engine_req:
        setup.append(f"pip install {_shell_quote(engine_req)}")
    run = ["set -euo pipefail", f"quantrack run {_shell_quote(study_file)}"]
    return {
        "name": base,
        "resources": resources,
        "workdir": ".",
        "envs": {"QUANTRACK_STUDY": study_file, "QUANTRACK_GPU": gpu_name},
        "secrets": {name: None for name in fleet.secrets},
        "setup": "\n".join(setup) + "\n",
        "run": "\n".join(run) + "\n",
    }


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _yaml_dump(data: dict[str, Any]) -> str:
    import yaml  # type: ignore[import-untyped]

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    header = "# Generated by `quantrack export skypilot`. Secrets are null here: pass them with --secret NAME.\n"
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


# --- a small TOML writer for plain study data (tomllib reads; the stdlib has no writer) ---

def toml_dumps(data: dict[str, Any]) -> str:
    """Serialise a study-shaped dict (scalars, lists, tables, arrays of tables) as TOML."""
    lines: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and not _is_table_array(v)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in data.items() if _is_table_array(v)}
    for k, v in scalars.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in tables.items():
        lines.append("")
        lines.append(f"[{_key(k)}]")
        lines.extend(f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items())
    for k, items in arrays.items():
        for item in items:
            lines.append("")
            lines.append(f"[[{_key(k)}]]")
            lines.extend(f"{_key(kk)} = {_value(vv)}" for kk, vv in item.items())
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise BadInput(f"cannot write value {v!r} ({type(v).__name__}) to TOML")


__all__ = ["SKYPILOT_ACCELERATORS", "ExportedTask", "engine_requirement", "export_skypilot", "ray_accelerator_type",
           "skypilot_accelerator", "toml_dumps"]
