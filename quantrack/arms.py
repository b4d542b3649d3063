"""Arms: one configuration of the same model (weights format x KV-cache dtype x engine flags).

An arm says *what* is quantized, independent of the engine; engine adapters translate it
into flags (``--quantization``, ``--kv-cache-dtype`` ...). Weights and KV are separate
fields on purpose: conflating them is the seeds' most common methodological error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.settings import build, setting, settings

# The one table of GGUF types (llama.cpp; lower-case gguf.constants.GGMLQuantizationType names).
# Weights a GGUF file may carry. bf16 and mxfp4 are also the names of HF checkpoint formats, so "this arm
# is a GGUF file" is GGUF_ONLY_TYPES (what vLLM / SGLang must load through their GGUF path).
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_0", "q5_1", "q5_k", "q4_0", "q4_1", "q4_k", "iq4_nl",
              "mxfp4")
HF_WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8", "w4a16", "nvfp4", "mxfp4")
GGUF_ONLY_TYPES = tuple(t for t in GGUF_TYPES if t not in HF_WEIGHT_FORMATS)
# KV-cache types llama-server takes for --cache-type-k / --cache-type-v (llama.cpp common/arg.cpp kv_cache_types)
GGUF_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

# Weight formats quantrack models. Bytes per parameter are owned by quantrack.hardware.capacity.
WEIGHT_FORMATS = HF_WEIGHT_FORMATS + GGUF_ONLY_TYPES
# KV-cache dtypes quantrack models ("auto" = the model's activation dtype).
KV_DTYPES = (
    "auto", "bf16", "fp16", "fp32", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4",
    "fp8_per_token_head", "int8_per_token_head",  # vLLM: a scale per (token, head) computed at cache write
    *(t for t in GGUF_KV_TYPES if t != "bf16"),
)
WEIGHT_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "w8a8-fp8": "fp8", "fp8_w8a8": "fp8", "w8a8_fp8": "fp8", "w8a8-int8": "int8", "int8_w8a8": "int8",
    "w8a8_int8": "int8", "int4": "w4a16", "awq": "w4a16", "gptq": "w4a16", "4bit": "w4a16",
    "4-bit": "w4a16",
}
KV_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "fp8_e4m3fn": "fp8_e4m3",
}

# Built-in arms, named as a user would type them (`--arm fp8`).
PRESETS: dict[str, dict[str, Any]] = {
    "bf16": {"weights": "bf16", "kv": "auto"},
    "fp16": {"weights": "fp16", "kv": "auto"},
    "fp8": {"weights": "fp8", "kv": "auto", "quantization": "fp8"},
    "fp8-kv": {"weights": "fp8", "kv": "fp8", "quantization": "fp8"},
    "kv-fp8": {"weights": "bf16", "kv": "fp8"},
    "int8": {"weights": "int8", "kv": "auto", "quantization": "w8a8_int8"},
    "w4a16": {"weights": "w4a16", "kv": "auto"},
    "awq": {"weights": "w4a16", "kv": "auto", "quantization": "awq_marlin"},
    "gptq": {"weights": "w4a16", "kv": "auto", "quantization": "gptq_marlin"},
}
PRESET_ALIASES = {"fp8+fp8kv": "fp8-kv", "fp8kv": "fp8-kv", "fp8-fp8kv": "fp8-kv", "int4": "w4a16"}

_SPEC_KEYS = ("name", "weights", "kv", "quantization", "dtype", "model")


@dataclass(frozen=True)
class Arm:
    """One arm of a study."""

    name: str
    weights: str = "bf16"
    kv: str = "auto"
    quantization: str | None = None  # the engine's --quantization value, if any
    dtype: str = "auto"  # activation dtype (--dtype)
    model: str | None = None  # per-arm checkpoint / GGUF file (a 4-bit arm is another artifact)
    baseline: bool = False
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    notes: str = ""

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def kv_effective(self, model_dtype: str = "bf16") -> str:
        """The KV dtype actually stored: 'auto' resolves to the model's activation dtype."""
        if self.kv != "auto":
            return self.kv
        if self.dtype not in ("auto", ""):
            return normalize_kv(self.dtype)
        return model_dtype

    def label(self) -> str:
        """'<weights> / <kv> KV', the row label of the seeds' table."""
        return f"{self.weights} / {self.kv} KV"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "weights": self.weights, "kv": self.kv,
            "quantization": self.quantization, "dtype": self.dtype, "model": self.model,
            "baseline": self.baseline, "engine_args": list(self.engine_args),
            "env": dict(self.env), "notes": self.notes,
        }


