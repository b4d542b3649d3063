"""Which k/v scales an engine will use for a quantized KV cache, known before launch.

Owns the scale-source vocabulary (``ScaleSource``), reading what a Hugging Face checkpoint says about KV scales
(``config.json``'s ``quantization_config`` -- compressed-tensors ``kv_cache_scheme``, ModelOpt
``kv_cache_quant_algo`` -- ``hf_quant_config.json``, and the *headers* of its ``*.safetensors`` files: tensor names,
dtypes and shapes; never a weight byte), the rules, and what a plan is (``ScalePlan``: the scale source, the rule
id and message from ``rules/kv-scales.toml`` with the engine-code line it was read from, the log line that confirms
it after launch, and quantrack's own measurements that bear on it). Pure apart from reading the checkpoint's small
files; the engine's log side is ``quantrack.engines.kvscale``. The entry point, ``quantrack.engines.plan_scales(arm,
engine, ...)``, asks the engine's adapter; this module imports no adapter and no registry (the interface's types
come from here).

What each engine does with a KV dtype and a checkpoint is its adapter's (``EngineAdapter.plan_kv_scales``, given a
``KVScaleRequest``; the engine version its logic was read from is ``kv_scale_rules_version``): for another version
the plan says so (``version_note``) instead of claiming the same code. This module names no engine.
"""

from __future__ import annotations

import json
import struct
import tomllib
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput

