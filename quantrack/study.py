"""The study file (TOML): one model, one engine, one GPU, several arms, and how to measure them.

Every command that takes a study (``preflight``, ``run``, ``export skypilot``) reads it through
``load_study``; unknown keys and bad values are one-line errors naming the file.

Example::

    name = "llama3-8b-h100"
    [model]
    name = "Llama-3-8B"                 # catalog entry (shapes for capacity), or
    path = "meta-llama/Meta-Llama-3-8B-Instruct"   # what the engine loads
    [engine]
    kind = "vllm"                       # vllm | sglang | llamacpp
    [gpu]
    name = "H100"                       # catalog name, or "auto" (NVML on the node)
    [[arms]]
    name = "bf16"
    weights = "bf16"
    [[arms]]
    name = "fp8"
    weights = "fp8"
    quantization = "fp8"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack.arms import Arm, make_arm, with_baseline
from quantrack.errors import BadInput, did_you_mean

ENGINES = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class ModelSpec:
    name: str | None = None  # model catalog entry
    path: str | None = None  # what the engine serves (HF id, local dir, GGUF file)
    config: str | None = None  # HF config.json for shapes
    gguf: str | None = None  # GGUF file for shapes (llama.cpp)
    revision: str | None = None
    served_name: str | None = None
    tokenizer: str | None = None


@dataclass(frozen=True)
class EngineSpec:
    kind: str = "vllm"
    version: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    ready_timeout_s: float = 900.0
    # seconds one request to the engine may take (read; connect 10 s); 0 = each step's own default
    # (latency 60, sweep 300, eval 600, kl 300)
    request_timeout_s: float = 0.0
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    binary: str | None = None  # e.g. path to llama-server / python for vllm


@dataclass(frozen=True)
class GpuSpec:
    name: str = "auto"  # catalog name or "auto"
    count: int = 1  # tensor parallel size
    util: float = 0.92  # vLLM gpu_memory_utilization / SGLang mem_fraction_static if set
    cuda: str | None = None  # CUDA version the engine was built with
    overhead_gib: float = 0.0


@dataclass(frozen=True)
class LatencySpec:
    input_tokens: int = 1024
    output_tokens: int = 128
    warmup: int = 10
    iterations: int = 30
    chat: bool = False


@dataclass(frozen=True)
class SweepSpec:
    concurrency: tuple[int, ...] = ()
    requests_per_level: int = 0  # 0 = 4 x concurrency (at least 8)
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True)
class EvalSpec:
    task: str | None = None  # "gsm8k" or None (no eval)
    num_questions: int = 1319
    num_shots: int = 5
    max_tokens: int = 256
    concurrency: int = 8
    seed: int = 42
    style: str = "vllm"
    kl_tokens: int = 0  # 0 = no KL fidelity run
    kl_top_k: int = 20
    kl_arms: tuple[str, ...] = ()  # arms scored against the baseline; () = every non-baseline arm
    # --gpu-memory-utilization / --mem-fraction-static of the KL baseline server, which runs beside the candidate
    # on the same GPU (None = [gpu] util): on a GPU both must fit, e.g. 0.45 each.
    kl_baseline_util: float | None = None


@dataclass(frozen=True)
class TrackingSpec:
    uri: str | None = None  # default: sqlite store under ./mlruns
    experiment: str | None = None  # default: the study name


@dataclass(frozen=True)
class Study:
    name: str
    model: ModelSpec
    engine: EngineSpec
    gpu: GpuSpec
    arms: tuple[Arm, ...]
    context_len: int = 4096  # --max-model-len / llama.cpp -c
    parallel: int = 1  # llama.cpp -np (slots)
    latency: LatencySpec = field(default_factory=LatencySpec)
    sweep: SweepSpec = field(default_factory=SweepSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    fleet: dict[str, Any] = field(default_factory=dict)  # issue: fleet (Ray/SkyPilot); validated there
    description: str = ""
    source: str | None = None  # the file it was read from

    @property
    def baseline(self) -> Arm:
        return next(a for a in self.arms if a.baseline)

    def kl_wanted(self, arm: Arm) -> bool:
        """Whether ``arm`` gets a KL / top-1 run against the baseline ([eval] kl; the baseline itself only when
        ``kl.arms`` names it: a self-check whose expected result is agreement 1.0, KL 0)."""
        if not self.eval.kl_tokens:
            return False
        if self.eval.kl_arms:
            return arm.name in self.eval.kl_arms
        return not arm.baseline

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        names = [a.name for a in self.arms]
        raise BadInput(f"no arm {name!r} in study {self.name!r}{did_you_mean(name, names)}; arms: {', '.join(names)}")


_TOP = {"name", "description", "model", "engine", "gpu", "arms", "context_len", "parallel", "latency",
        "sweep", "eval", "tracking", "fleet", "baseline"}
_SECTIONS: dict[str, type] = {
    "model": ModelSpec, "engine": EngineSpec, "gpu": GpuSpec, "latency": LatencySpec, "sweep": SweepSpec,
    "eval": EvalSpec, "tracking": TrackingSpec,
}
_ARM_KEYS = {"name", "weights", "kv", "quantization", "dtype", "model", "baseline", "args", "env", "notes"}


def load_study(path: str | Path) -> Study:
    """Read and validate a study file; every problem is a one-line BadInput naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read study file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"study file {str(p)!r} is not valid TOML: {exc}") from None
    return study_from_dict(data, source=str(p))


