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
import math
import os
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
MAX_JSON_BYTES = 64 * 2**20  # config.json / hf_quant_config.json are a few KiB
MAX_JSON_DEPTH = 64  # real configs nest about 6 deep
MAX_SAFETENSORS_FILES = 4096  # the largest public checkpoints have a few hundred shards
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


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is not finite")
    return v


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests no deeper than ``limit`` (iterative: a deep value cannot exhaust the stack here)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def _parse_json(raw: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a checkpoint file: finite numbers only (``1e400``, ``NaN`` refused), nesting at most
    MAX_JSON_DEPTH, integers the interpreter converts (at most 4,300 digits); every refusal one line naming it."""
    try:
        data = json.loads(raw, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise BadInput(f"{what} is not usable JSON (nested too deeply)") from None
    except UnicodeDecodeError:
        raise BadInput(f"{what} is not JSON (not UTF-8 text)") from None
    except ValueError as exc:
        reason = str(exc).split(": line ")[0] if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0]
        raise BadInput(f"{what} is not usable JSON ({reason})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{what}: expected a JSON object, found {type(data).__name__}")
    if not _depth_ok(data):
        raise BadInput(f"{what} is not usable JSON (nested deeper than {MAX_JSON_DEPTH} levels)")
    return data


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON); no tensor data is read.
    Only a regular file is opened (a FIFO never blocks, a device is refused); the length is bounded."""
    from quantrack.store.files import open_regular_read

    p = Path(path)
    with open_regular_read(p) as fh:
        try:
            head = fh.read(8)
            if len(head) != 8:
                raise BadInput(f"{p}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER_BYTES:
                raise BadInput(f"{p}: not a safetensors file (header length {n:,}; at most "
                               f"{MAX_HEADER_BYTES:,} is read)")
            raw = fh.read(n)
        except OSError as exc:
            raise BadInput(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) != n:
        raise BadInput(f"{p}: truncated safetensors header ({len(raw):,} of {n:,} bytes)")
    return _parse_json(raw, f"{p}: safetensors header")


def _scale_numel(name: str, meta: Any, where: Path) -> int:
    """The element count of a scale tensor from its header entry: the shape must be a list of non-negative
    integers (a string, null, a float such as 1e400 or a negative size is not a shape)."""
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise BadInput(f"{where}: tensor {name[:120]!r} has shape {json.dumps(shape)[:60]}, not a list of "
                       "non-negative integers")
    numel = 1
    for s in shape:
        numel = min(numel * s, 2)  # only 0/1 (per-tensor) or more (per-head) matters
    return numel


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
    from quantrack.store.files import read_regular

    return _parse_json(read_regular(p, limit=MAX_JSON_BYTES), str(p))


def _text(value: Any, where: str) -> str | None:
    """A config value that must be a string (or absent)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadInput(f"{where} is {type(value).__name__} {json.dumps(value)[:40]}, not a string")
    return value


def _present(p: Path) -> bool:
    """Whether a config file is there to read: anything at the name (a FIFO, a folder or a dangling link is read
    and refused, not taken for an absent file, which would make the plan a silent 'no quantization')."""
    return os.path.lexists(p)


def read_checkpoint(path: str | Path) -> CheckpointKV:
    """Read a local Hugging Face checkpoint directory: config files and safetensors headers only, each a regular
    file of bounded size with finite numbers and bounded nesting; anything else is BadInput (one line)."""
    d = Path(path)
    if not d.is_dir():
        return CheckpointKV(path=str(path), read=False, note="not a local checkpoint directory (nothing read)")
    cfg_path = d / "config.json"
    cfg = _load_json(cfg_path) if _present(cfg_path) else {}
    raw_qc = cfg.get("quantization_config")
    if raw_qc is not None and not isinstance(raw_qc, dict):
        raise BadInput(f"{cfg_path}: quantization_config is {type(raw_qc).__name__}, not an object")
    qc: dict[str, Any] = raw_qc or {}
    scheme = qc.get("kv_cache_scheme")
    if scheme is not None and not isinstance(scheme, dict):
        raise BadInput(f"{cfg_path}: quantization_config.kv_cache_scheme is {type(scheme).__name__}, not an object")
    algo = _text(qc.get("kv_cache_quant_algo"), f"{cfg_path}: quantization_config.kv_cache_quant_algo")
    hfq = d / "hf_quant_config.json"  # ModelOpt's own file: {"quantization": {"kv_cache_quant_algo": "FP8"}}
    if _present(hfq):
        q = _load_json(hfq).get("quantization")
        if isinstance(q, dict):
            algo = _text(q.get("kv_cache_quant_algo"), f"{hfq}: quantization.kv_cache_quant_algo") or algo
    files = sorted(d.glob("*.safetensors"))
    if len(files) > MAX_SAFETENSORS_FILES:
        raise BadInput(f"{d}: {len(files):,} *.safetensors files (more than {MAX_SAFETENSORS_FILES:,} are not read)")
    names: list[str] = []
    layouts: set[str] = set()
    for f in files:
        for name, meta in safetensors_header(f).items():
            if name == "__metadata__" or not name.endswith(_SCALE_SUFFIXES):
                continue
            names.append(name)
            layouts.add("per-tensor" if _scale_numel(name, meta, f) <= 1 else "per-head")
    layout = None if not layouts else (layouts.pop() if len(layouts) == 1 else "mixed")
    namings = sorted({_naming(n) for n in names})
    return CheckpointKV(
        path=str(d), read=True, note="" if files else "no *.safetensors files in the directory",
        model_type=_text(cfg.get("model_type"), f"{cfg_path}: model_type"),
        quant_method=_text(qc.get("quant_method"), f"{cfg_path}: quantization_config.quant_method"),
        kv_cache_scheme=scheme, modelopt_kv_algo=algo, scale_tensors=len(names),
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