def normalize_weights(value: str) -> str:
    v = value.strip().lower()
    v = WEIGHT_ALIASES.get(v, v)
    if v not in WEIGHT_FORMATS:
        raise BadInput(f"unknown weights format {value!r}{did_you_mean(v, WEIGHT_FORMATS)}; "
                       f"known: {', '.join(dict.fromkeys(WEIGHT_FORMATS))}")
    return v


def normalize_kv(value: str) -> str:
    v = value.strip().lower()
    v = KV_ALIASES.get(v, v)
    if v not in KV_DTYPES:
        raise BadInput(f"unknown KV-cache dtype {value!r}{did_you_mean(v, KV_DTYPES)}; "
                       f"known: {', '.join(KV_DTYPES)}")
    return v


def make_arm(
    name: str | None = None,
    *,
    weights: str = "bf16",
    kv: str = "auto",
    quantization: str | None = None,
    dtype: str = "auto",
    model: str | None = None,
    baseline: bool = False,
    engine_args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    notes: str = "",
) -> Arm:
    """Build a validated Arm (normalised spellings)."""
    w = normalize_weights(weights)
    k = normalize_kv(kv)
    if not isinstance(engine_args, (list, tuple)) or not all(isinstance(a, str) for a in engine_args):
        raise BadInput("arm 'args' must be a list of strings")
    if name is not None:
        from quantrack.names import check_name

        check_name(name, "arm name")  # server logs, eval records and plots are named by it
    env = env or {}
    if not isinstance(env, dict) or not all(isinstance(k_, str) and isinstance(v_, str) for k_, v_ in env.items()):
        raise BadInput("arm 'env' must map strings to strings")
    return Arm(
        name=name or default_name(w, k),
        weights=w, kv=k, quantization=quantization or None, dtype=dtype or "auto", model=model or None,
        baseline=baseline, engine_args=tuple(engine_args), env=tuple(sorted(env.items())), notes=notes,
    )


@settings
class ArmTable:
    """The keys of one ``[[arms]]`` table in a study file (types and help; spellings normalised by make_arm)."""

    name: str | None = setting(default=None, help="Arm name (default: <weights>, or <weights>-kv-<kv>).", nonempty=True)
    weights: str = setting(default="bf16", help="Weights format (bf16, fp8, int8, w4a16, GGUF types ...).", nonempty=True)
    kv: str = setting(default="auto", help="KV-cache dtype (auto = the model's activation dtype).", nonempty=True)
    quantization: str | None = setting(default=None, help="The engine's --quantization value.", nonempty=True)
    dtype: str = setting(default="auto", help="Activation dtype (--dtype).", nonempty=True)
    model: str | None = setting(default=None, help="This arm's checkpoint or GGUF file, when not [model] path; or a model reference (name:TYPE, file.gguf:TYPE).", nonempty=True)
    baseline: bool = setting(default=False, help="This arm is the baseline the others are compared with.")
    args: tuple[str, ...] = setting(default=(), help="Extra engine arguments for this arm, as a list of strings.")
    env: tuple[tuple[str, str], ...] = setting(default=(), help="Extra environment for this arm's engine process.")
    notes: str = setting(default="", help="Free text kept with the run.")