RULES_FILE = "kv-scales.toml"
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header larger than this is not a header
UNQUANTIZED_KV = ("auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "")
GGUF_KV_QUANTIZED = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale", ".k_cache.scale", ".v_cache.scale")


class ScaleSource(StrEnum):
    """Where the scales of a quantized KV cache come from."""

    CHECKPOINT = "checkpoint"  # loaded from the checkpoint (or a scales file it names)
    COMPUTED = "computed-at-start"  # computed once by the engine from its first forward pass
    DYNAMIC_PER_TOKEN_HEAD = "dynamic-per-token-head"  # a scale per (token, head), written with the cache
    DYNAMIC_PER_BLOCK = "dynamic-per-block"  # llama.cpp q8_0/q4_0 KV: a scale per block of 32 values
    UNSCALED = "1.0"  # no scales: 1.0
    NOT_QUANTIZED = "not-quantized"  # the KV cache is bf16/fp16: nothing to scale
    REFUSED = "refused"  # the engine refuses this combination at start
    UNKNOWN = "unknown"  # quantrack cannot establish it (the plan says why)


# --------------------------------------------------------------------------------------------- the checkpoint


@dataclass(frozen=True)
class CheckpointKV:
    """What a checkpoint says about KV scales (read from config files and safetensors headers only)."""

    path: str
    read: bool  # False: not read (the reason is in ``note``)
    note: str = ""
    model_type: str | None = None
    quant_method: str | None = None  # config.json quantization_config.quant_method
    kv_cache_scheme: dict[str, Any] | None = None  # compressed-tensors
    modelopt_kv_algo: str | None = None  # ModelOpt kv_cache_quant_algo
    scale_tensors: int = 0  # k/v scale tensors in the safetensors headers
    scale_layout: str | None = None  # "per-tensor" | "per-head" | "mixed"
    scale_naming: str | None = None  # "self_attn.k_scale" | "k_proj.k_scale" | "kv_scale" | ...
    examples: tuple[str, ...] = ()
    files: int = 0

    @property
    def has_scales(self) -> bool:
        return self.scale_tensors > 0

    @property
    def declares_kv_quant(self) -> bool:
        return self.kv_cache_scheme is not None or bool(self.modelopt_kv_algo)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON); no tensor data is read."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise BadInput(f"{p}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER_BYTES:
                raise BadInput(f"{p}: not a safetensors file (header length {n:,})")
            raw = fh.read(n)
    except OSError as exc:
        raise BadInput(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) != n:
        raise BadInput(f"{p}: truncated safetensors header ({len(raw):,} of {n:,} bytes)")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadInput(f"{p}: safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise BadInput(f"{p}: safetensors header is not a JSON object")
    return header


def _naming(name: str) -> str:
    """The naming family of a scale tensor, spelled by its k member (ModelOpt ``k_proj.k_scale``,
    compressed-tensors ``self_attn.k_scale``, fused ``qkv_proj.k_scale``, legacy ``kv_scale``)."""
    if ".qkv_proj." in name:
        return "qkv_proj.k_scale"
    if ".k_proj." in name or ".v_proj." in name:
        return "k_proj.k_scale"
    if name.endswith(".kv_scale"):
        return "kv_scale"
    if name.endswith((".k_cache.scale", ".v_cache.scale")):
        return "k_cache.scale"
    tail = ".".join(name.split(".")[-2:])
    return tail.replace(".v_scale", ".k_scale")


def _load_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{p}: cannot read ({exc.strerror or exc})") from None
    except ValueError:
        raise BadInput(f"{p}: not valid JSON") from None
    if not isinstance(data, dict):
        raise BadInput(f"{p}: expected a JSON object")
    return data


def read_checkpoint(path: str | Path) -> CheckpointKV:
    """Read a local Hugging Face checkpoint directory: config files and safetensors headers only."""
    d = Path(path)
    if not d.is_dir():
        return CheckpointKV(path=str(path), read=False, note="not a local checkpoint directory (nothing read)")
    cfg_path = d / "config.json"
    cfg = _load_json(cfg_path) if cfg_path.is_file() else {}
    raw_qc = cfg.get("quantization_config")
    qc: dict[str, Any] = raw_qc if isinstance(raw_qc, dict) else {}
    scheme = qc.get("kv_cache_scheme") if isinstance(qc.get("kv_cache_scheme"), dict) else None
    algo = qc.get("kv_cache_quant_algo")
    hfq = d / "hf_quant_config.json"  # ModelOpt's own file: {"quantization": {"kv_cache_quant_algo": "FP8"}}
    if hfq.is_file():
        q = _load_json(hfq).get("quantization")
        if isinstance(q, dict) and q.get("kv_cache_quant_algo"):
            algo = q["kv_cache_quant_algo"]
    files = sorted(d.glob("*.safetensors"))
    names: list[str] = []
    layouts: set[str] = set()
    for f in files:
        for name, meta in safetensors_header(f).items():
            if name == "__metadata__" or not name.endswith(_SCALE_SUFFIXES):
                continue
            names.append(name)
            shape = meta.get("shape") if isinstance(meta, dict) else None
            numel = 1
            for s in shape or []:
                numel *= int(s)
            layouts.add("per-tensor" if numel <= 1 else "per-head")
    layout = None if not layouts else (layouts.pop() if len(layouts) == 1 else "mixed")
    namings = sorted({_naming(n) for n in names})
    return CheckpointKV(
        path=str(d), read=True, note="" if files else "no *.safetensors files in the directory",
        model_type=cfg.get("model_type"), quant_method=qc.get("quant_method") or None,
        kv_cache_scheme=scheme, modelopt_kv_algo=str(algo) if algo else None, scale_tensors=len(names),
        scale_layout=layout, scale_naming=", ".join(namings) or None, examples=tuple(sorted(names)[:2]),
        files=len(files),
    )


def export_checkpoint(ref: str) -> CheckpointKV:
    """A quantrack GGUF -> Hugging Face export that is not made yet: quantrack.hfexport writes bf16 weights, a
    config without quantization_config and no KV scale tensors, so what it holds is known before it exists."""
    return CheckpointKV(path=ref, read=True, note="quantrack's own bf16 export (quantrack.hfexport): no "
                        "quantization_config, no k/v scale tensors")


def checkpoint_for(served: str | None) -> CheckpointKV | None:
    """The checkpoint an arm serves: a local directory is read; a quantrack ``…:hf-bf16`` reference is an export
    with no scales; anything else (a Hub id, a GGUF file) is not read and says so."""
    if not served:
        return None
    from quantrack.models.ref import is_ref

    if is_ref(served) and served.lower().endswith(":hf-bf16"):
        return export_checkpoint(served)
    if served.lower().endswith(".gguf") or is_ref(served):
        return None
    p = Path(served)
    if p.is_dir():
        try:
            return read_checkpoint(p)
        except BadInput as exc:  # a damaged checkpoint: the plan says unknown and why, preflight goes on
            return CheckpointKV(path=served, read=False, note=f"not read: {exc}")
    return CheckpointKV(path=served, read=False, note="not a local directory (a Hub id?): its files were not read")


# ------------------------------------------------------------------------------------------------ the rules


@lru_cache(maxsize=1)
def load_rules(path: str | None = None) -> dict[str, Any]:
    """``rules/kv-scales.toml``, validated: every entry has an id, engine, message and source."""
    from quantrack.resources import rules_dir

    p = Path(path) if path else rules_dir() / RULES_FILE
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{p}: {exc}") from None
    problems = check_rules(data)
    if problems:
        raise BadInput(f"{p}: {problems[0]}")
    return data


def check_rules(data: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    valid = {s.value for s in ScaleSource}
    for e in data.get("kv_scale", []):
        for k in ("id", "engine", "scale_source", "message", "source"):
            if not e.get(k):
                problems.append(f"kv_scale {e.get('id', '?')!r} needs {k!r}")
        if e.get("scale_source") not in valid:
            problems.append(f"kv_scale {e.get('id')!r}: scale_source {e.get('scale_source')!r} is not one of "
                            f"{', '.join(sorted(valid))}")
        if e.get("id") in seen:
            problems.append(f"duplicate id {e.get('id')!r}")
        seen.add(e.get("id", ""))
    for e in data.get("measured", []):
        for k in ("id", "engine", "message", "store", "run_id", "figure", "source"):
            if not e.get(k):
                problems.append(f"measured {e.get('id', '?')!r} needs {k!r}")
    return problems


def rule(rule_id: str) -> dict[str, Any]:
    for e in load_rules()["kv_scale"]:
        if e["id"] == rule_id:
            return dict(e)
    raise KeyError(rule_id)


def measured_for(engine: str, kv: str, weights: str | None = None, rule_id: str | None = None,
                 *, rule_only: bool = False) -> list[dict[str, Any]]:
    """quantrack's own measurements that bear on a quantized-KV arm of this engine (and these weights, where the
    measurement names them). An entry with a ``rule`` key bears only on plans that rule decided; with
    ``rule_only`` only such entries are returned."""
    return [dict(e) for e in load_rules().get("measured", [])
            if e.get("engine") == engine and kv in e.get("kv", [])
            and (weights is None or not e.get("weights") or weights in e["weights"])
            and (e["rule"] == rule_id if e.get("rule") else not rule_only)]


# --------------------------------------------------------------------------------------------- the decision


@dataclass
class ScalePlan:
    """Which scales an arm's KV cache will use, why, and how the log will confirm it."""

    arm: str
    engine: str
    kv: str
    source: ScaleSource
    rule_id: str
    message: str
    engine_source: str  # repo@sha:path:Lnn
    log_line: str | None = None  # the engine line that confirms it after launch (None: the engine prints none)
    checkpoint: dict[str, Any] | None = None
    version_note: str | None = None
    measured: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["source"] = self.source.value
        return d

    def line(self) -> str:
        """One line for preflight's text view."""
        extra = f" ({self.version_note})" if self.version_note else ""
        return f"KV scales: {self.source.value} [{self.rule_id}] {self.message}{extra}; source {self.engine_source}"


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``args`` (None: not given)."""
    out = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith(flag + "="):
            out = a.split("=", 1)[1]
    return out


@dataclass(frozen=True)
class KVScaleRequest:
    """What an adapter's ``plan_kv_scales`` decides from: the arm, the engine's kind, the KV dtype asked for (a
    ``--kv-cache-dtype`` argument wins over the arm's ``kv``; lower case), every engine argument (the arm's, then the
    study's), the checkpoint as read (None: none given) and ``version_note`` (the engine's version is not the one its
    rules were read from)."""

    arm: Any
    engine: str
    kv: str
    args: tuple[str, ...] = ()
    checkpoint: CheckpointKV | None = None
    version_note: str | None = None

    @property
    def read_checkpoint(self) -> CheckpointKV | None:
        """The checkpoint when its files were read (None: none given, or not read)."""
        return self.checkpoint if self.checkpoint is not None and self.checkpoint.read else None

    def flag(self, flag: str) -> str | None:
        return flag_value(self.args, flag)

    def quantization_method(self) -> str | None:
        """The quantization method: a ``--quantization`` argument, else the arm's, else the checkpoint's config."""
        ck = self.read_checkpoint
        return self.flag("--quantization") or getattr(self.arm, "quantization", None) or \
            (ck.quant_method if ck else None)

    def checkpoint_note(self) -> str:
        """Why the checkpoint says nothing (for an ``unknown`` plan)."""
        ck = self.checkpoint
        if ck is None:
            return "no checkpoint given"
        return f"checkpoint {ck.path}: {ck.note or 'not read'}"

    def plan(self, rule_id: str, message_extra: str = "", *, kv: str | None = None,
             with_checkpoint: bool = True) -> ScalePlan:
        """The plan a rule of ``rules/kv-scales.toml`` decides (its scale source, message, engine-code source and
        confirming log line); ``kv``: the dtype the engine will use when it is not the one asked for."""
        r = rule(rule_id)
        msg = r["message"] + (f"; {message_extra}" if message_extra else "")
        ck = self.checkpoint if with_checkpoint else None
        return ScalePlan(arm=self.arm.name, engine=self.engine, kv=kv or self.kv,
                         source=ScaleSource(r["scale_source"]), rule_id=rule_id, message=msg,
                         engine_source=r["source"], log_line=r.get("log_line"),
                         checkpoint=ck.to_dict() if ck else None,
                         version_note=self.version_note if with_checkpoint else None)

    def unknown(self, rule_id: str, message: str, engine_source: str = "", log_line: str | None = None) -> ScalePlan:
        """An ``unknown`` plan and why (no rule decides it: the message says what is missing)."""
        return ScalePlan(arm=self.arm.name, engine=self.engine, kv=self.kv, source=ScaleSource.UNKNOWN,
                         rule_id=rule_id, message=message, engine_source=engine_source, log_line=log_line,
                         version_note=self.version_note)
