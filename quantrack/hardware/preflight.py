"""Preflight: every arm x every GPU through the rulebook, with derived capacity and the launch command.

Owns the one library call behind ``quantrack preflight`` (``run_preflight``) and the request it
takes (``PreflightRequest``, built from flags or from a study file by ``request_from_study``).
Nothing is measured here: verdicts come from rules, capacity is arithmetic (labelled derived),
GPU facts come from NVML (``--gpu auto``) or the catalog. For a study file the launch command is
built by ``engines.lifecycle.launch_spec_for_study``, the helper ``run`` serves with (binary, args,
env, slots, model), so preflight prints what ``run`` will start; model references (``smollm2:Q8_0``)
show their cached file, or the reference "(provisioned on first run)": preflight never downloads.
Optional pieces (capacity model, engine adapters) are imported lazily; when one is missing the
column is left out with a note, never guessed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.engines import DEFAULT_ENGINE, get_adapter
from quantrack.errors import BadInput, QuantrackError, unknown
from quantrack.hardware.catalog import GPU, ModelShape, get_gpu
from quantrack.hardware.rulebook import (
    ENGINES,
    UNCHECKED,
    StudyContext,
    Verdict,
    engine_flags,
    engine_table,
    evaluate,
    evaluate_study,
    facts_of,
    overall,
    parse_version,
)

EXIT_OK, EXIT_BAD_INPUT, EXIT_REJECTED = 0, 2, 3


@dataclass
class PreflightRequest:
    gpus: list[Any]  # catalog GPU or nvml.NodeGPU
    arms: list[Arm]
    engine: str = DEFAULT_ENGINE
    engine_version: str | None = None
    cuda: str | None = None  # CUDA the engine was built with
    mig: bool | None = None
    model: ModelShape | None = None
    model_path: str | None = None  # what the engine serves (HF id, dir, GGUF file)
    util: float | None = None
    context_len: int | None = None
    tp: int = 1
    eval_questions: int | None = None  # accuracy sample size, if the study runs one
    study_name: str | None = None
    study: Any = None  # the loaded Study (flags applied, model refs peeked): the launch line comes from it
    unprovisioned: tuple[str, ...] = ()  # model references not in the cache yet (run provisions them)
    kv_cache_memory_bytes: int | None = None  # vLLM's --kv-cache-memory-bytes (a study's: in its [engine] args)

    def validate(self) -> None:
        if self.engine not in ENGINES:
            raise unknown("engine", self.engine, ENGINES)
        if self.kv_cache_memory_bytes is not None and not get_adapter(self.engine).memory.profile_settings:
            raise BadInput(f"--kv-cache-memory-bytes is vLLM's setting (it replaces vLLM's memory profile); "
                           f"{self.engine} has no such flag")
        if not self.arms:
            raise BadInput("no arms: give --arm (repeatable) or --study FILE")
        if not self.gpus:
            raise BadInput("no GPU: give --gpu NAME or --gpu auto")
        if self.util is not None and not (0 < self.util <= 1):
            raise BadInput(f"--util must be in (0, 1], got {self.util}")
        if self.context_len is not None and self.context_len < 1:
            raise BadInput(f"--context-len must be >= 1, got {self.context_len}")
        if self.tp < 1:
            raise BadInput(f"--tp must be >= 1, got {self.tp}")
        if self.engine_version and get_adapter(self.engine).install.release_versions:
            parse_version(self.engine_version, "--engine-version")
        if self.cuda:
            parse_version(self.cuda, "--cuda")


@dataclass
class ArmPreflight:
    """One arm on one GPU: the rulebook's verdicts, the capacity plan and the launch line preflight prints."""

    gpu: str
    arm: str
    verdict: str
    reasons: list[Verdict]
    flags: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    capacity_note: str | None = None
    launch: list[str] | None = None  # secrets redacted
    launch_note: str | None = None
    launch_env: dict[str, str] = field(default_factory=dict)  # the engine's extra environment, secrets redacted
    model_ref: str | None = None  # a model reference not provisioned yet (it stands in the launch line)
    kv_scales: dict[str, Any] | None = None  # quantrack.engines.kvplan.ScalePlan.to_dict(): which KV scales, and why

    @property
    def launch_display(self) -> str | None:
        return shlex.join(self.launch) if self.launch else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "arm": self.arm, "verdict": self.verdict,
            "reasons": [v.to_dict() for v in self.reasons], "engine_flags": self.flags,
            "capacity": self.capacity, "capacity_note": self.capacity_note,
            "launch": self.launch, "launch_display": self.launch_display, "launch_note": self.launch_note,
            "launch_env": self.launch_env, "model_ref": self.model_ref, "kv_scales": self.kv_scales,
        }