def study_from_dict(data: dict[str, Any], source: str = "<study>") -> Study:
    def bad(msg: str) -> BadInput:
        return BadInput(f"study file {source!r}: {msg}")

    unknown = set(data) - _TOP
    if unknown:
        k = min(unknown)
        raise bad(f"unknown key {k!r}{did_you_mean(k, _TOP)}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad("'name' (a non-empty string) is required")

    sections: dict[str, Any] = {}
    for key, cls in _SECTIONS.items():
        sec = data.get(key, {})
        if not isinstance(sec, dict):
            raise bad(f"[{key}] must be a table")
        sections[key] = _build(cls, sec, f"[{key}]", bad)

    engine: EngineSpec = sections["engine"]
    if engine.kind not in ENGINES:
        raise bad(f"[engine] kind {engine.kind!r} is unknown{did_you_mean(engine.kind, ENGINES)}; "
                  f"engines: {', '.join(ENGINES)}")
    if "request_timeout_s" in (data.get("engine") or {}):
        import math

        t = engine.request_timeout_s
        if not math.isfinite(t) or t <= 0:
            raise bad(f"[engine] request_timeout_s must be a finite number of seconds > 0, got {t!r}")
    gpu: GpuSpec = sections["gpu"]
    if not (0 < gpu.util <= 1):
        raise bad(f"[gpu] util must be in (0, 1], got {gpu.util}")
    if gpu.count < 1:
        raise bad(f"[gpu] count must be >= 1, got {gpu.count}")
    model: ModelSpec = sections["model"]
    if not (model.name or model.path or model.config or model.gguf):
        raise bad("[model] needs one of name, path, config or gguf")
    lat: LatencySpec = sections["latency"]
    if lat.input_tokens < 1 or lat.output_tokens < 2 or lat.iterations < 1 or lat.warmup < 0:
        raise bad("[latency] needs input_tokens >= 1, output_tokens >= 2, iterations >= 1, warmup >= 0")
    sweep: SweepSpec = sections["sweep"]
    if any(c < 1 for c in sweep.concurrency):
        raise bad("[sweep] concurrency levels must be >= 1")

    arms_raw = data.get("arms")
    if not isinstance(arms_raw, list) or not arms_raw:
        raise bad("at least one [[arms]] table is required")
    arms: list[Arm] = []
    for i, a in enumerate(arms_raw):
        if not isinstance(a, dict):
            raise bad(f"[[arms]] #{i + 1} must be a table")
        extra = set(a) - _ARM_KEYS
        if extra:
            k = min(extra)
            raise bad(f"[[arms]] #{i + 1}: unknown key {k!r}{did_you_mean(k, _ARM_KEYS)}")
        try:
            arms.append(make_arm(
                a.get("name"), weights=a.get("weights", "bf16"), kv=a.get("kv", "auto"),
                quantization=a.get("quantization"), dtype=a.get("dtype", "auto"), model=a.get("model"),
                baseline=bool(a.get("baseline", False)), engine_args=a.get("args", []),
                env=a.get("env", {}), notes=a.get("notes", ""),
            ))
        except BadInput as exc:
            raise bad(f"[[arms]] #{i + 1}: {exc}") from None
    names = [a.name for a in arms]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise bad(f"duplicate arm name {min(dup)!r}")
    try:
        arms = with_baseline(arms, data.get("baseline"))
    except BadInput as exc:
        raise bad(str(exc)) from None

    unknown_kl = [n for n in sections["eval"].kl_arms if n not in names]
    if unknown_kl:
        raise bad(f"[eval] kl.arms: no arm {unknown_kl[0]!r}{did_you_mean(unknown_kl[0], names)}; "
                  f"arms: {', '.join(names)}")

    ctx = data.get("context_len", 4096)
    par = data.get("parallel", 1)
    if not isinstance(ctx, int) or ctx < 1:
        raise bad(f"context_len must be a positive integer, got {ctx!r}")
    if not isinstance(par, int) or par < 1:
        raise bad(f"parallel must be a positive integer, got {par!r}")
    fleet = data.get("fleet", {})
    if not isinstance(fleet, dict):
        raise bad("[fleet] must be a table")
    return Study(
        name=name.strip(), description=str(data.get("description", "")), model=model, engine=engine, gpu=gpu,
        arms=tuple(arms), context_len=ctx, parallel=par, latency=lat, sweep=sweep, eval=sections["eval"],
        tracking=sections["tracking"], fleet=fleet, source=source,
    )


_KL_KEYS = {"tokens": "kl_tokens", "top_k": "kl_top_k", "arms": "kl_arms", "baseline_util": "kl_baseline_util"}


def _kl_table(kl: Any, where: str, bad: Any) -> dict[str, Any]:
    """``kl = { tokens, top_k, arms, baseline_util }`` -> EvalSpec fields, each checked."""
    if not isinstance(kl, dict):
        raise bad(f"{where} kl must be a table like {{ tokens = 2000, top_k = 20 }}")
    out: dict[str, Any] = {}
    for k, v in kl.items():
        if k not in _KL_KEYS:
            raise bad(f"{where} kl: unknown key {k!r}{did_you_mean(k, _KL_KEYS)}")
        if k in ("tokens", "top_k") and (not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "tokens" else 1)):
            raise bad(f"{where} kl.{k} must be a {'non-negative' if k == 'tokens' else 'positive'} integer, got {v!r}")
        if k == "arms" and (not isinstance(v, list) or not all(isinstance(a, str) and a for a in v)):
            raise bad(f"{where} kl.arms must be a list of arm names, got {v!r}")
        if k == "baseline_util" and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1):
            raise bad(f"{where} kl.baseline_util must be a fraction in (0, 1], got {v!r}")
        out[_KL_KEYS[k]] = tuple(v) if k == "arms" else float(v) if k == "baseline_util" else v
    return out