def arm_from_table(table: Any, where: str) -> Arm:
    """A validated Arm from one ``[[arms]]`` table; errors name the table (``[[arms]] #2 env: ...``)."""
    if isinstance(table, dict) and isinstance(table.get("name"), str) and table["name"]:
        from quantrack.names import shown_name

        where = f"{where} ({shown_name(table['name'])})"
    kw = build(ArmTable, table, where)
    try:
        return make_arm(kw.get("name"), weights=kw.get("weights", "bf16"), kv=kw.get("kv", "auto"),
                        quantization=kw.get("quantization"), dtype=kw.get("dtype", "auto"), model=kw.get("model"),
                        baseline=kw.get("baseline", False), engine_args=kw.get("args", ()),
                        env=dict(kw.get("env", ())), notes=kw.get("notes", ""))
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def default_name(weights: str, kv: str) -> str:
    return weights if kv == "auto" else f"{weights}-kv-{kv}"


def parse_arm_spec(spec: str) -> Arm:
    """Parse ``--arm`` values: a preset name (``fp8``) or ``weights=fp8,kv=fp8[,quantization=..][,name=..]``."""
    text = spec.strip()
    if not text:
        raise BadInput("empty --arm value")
    if "=" not in text:
        key = PRESET_ALIASES.get(text.lower(), text.lower())
        if key not in PRESETS:
            raise BadInput(f"unknown arm {spec!r}{did_you_mean(key, PRESETS)}; presets: {', '.join(PRESETS)}"
                           " (or weights=…,kv=…)")
        preset = PRESETS[key]
        return make_arm(key, weights=preset["weights"], kv=preset["kv"], quantization=preset.get("quantization"))
    fields: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise BadInput(f"bad --arm {spec!r}: {part!r} is not key=value")
        k, v = (s.strip() for s in part.split("=", 1))
        k = k.lower()
        if k == "kv_cache_dtype" or k == "kv-cache-dtype":
            k = "kv"
        if k not in _SPEC_KEYS:
            raise BadInput(f"bad --arm {spec!r}: unknown key {k!r}{did_you_mean(k, _SPEC_KEYS)}; "
                           f"keys: {', '.join(_SPEC_KEYS)}")
        fields[k] = v
    return make_arm(
        fields.get("name"), weights=fields.get("weights", "bf16"), kv=fields.get("kv", "auto"),
        quantization=fields.get("quantization"), dtype=fields.get("dtype", "auto"), model=fields.get("model"),
    )


def with_baseline(arms: list[Arm], baseline: str | None = None) -> list[Arm]:
    """Mark exactly one baseline: the named arm, else an arm flagged baseline, else the first."""
    if not arms:
        return arms
    if baseline is not None:
        names = [a.name for a in arms]
        if baseline not in names:
            raise BadInput(f"baseline arm {baseline!r} is not in the study{did_you_mean(baseline, names)}")
        return [replace(a, baseline=(a.name == baseline)) for a in arms]
    if any(a.baseline for a in arms):
        first = next(a.name for a in arms if a.baseline)
        return [replace(a, baseline=(a.name == first)) for a in arms]
    return [replace(a, baseline=(i == 0)) for i, a in enumerate(arms)]


def default_arms() -> list[Arm]:
    """The seeds' arms: bf16, FP8 weights, FP8 weights + FP8 KV, INT8 W8A8, 4-bit W4A16."""
    return with_baseline([parse_arm_spec(n) for n in ("bf16", "fp8", "fp8-kv", "int8", "w4a16")])


__all__ = [
    "KV_DTYPES",
    "PRESETS",
    "WEIGHT_FORMATS",
    "Arm",
    "ArmTable",
    "arm_from_table",
    "default_arms",
    "make_arm",
    "normalize_kv",
    "normalize_weights",
    "parse_arm_spec",
    "with_baseline",
]