@dataclass
class PreflightReport:
    engine: str
    engine_version: str
    version_assumed: bool
    cuda: str | None
    results: list[ArmPreflight]
    study: list[Verdict]
    notes: list[str] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # per device: NVML facts (measured) or catalog

    @property
    def verdict(self) -> str:
        return overall([*self.study, *(v for r in self.results for v in r.reasons)])

    def exit_code(self, strict: bool = False) -> int:
        worst = self.verdict
        if worst == "reject" or (strict and worst == "warn"):
            return EXIT_REJECTED
        return EXIT_OK

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "engine": self.engine, "engine_version": self.engine_version, "engine_version_assumed": self.version_assumed,
            "cuda": self.cuda, "verdict": self.verdict, "exit_code": self.exit_code(strict),
            "gpus": self.gpus, "results": [r.to_dict() for r in self.results],
            "study": [v.to_dict() for v in self.study], "notes": self.notes,
            "basis": {"verdicts": "rules (rules/rules-*.toml)", "capacity": "derived",
                      "gpus": "NVML (read on this node) or the GPU catalog, per entry's source"},
        }


def resolve_gpus(name: str) -> list[Any]:
    """``auto`` = every visible NVIDIA GPU (NVML); otherwise one catalog GPU by name or alias."""
    if name.strip().lower() == "auto":
        from quantrack.hardware.nvml import read_gpus

        found = read_gpus()
        if not found:
            from quantrack.errors import EnvironmentMissing
            from quantrack.hardware.nvml import NO_DRIVER

            raise EnvironmentMissing(NO_DRIVER)
        return list(found)
    return [get_gpu(name)]