def _build(cls: type, sec: dict[str, Any], where: str, bad: Any) -> Any:
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(cls)}
    # friendly spellings
    sec = dict(sec)
    kwargs: dict[str, Any] = {}
    if cls is EvalSpec and "kl" in sec:
        kwargs.update(_kl_table(sec.pop("kl"), where, bad))  # checked there, typed as the fields want
    for k, v in sec.items():
        if k.startswith("kl_") and k in kwargs:
            raise bad(f"{where} {k} given twice (also in the kl table)")
        if k in ("kl_arms", "kl_baseline_util"):
            kwargs.update(_kl_table({k[3:]: v}, where, bad))
            continue
        if k not in fields:
            raise bad(f"{where} unknown key {k!r}{did_you_mean(k, fields)}")
        default = fields[k].default
        if isinstance(default, tuple):
            if k == "env":
                if not isinstance(v, dict):
                    raise bad(f"{where} {k} must be a table of strings")
                v = tuple(sorted((str(a), str(b)) for a, b in v.items()))
            else:
                if not isinstance(v, list):
                    raise bad(f"{where} {k} must be a list")
                v = tuple(v)
        elif isinstance(default, bool):
            if not isinstance(v, bool):
                raise bad(f"{where} {k} must be true or false")
        elif isinstance(default, float):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise bad(f"{where} {k} must be a number")
            v = float(v)
        elif isinstance(default, int):
            if not isinstance(v, int) or isinstance(v, bool):
                raise bad(f"{where} {k} must be an integer")
        elif v is not None and not isinstance(v, str):
            raise bad(f"{where} {k} must be a string")
        kwargs[k] = v
    return cls(**kwargs)