def gpu_facts(gpu: Any, mig: bool | None = None) -> dict[str, Any]:
    """What preflight knows about one device: NVML's readings (``--gpu auto``) or the catalog entry."""
    if isinstance(gpu, GPU):
        cc = gpu.compute_capability
        return {"name": gpu.name, "source": "catalog", "catalog": gpu.name, "vendor": gpu.vendor,
                "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None, "memory_gib": gpu.memory_gib,
                "memory_mib": gpu.nvml_total_mib, "driver_version": None, "cuda_driver_version": None, "mig": mig}
    cc = gpu.compute_capability
    return {"index": gpu.index, "name": gpu.name, "source": "NVML", "catalog": gpu.gpu.name, "vendor": "nvidia",
            "in_catalog": gpu.in_catalog, "compute_capability": f"{cc[0]}.{cc[1]}",
            "memory_mib": int(gpu.memory_bytes // 2**20), "memory_gib": round(gpu.memory_bytes / 2**30, 2),
            "driver_version": gpu.driver_version, "cuda_driver_version": gpu.cuda_driver_version, "mig": gpu.mig}


def _catalog_gpu(gpu: Any) -> GPU:
    """The catalog GPU for capacity arithmetic; for an NVML device, with NVML's total memory."""
    if isinstance(gpu, GPU):
        return gpu
    base: GPU = gpu.gpu
    return replace(base, nvml_total_mib=int(gpu.memory_bytes // 2**20))


def _checkpoint_findings(req: PreflightRequest, arm: Arm) -> list[Any]:
    """A reject when the arm's weights are not what the Hub checkpoint stores (quantization_config)."""
    if req.model is None or getattr(req.model, "checkpoint", None) is None or arm.model:
        return []  # an arm with its own model file is not served from this checkpoint
    from quantrack.hardware.capacity import checkpoint_mismatch
    from quantrack.hardware.rulebook import Verdict

    problem = checkpoint_mismatch(req.model, arm)
    if not problem:
        return []
    fmt = req.model.checkpoint.weight_format if req.model.checkpoint else None
    return [Verdict("model-checkpoint-format", "reject", problem,
                    fix=f"serve this checkpoint with weights={fmt}" if fmt else "use an unquantized checkpoint",
                    source=f"{req.model.hf_id or req.model.name} config.json quantization_config")]


def _refused_scales(plan: dict[str, Any] | None) -> list[Any]:
    """A reject when the engine refuses the arm's KV dtype / scale combination at start (rules/kv-scales.toml
    entries with scale_source = "refused")."""
    if not plan or plan.get("source") != "refused":
        return []
    from quantrack.hardware.rulebook import Verdict

    return [Verdict(str(plan.get("rule_id")), "reject", str(plan.get("message")),
                    fix="choose another KV dtype or attention backend for this arm",
                    source=str(plan.get("engine_source")))]


def _capacity(req: PreflightRequest, gpu: GPU, arm: Arm) -> tuple[dict[str, Any] | None, str | None]:
    if req.model is None:
        return None, "no model given (--model/--config/--gguf/--params): capacity not derived"
    try:
        from quantrack.hardware.capacity import predict_for_arm
    except ImportError:
        return None, "capacity model (quantrack.hardware.capacity) not available"
    try:
        pred = predict_for_arm(req.model, gpu, arm, req.engine, util=req.util, context_len=req.context_len, tp=req.tp,
                               kv_cache_memory_bytes=_kv_cache_memory_bytes(req, arm))
    except QuantrackError as exc:
        return None, f"capacity not derived: {exc}"
    keep = ("naive_tokens", "engine_tokens", "engine_max_concurrency", "context_len", "fits", "naive_weights_gib",
            "engine_weights_gib", "engine_kv_gib", "engine_kv_mib", "kv_dtype", "basis")
    flat = pred.to_dict()
    return {k: flat[k] for k in keep if k in flat}, None


def _kv_cache_memory_bytes(req: PreflightRequest, arm: Arm) -> int | None:
    """vLLM's --kv-cache-memory-bytes: a study's from its launch args (arm args, then [engine] args, the last
    one winning; the flag next to --study is appended there), else the flag's."""
    from quantrack.hardware.capacity import kv_cache_memory_bytes_in

    if req.study is not None:
        return kv_cache_memory_bytes_in([*arm.engine_args, *req.study.engine.args])
    return req.kv_cache_memory_bytes


def _launch_spec(req: PreflightRequest, arm: Arm, adapter: Any) -> Any:
    """The LaunchSpec: a study's comes from the helper ``run`` serves with; flags build a plain one."""
    from quantrack.engines.base import LaunchSpec

    if req.study is not None:
        from quantrack.engines.lifecycle import launch_spec_for_study

        return launch_spec_for_study(req.study, arm, port=req.study.engine.port or adapter.serving.default_port)
    model = arm.model or req.model_path or (req.model.hf_id if req.model else None) or (req.model.name if req.model else None)
    if not model:
        raise BadInput("no model to serve (--model NAME, --config, --gguf or a study [model] path)")
    kvb = req.kv_cache_memory_bytes
    return LaunchSpec(model=model, arm=arm, context_len=req.context_len, util=req.util, tp=req.tp,
                      port=adapter.serving.default_port,
                      extra_args=() if kvb is None else ("--kv-cache-memory-bytes", str(kvb)))


def _launch(req: PreflightRequest, arm: Arm) -> tuple[list[str] | None, dict[str, str], str | None]:
    """(argv, env, note): the command that serves this arm, secrets redacted."""
    from quantrack.redact import redact_argv, redact_env, secret_values

    try:
        adapter = get_adapter(req.engine)
        spec = _launch_spec(req, arm, adapter)
        argv, env = list(adapter.launch_argv(spec)), dict(adapter.launch_env(spec))
    except QuantrackError as exc:
        return None, {}, f"launch command not built: {exc}"
    return redact_argv(argv, secret_values(env)), redact_env(env), None


def kv_scale_plan(req: PreflightRequest, arm: Arm) -> dict[str, Any] | None:
    """Which k/v scales the engine will use for this arm's KV cache (quantrack.engines.kvplan), from the checkpoint's
    config and safetensors headers (never its weights) and the arm; None when the engine has no such rules."""
    from quantrack.engines import plan_scales
    from quantrack.engines.kvplan import checkpoint_for

    served = arm.model or (req.study.model.path if req.study is not None else None) or req.model_path
    plan = plan_scales(arm, req.engine, engine_version=req.engine_version, checkpoint=checkpoint_for(served),
                       engine_args=tuple(req.study.engine.args) if req.study is not None else ())
    return plan.to_dict() if plan is not None else None


def _arm_model_ref(req: PreflightRequest, arm: Arm) -> str | None:
    """The unprovisioned model reference this arm serves, if any."""
    served = arm.model or (req.study.model.path or req.study.model.gguf if req.study is not None else None)
    return served if served in req.unprovisioned else None


def _kl_util_sum(req: PreflightRequest) -> float | None:
    """An engine that checks its memory share at start (vLLM) + a KL run in the study: the two servers' memory
    fractions on one GPU (the engine's default util where the study sets none)."""
    st = req.study
    adapter = get_adapter(req.engine)
    if st is None or not adapter.memory.start_checks_share or not any(st.kl_wanted(a) for a in st.arms):
        return None
    util = req.util if req.util is not None else adapter.memory.default_share
    if util is None:
        return None
    return round(util + (st.eval.kl_baseline_util if st.eval.kl_baseline_util is not None else util), 4)


# vLLM refuses a --max-model-len above the model's max_position_embeddings ("User-specified max_model_len (X) is
# greater than the derived max_model_len ...", vllm/config/model.py _get_and_verify_max_len, unless
# VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) and a context whose KV cache does not fit ("To serve at least one request with
# the models's max seq len (X), (Y GiB KV cache is needed, which is larger than the available KV cache memory",
# vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory); SGLang refuses a context_length above the model's
# unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (python/sglang/srt/configs/model_config.py); llama.cpp warns
# ("n_ctx_seq (%u) > n_ctx_train (%u)") and allocates the whole KV cache at start (engine-facts §1.4).
_CTX_SOURCE = ("vllm/config/model.py _get_and_verify_max_len; vllm/v1/core/kv_cache_utils.py "
               "check_enough_kv_cache_memory; sglang python/sglang/srt/configs/model_config.py; derived capacity "
               "(quantrack.hardware.capacity)")


def context_verdicts(req: PreflightRequest, cap: dict[str, Any] | None, gpu: GPU | None = None) -> list[Verdict]:
    """A context length the model or the memory cannot hold is rejected here, not after the engine has
    allocated ~20 GB and been OOM-killed: against the model's maximum, then against the derived KV capacity
    (vLLM/SGLang) or the KV cache llama.cpp allocates for the whole context against the device's memory (a CPU:
    this machine's RAM, measured)."""
    ctx = req.context_len
    if ctx is None or req.model is None:
        return []
    out: list[Verdict] = []
    limit = req.model.max_context
    if limit and ctx > limit:
        strict = get_adapter(req.engine).serving.refuses_context_over_max
        out.append(Verdict(
            "context-exceeds-model", "reject" if strict else "warn",
            f"context {ctx:,} is above {req.model.name}'s maximum of {limit:,} tokens"
            + ("" if strict else " (llama.cpp runs it, past the positions the model was trained on)"),
            fix=f"--context-len {limit} (or less); [study] context_len = {limit}", source=_CTX_SOURCE))
    if cap is None:
        return out
    tokens = cap.get("engine_tokens")
    if get_adapter(req.engine).memory.full_context_kv:
        kv_mib = cap.get("engine_kv_mib")
        memory, what = _memory_of(gpu)
        if kv_mib is not None and memory and kv_mib * 2**20 > memory:
            out.append(Verdict(
                "context-exceeds-memory", "reject",
                f"llama.cpp allocates the KV cache of the whole context at start: {kv_mib:,.0f} MiB for {ctx:,} "
                f"tokens (derived) is more than the {memory / 2**30:,.1f} GiB of {what}",
                fix="lower the context length (-c), or use a quantized KV cache (q8_0)", source=_CTX_SOURCE))
        return out
    if tokens is not None and tokens < ctx:
        out.append(Verdict(
            "context-exceeds-kv", "reject",
            f"one request of {ctx:,} tokens needs more KV cache than fits: {tokens:,} tokens after the weights "
            f"(derived, util {req.util if req.util is not None else 'default'}, TP {req.tp})",
            fix="lower the context length, raise util, use an FP8 KV cache or more GPUs (--tp)", source=_CTX_SOURCE))
    return out


def arm_context_verdicts(req: PreflightRequest, gpu: GPU, arm: Arm) -> list[Verdict]:
    """``context_verdicts`` for one arm with its derived capacity: what `quantrack preflight` checks, for
    `quantrack run`'s preflight step."""
    return context_verdicts(req, _capacity(req, gpu, arm)[0], gpu)


def _memory_of(gpu: GPU | None) -> tuple[float, str]:
    """The memory a server's KV cache must fit in: the GPU's, or for a CPU this machine's RAM (measured)."""
    import os

    if gpu is None:
        return 0.0, ""
    if gpu.vendor != "cpu":
        return float(gpu.total_bytes), f"{gpu.name} memory"
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "this machine's RAM"
    except (ValueError, OSError, AttributeError):
        return 0.0, ""


def run_preflight(req: PreflightRequest) -> PreflightReport:
    """Evaluate every arm on every GPU; derived capacity and the launch command for runnable arms."""
    req.validate()
    table = engine_table(req.engine, req.engine_version)
    assumed = req.engine_version is None
    version = req.engine_version or str(table["assumed_version"])
    ctx = StudyContext(arms=tuple(req.arms), eval_questions=req.eval_questions,
                       model_params=req.model.params if req.model else None, tp=req.tp,
                       engine_env=tuple(req.study.engine.env) if req.study is not None else (),
                       kl_util_sum=_kl_util_sum(req))
    notes: list[str] = []
    if assumed and get_adapter(req.engine).install.release_versions:
        notes.append(f"--engine-version not given: rules assume {req.engine} {version}, the version the facts were read from")
    if req.cuda is None and get_adapter(req.engine).install.cuda_gated and any(
            _catalog_gpu(g).vendor == "nvidia" for g in req.gpus):  # CUDA gates are about NVIDIA GPUs only
        notes.append("--cuda not given: gates on the CUDA the engine was built with are reported as unchecked")
    if req.study is not None and not req.study.engine.port:
        notes.append(f"[engine] port = 0: run picks a free port at start; launch lines show {req.engine}'s "
                     f"default port {get_adapter(req.engine).serving.default_port}")
    for ref in req.unprovisioned:
        notes.append(f"model {ref} is not in the cache yet: run provisions it on first use (preflight "
                     "never downloads)")
    results: list[ArmPreflight] = []
    for gpu in req.gpus:
        facts = facts_of(gpu)
        cuda_driver = getattr(gpu, "cuda_driver_version", None)
        if cuda_driver:
            notes.append(f"{facts.name}: driver supports CUDA {cuda_driver} (not the CUDA the engine was built with)")
        label = facts.name if not hasattr(gpu, "index") else f"{gpu.index}:{facts.name}"
        for arm in req.arms:
            cap, cap_note = _capacity(req, _catalog_gpu(gpu), arm)
            scales = kv_scale_plan(req, arm)
            verdicts = [*evaluate(gpu, arm, req.engine, req.engine_version, req.cuda, req.mig, ctx),
                        *_checkpoint_findings(req, arm), *context_verdicts(req, cap, _catalog_gpu(gpu)),
                        *_refused_scales(scales)]
            if scales and scales.get("source") in ("checkpoint", "computed-at-start"):
                # the checkpoint's headers carry k/v scales, or vLLM computes them at start: not 1.0
                verdicts = [v for v in verdicts if v.rule_id != "vllm-fp8-kv-uncalibrated"]
            verdict = overall(verdicts)
            try:
                flags = engine_flags(req.engine, arm, req.engine_version)
            except QuantrackError:
                flags = {}  # the rule verdicts already say why
            launch: list[str] | None = None
            env: dict[str, str] = {}
            if verdict == "reject":
                launch_note: str | None = "not runnable: no launch command"
            else:
                launch, env, launch_note = _launch(req, arm)
            results.append(ArmPreflight(gpu=label, arm=arm.name, verdict=verdict, reasons=verdicts, flags=flags,
                                     capacity=cap, capacity_note=cap_note, launch=launch, launch_note=launch_note,
                                     launch_env=env, model_ref=_arm_model_ref(req, arm) if launch else None,
                                     kv_scales=scales))
    return PreflightReport(engine=req.engine, engine_version=version, version_assumed=assumed, cuda=req.cuda,
                           results=results, study=evaluate_study(ctx), notes=list(dict.fromkeys(notes)),
                           gpus=[gpu_facts(g, req.mig) for g in req.gpus])


def cached_model_ref(ref: str) -> Path | None:
    """The local file of a model reference if it is provisioned already, else None; never downloads.

    ``models_ref.cached_path`` (one file-naming rule with ``run``'s provisioning); a value that is not a
    reference gives None, an unknown reference raises models_ref's one-line BadInput."""
    from quantrack.models import ref as models_ref

    return models_ref.cached_path(ref) if models_ref.is_ref(ref) else None


def peek_model_refs(study: Any) -> tuple[Any, tuple[str, ...]]:
    """The study with every *provisioned* model reference replaced by its cached file, and the
    references that are not provisioned yet (left as they are: ``run`` provisions them)."""
    from quantrack.models.ref import is_ref

    missing: list[str] = []

    def local(value: str | None) -> str | None:
        if not is_ref(value):
            return value
        assert value is not None
        path = cached_model_ref(value)
        if path is None:
            missing.append(value)
            return value
        return str(path)

    arms = tuple(replace(a, model=local(a.model)) for a in study.arms)
    model = replace(study.model, path=local(study.model.path), gguf=local(study.model.gguf))
    return replace(study, arms=arms, model=model), tuple(dict.fromkeys(missing))


def _apply_overrides(study: Any, o: dict[str, Any]) -> Any:
    """Flags given next to --study change the study itself, so capacity and launch line agree."""
    engine = replace(study.engine, **{k: v for k, v in (("kind", o.get("engine")),
                                                         ("version", o.get("engine_version"))) if v is not None})
    if o.get("kv_cache_memory_bytes") is not None:  # launched with it, so the launch line and capacity agree
        engine = replace(engine, args=(*engine.args, "--kv-cache-memory-bytes", str(o["kv_cache_memory_bytes"])))
    gpu = replace(study.gpu, **{k: v for k, v in (("cuda", o.get("cuda")), ("util", o.get("util")),
                                                  ("count", o.get("tp"))) if v is not None})
    model = replace(study.model, path=o["model_path"]) if o.get("model_path") else study.model
    ctx = o.get("context_len") or study.context_len
    return replace(study, engine=engine, gpu=gpu, model=model, context_len=ctx)


def request_from_study(path: str, **overrides: Any) -> PreflightRequest:
    """A request from a study file; non-None ``overrides`` (from flags) win over the file."""
    from quantrack.models.ref import check_local_files
    from quantrack.study import load_study

    loaded = _apply_overrides(load_study(path), overrides)
    check_local_files(loaded)  # a GGUF file that is not there is refused, not allowed
    study, unprovisioned = peek_model_refs(loaded)
    model = None
    if study.model.name:
        from quantrack.models.hub import resolve_model

        model = resolve_model(study.model.name)
    elif study.model.config:
        from quantrack.models.hfconfig import load_hf_config

        model = load_hf_config(study.model.config)
    elif study.model.gguf and study.model.gguf not in unprovisioned:
        from quantrack.models.ggufmeta import load_gguf

        model = load_gguf(study.model.gguf)
    gpu_name = overrides.pop("gpu", None) or study.gpu.name
    from quantrack.accuracy.gsm8k import TASKS as GSM8K_TASKS

    fields: dict[str, Any] = {
        "gpus": resolve_gpus(gpu_name), "arms": list(study.arms), "engine": study.engine.kind,
        "engine_version": study.engine.version, "cuda": study.gpu.cuda, "model": model,
        "model_path": study.model.path or study.model.gguf, "util": study.gpu.util,
        "context_len": study.context_len, "tp": study.gpu.count,
        # the GSM8K sample-size rule speaks of GSM8K's 1,319 test questions: a task file's size is its own
        "eval_questions": study.eval.num_questions if study.eval.task in GSM8K_TASKS else None,
        "study_name": study.name,
        "study": study, "unprovisioned": unprovisioned,
    }
    fields.update({k: v for k, v in overrides.items()
                   if v is not None and k in ("mig", "model", "kv_cache_memory_bytes")})
    return PreflightRequest(**fields)


def summary_rows(report: PreflightReport) -> list[dict[str, Any]]:
    """One row per GPU x arm for the table view."""
    rows = []
    for r in report.results:
        cap = r.capacity or {}
        rules = [v.rule_id + ("?" if v.verdict == UNCHECKED else "") for v in r.reasons if v.verdict != "allow"]
        rows.append({"gpu": r.gpu, "arm": r.arm, "verdict": r.verdict.upper(),
                     "naive_tokens": cap.get("naive_tokens"), "engine_tokens": cap.get("engine_tokens"),
                     "kv_scales": (r.kv_scales or {}).get("source") or "-",
                     "rules": ", ".join(rules) or "-"})
    return rows
