"""The rulebook: GPU x format x engine facts as data (``rules/rules-*.toml``), validated and evaluated.

Owns loading and validating rule files, the per-engine spellings in ``rules/methods.toml``
(``engine_flags``), and the pure ``evaluate(gpu, arm, engine, ...) -> list[Verdict]``.
Nothing here touches a GPU or the network: NVML facts arrive as a ``NodeFacts`` value.

A rule matches when every key of its ``match`` table holds. ``match.env`` looks at the environment the
engine gets for the arm (``{VLLM_TEST_FORCE_FP8_MARLIN = true}``: set to 1/true, the values vLLM and SGLang
read as true; ``false``: not so set; a string: exactly that value). A key whose fact is unknown
(e.g. ``cuda_max`` without ``--cuda``) makes the rule *unchecked*: reported, never silently
passed, and it does not change the exit code.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantrack.arms import GGUF_TYPES, WEIGHT_FORMATS, Arm
from quantrack.engines import ENGINE_KINDS as ENGINES
from quantrack.errors import BadInput, did_you_mean, unknown
from quantrack.resources import rules_dir
from quantrack.run.schema import RuleVerdict

VERDICTS = tuple(v.value for v in RuleVerdict)  # allow, warn, reject (quantrack.run.schema.RuleVerdict)
UNCHECKED = "unchecked"
_RANK = {RuleVerdict.ALLOW: 0, UNCHECKED: 0, RuleVerdict.WARN: 1, RuleVerdict.REJECT: 2}
VENDORS = ("nvidia", "amd", "cpu")
ARCHES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "rdna3", "x86", "arm")

# GGUF tensor types (llama.cpp weights); the rule value "gguf" stands for any of them.
UNQUANTIZED = ("fp32", "bf16", "fp16", "f32", "f16")
UNQUANTIZED_KV = ("auto", "bf16", "fp16", "fp32", "f32", "f16")

# match key -> kind. Lists accept a string or a list of strings.
MATCH_KEYS: dict[str, str] = {
    "vendor": "list", "arch": "list", "cc_min": "int", "cc_max": "int", "engine": "list",
    "engine_version_min": "version", "engine_version_max": "version", "quantization": "list",
    "weights": "list", "kv": "list", "dtype": "list", "cuda_min": "version", "cuda_max": "version",
    "mig": "bool",
    # arm facts derived from the arm itself
    "flash_attn": "list",  # llama.cpp -fa/--flash-attn in the arm's args: on | off | auto (default)
    "kv_scales": "bool",  # the arm passes calibrated KV scales (--quantization-param-path)
    "arm_model": "bool",  # the arm has its own checkpoint (a different artifact from the study's)
    "quantized": "bool",  # weights or KV below 16 bits
    # study context
    "weights_share_max": "float",  # bf16 weights / GPU memory (per TP rank), derived
    "conflated": "bool",  # FP8 weights + FP8 KV in one arm, and no arm isolates either
    "eval_questions_max": "int",  # accuracy sample size (study-level)
    "kl_util_sum_min": "float",  # vLLM: candidate util + KL baseline util on one GPU (study-level)
    # the engine's environment for this arm (study [engine] env + the arm's env): {NAME = true|false|"value"}
    "env": "env",
    # the arm's engine args name one of these flags (``--calculate-kv-scales`` or ``--calculate-kv-scales=true``)
    "args": "list",
}
# How vLLM (envs.py: value.strip().lower() in ("1", "true")) and SGLang (get_bool_env_var) read a boolean variable.
_ENV_TRUE = ("1", "true")
STUDY_KEYS = frozenset({"eval_questions_max", "kl_util_sum_min"})
RULE_KEYS = frozenset({"id", "verdict", "message", "fix", "source", "match", "check", "log_lines", "notes",
                       "fallback"})
CHECKS = ("method-name", "method-min-capability", "kv-dtype")
_RANGES = (("cc_min", "cc_max"), ("engine_version_min", "engine_version_max"), ("cuda_min", "cuda_max"))
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_VERSION_RE = re.compile(r"^v?(\d+(?:\.\d+)*)")
_FACT_FLAGS = {"cuda_min": "--cuda", "cuda_max": "--cuda"}


@dataclass(frozen=True)
class Rule:
    id: str
    verdict: str
    message: str
    fix: str
    source: str
    match: dict[str, Any] = field(default_factory=dict)
    check: str | None = None
    log_lines: tuple[str, ...] = ()
    notes: str = ""
    file: str = ""
    # the fallback kind (LogReport.fallbacks' kind, e.g. fp8_marlin) the engine's own gates force when the rule
    # matches: the audit reads a matching node as fallen back even when its log shows no fallback line
    fallback: str = ""

    @property
    def study_level(self) -> bool:
        return bool(self.match) and set(self.match) <= STUDY_KEYS

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "verdict": self.verdict, "message": self.message, "fix": self.fix,
                "source": self.source, "match": dict(self.match), "check": self.check,
                "log_lines": list(self.log_lines), "notes": self.notes, "file": self.file,
                "fallback": self.fallback}


@dataclass(frozen=True)
class Verdict:
    rule_id: str
    verdict: str  # allow | warn | reject | unchecked
    message: str
    fix: str = ""
    source: str = ""
    log_lines: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule_id, "verdict": self.verdict, "message": self.message, "fix": self.fix,
                "source": self.source, "log_lines": list(self.log_lines)}


@dataclass(frozen=True)
class NodeFacts:
    """What the rules need to know about one device (from the catalog or from NVML)."""

    name: str
    vendor: str
    arch: str = ""
    cc: int | None = None  # major*10+minor, NVIDIA only
    memory_gib: float | None = None
    mig: bool | None = None
    cuda_driver: str | None = None  # the driver's CUDA version: NOT the CUDA the engine was built with


@dataclass(frozen=True)
class StudyContext:
    """The parts of a study the methodological rules look at."""

    arms: tuple[Arm, ...] = ()
    eval_questions: int | None = None  # None = no accuracy run
    model_params: float | None = None
    tp: int = 1
    engine_env: tuple[tuple[str, str], ...] = ()  # the study's [engine] env; an arm's own env wins over it
    # vLLM with a KL run: the candidate's --gpu-memory-utilization + the KL baseline's (None = no such run)
    kl_util_sum: float | None = None


# ---------------------------------------------------------------- versions and facts

def parse_version(text: str, what: str = "version") -> tuple[int, ...]:
    m = _VERSION_RE.match(str(text).strip())
    if not m:
        raise BadInput(f"bad {what} {text!r}: expected digits like 12.4 or 0.33.0")
    return tuple(int(p) for p in m.group(1).split("."))


def _cmp_prefix(actual: tuple[int, ...], bound: tuple[int, ...]) -> int:
    """Compare ``actual`` with ``bound`` at the bound's precision (12.3.2 vs 12.3 -> equal)."""
    a = (actual + (0,) * len(bound))[: len(bound)]
    return (a > bound) - (a < bound)


def arch_from_cc(cc: int | None) -> str:
    if cc is None:
        return ""
    if cc >= 100:
        return "blackwell"
    if cc >= 90:
        return "hopper"
    if cc == 89:
        return "ada"
    if cc >= 80:
        return "ampere"
    if cc >= 75:
        return "turing"
    if cc >= 70:
        return "volta"
    return "pre-volta"


def facts_of(gpu: Any) -> NodeFacts:
    """NodeFacts from a catalog GPU, an NVML NodeGPU (``to_facts``) or NodeFacts itself."""
    if isinstance(gpu, NodeFacts):
        return gpu
    if hasattr(gpu, "to_facts"):
        facts: NodeFacts = gpu.to_facts()
        return facts
    cc = getattr(gpu, "cc_int", None)
    return NodeFacts(name=gpu.name, vendor=gpu.vendor, arch=gpu.arch or arch_from_cc(cc), cc=cc,
                     memory_gib=getattr(gpu, "memory_gib", None))


def _flash_attn(arm: Arm) -> str:
    args = list(arm.engine_args)
    for i, a in enumerate(args):
        if a in ("-fa", "--flash-attn"):
            val = args[i + 1].lower() if i + 1 < len(args) and not args[i + 1].startswith("-") else "on"
            return {"1": "on", "true": "on", "0": "off", "false": "off"}.get(val, val)
        if a.startswith("--flash-attn="):
            return a.split("=", 1)[1].lower()
        if a in ("--no-flash-attn", "-nofa"):
            return "off"
    return "auto"


def effective_method(arm: Arm) -> str | None:
    """The --quantization name an arm implies: its own, else 'fp8' for FP8 weights (checkpoint or online)."""
    if arm.quantization:
        return arm.quantization.strip().lower()
    if arm.weights == "fp8":
        return "fp8"
    return None


def _is_quantized(arm: Arm) -> bool:
    return arm.weights not in UNQUANTIZED or arm.kv not in UNQUANTIZED_KV


def _conflated(arm: Arm, arms: Sequence[Arm]) -> bool:
    """FP8 weights and FP8 KV in one arm, with no arm giving either change alone."""
    if not (arm.weights == "fp8" and arm.kv.startswith("fp8")):
        return False
    isolates = any(
        (a.weights == "fp8" and not a.kv.startswith("fp8")) or (a.weights in UNQUANTIZED and a.kv.startswith("fp8"))
        for a in arms
    )
    return not isolates


def weights_share(params: float, memory_gib: float, tp: int = 1) -> float:
    """bf16 weight bytes as a share of GPU memory per TP rank (derived: params x 2 B / memory)."""
    return params * 2 / (memory_gib * 2**30 * max(tp, 1))


# ---------------------------------------------------------------- loading and validation

def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _validate_rule(raw: Any, fname: str, index: int) -> tuple[Rule | None, list[str]]:
    where = f"{fname}: rule #{index + 1}"
    if not isinstance(raw, dict):
        return None, [f"{where}: must be a table"]
    rid = raw.get("id")
    if isinstance(rid, str) and rid:
        where = f"{fname}: rule {rid!r}"
    problems: list[str] = []
    if not isinstance(rid, str) or not _ID_RE.match(rid):
        problems.append(f"{where}: 'id' must be lower-case letters, digits, '-' or '.'")
    for k in sorted(set(raw) - RULE_KEYS):
        problems.append(f"{where}: unknown key {k!r}{did_you_mean(k, RULE_KEYS)}")
    verdict = raw.get("verdict")
    if verdict not in VERDICTS:
        problems.append(f"{where}: verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
    for k in ("message", "source"):
        if not isinstance(raw.get(k), str) or not raw.get(k, "").strip():
            problems.append(f"{where}: {k!r} (a non-empty string) is required")
    if "fix" in raw and not isinstance(raw["fix"], str):
        problems.append(f"{where}: 'fix' must be a string")
    check = raw.get("check")
    if check is not None and check not in CHECKS:
        problems.append(f"{where}: check {check!r} is unknown{did_you_mean(str(check), CHECKS)}; checks: {', '.join(CHECKS)}")
    fb = raw.get("fallback", "")
    if not isinstance(fb, str) or (fb and not re.match(r"^[a-z0-9_]+$", fb)):
        problems.append(f"{where}: 'fallback' must be a fallback kind (lower-case letters, digits, '_'), got {fb!r}")
    elif fb and raw.get("verdict") == "allow":
        problems.append(f"{where}: 'fallback' on an allow rule: a forced fallback is a warn or a reject")
    logs = raw.get("log_lines", [])
    if not isinstance(logs, list) or not all(isinstance(x, str) for x in logs):
        problems.append(f"{where}: 'log_lines' must be a list of strings")
    match = raw.get("match", {})
    if not isinstance(match, dict):
        problems.append(f"{where}: 'match' must be a table")
        match = {}
    problems += _validate_match(match, where)
    if problems:
        return None, problems
    return Rule(id=str(rid), verdict=str(verdict), message=raw["message"].strip(), fix=str(raw.get("fix", "")).strip(),
                source=raw["source"].strip(), match=dict(match), check=check, log_lines=tuple(logs),
                notes=str(raw.get("notes", "")).strip(), file=fname, fallback=str(raw.get("fallback", ""))), []


def _validate_match(match: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    for k, v in match.items():
        kind = MATCH_KEYS.get(k)
        if kind is None:
            problems.append(f"{where}: unknown match key {k!r}{did_you_mean(k, MATCH_KEYS)}")
            continue
        if kind == "list":
            if not all(isinstance(x, str) and x for x in _as_list(v)) or _as_list(v) == []:
                problems.append(f"{where}: match.{k} must be a string or a non-empty list of strings")
            elif k == "engine" and (bad := [x for x in _as_list(v) if x not in ENGINES]):
                problems.append(f"{where}: match.engine {bad[0]!r} is unknown{did_you_mean(bad[0], ENGINES)}")
            elif k == "vendor" and (bad := [x for x in _as_list(v) if x not in VENDORS]):
                problems.append(f"{where}: match.vendor {bad[0]!r} is unknown{did_you_mean(bad[0], VENDORS)}")
            elif k == "arch" and (bad := [x for x in _as_list(v) if x not in ARCHES]):
                problems.append(f"{where}: match.arch {bad[0]!r} is unknown{did_you_mean(bad[0], ARCHES)}")
            elif k == "weights" and (bad := [x for x in _as_list(v) if x not in WEIGHT_FORMATS and x != "gguf"]):
                problems.append(f"{where}: match.weights {bad[0]!r} is unknown{did_you_mean(bad[0], WEIGHT_FORMATS)}")
        elif kind == "int":
            if not isinstance(v, int) or isinstance(v, bool):
                problems.append(f"{where}: match.{k} must be an integer, got {v!r}")
        elif kind == "float":
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                problems.append(f"{where}: match.{k} must be a number, got {v!r}")
        elif kind == "bool":
            if not isinstance(v, bool):
                problems.append(f"{where}: match.{k} must be true or false, got {v!r}")
        elif kind == "env":
            if not isinstance(v, dict) or not v or not all(
                    isinstance(n, str) and n and isinstance(x, (bool, str)) for n, x in v.items()):
                problems.append(f"{where}: match.{k} must be a table of NAME = true | false | \"value\", got {v!r}")
        elif kind == "version" and (not isinstance(v, str) or not _VERSION_RE.match(v)):
                problems.append(f"{where}: match.{k} must be a version string like \"12.4\", got {v!r}")
    for lo, hi in _RANGES:
        if lo in match and hi in match and not any(
                p.startswith((f"{where}: match.{lo}", f"{where}: match.{hi}")) for p in problems):
            a, b = match[lo], match[hi]
            if MATCH_KEYS[lo] == "version":
                a, b = parse_version(a), parse_version(b)
                n = max(len(a), len(b))
                a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
            if a > b:
                problems.append(f"{where}: match.{lo} {match[lo]!r} is greater than match.{hi} {match[hi]!r}")
    return problems


def rule_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("rules-*.toml"))


def check_rules(directory: str | Path | None = None) -> list[str]:
    """Every problem in the rule files and methods.toml of ``directory``; [] when all is well."""
    _, problems = _load(Path(directory) if directory else rules_dir())
    return problems


def _load(directory: Path) -> tuple[list[Rule], list[str]]:
    if not directory.is_dir():
        raise BadInput(f"rules directory {str(directory)!r} does not exist")
    problems: list[str] = []
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    files = rule_files(directory)
    if not files:
        problems.append(f"{directory}: no rules-*.toml files")
    for path in files:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"{path.name}: not valid TOML: {exc}")
            continue
        for k in sorted(set(data) - {"rule"}):
            problems.append(f"{path.name}: unknown top-level key {k!r} (rules are [[rule]] tables)")
        for i, raw in enumerate(data.get("rule", [])):
            rule, errs = _validate_rule(raw, path.name, i)
            problems += errs
            if rule is None:
                continue
            if rule.id in seen:
                problems.append(f"{path.name}: rule {rule.id!r}: duplicate id (first in {seen[rule.id]})")
                continue
            seen[rule.id] = path.name
            rules.append(rule)
    methods_path = directory / "methods.toml"
    if methods_path.exists():
        problems += _check_methods(methods_path)
    return rules, problems


def _check_methods(path: Path) -> list[str]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return [f"{path.name}: not valid TOML: {exc}"]
    problems = []
    engines = data.get("engine", {})
    for name in ENGINES:
        e = engines.get(name)
        if e is None and _adapter_methods(name) is not None:
            continue  # a registered engine with its own table (not shipped in quantrack/rules/)
        if not isinstance(e, dict):
            problems.append(f"{path.name}: [engine.{name}] is missing")
            continue
        for k in ("source", "assumed_version", "kv", "kv_choices", "methods"):
            if k not in e:
                problems.append(f"{path.name}: [engine.{name}] needs {k!r}")
        for q, spelled in e.get("kv", {}).items():
            if spelled not in e.get("kv_choices", []):
                problems.append(f"{path.name}: [engine.{name}] kv {q!r} -> {spelled!r} is not in kv_choices")
        for m, cap in e.get("methods", {}).items():
            if not isinstance(cap, int) or isinstance(cap, bool):
                problems.append(f"{path.name}: [engine.{name}] method {m!r}: min capability must be an integer")
    return problems


@lru_cache(maxsize=8)
def _cached_rules(directory: str) -> tuple[Rule, ...]:
    rules, problems = _load(Path(directory))
    if problems:
        raise BadInput(f"rulebook is invalid: {problems[0]} (run `quantrack rules check`)")
    return tuple(rules)


def load_rules(directory: str | Path | None = None) -> list[Rule]:
    """All rules, validated; the first problem is a one-line BadInput."""
    return list(_cached_rules(str(Path(directory) if directory else rules_dir())))


def get_rule(rule_id: str, directory: str | Path | None = None) -> Rule:
    rules = load_rules(directory)
    for r in rules:
        if r.id == rule_id.strip().lower():
            return r
    raise unknown("rule", rule_id, [r.id for r in rules], "quantrack rules list")


@lru_cache(maxsize=8)
def _methods(directory: str) -> dict[str, Any]:
    path = Path(directory) / "methods.toml"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))["engine"]  # type: ignore[no-any-return]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"cannot read {path.name}: {exc}") from None


def _adapter_methods(engine: str) -> dict[str, Any] | None:
    from quantrack.engines import get_adapter

    if engine not in ENGINES:
        return None
    own = get_adapter(engine).methods
    return dict(own) if own is not None else None


def _release_versions(engine: str) -> bool:
    from quantrack.engines import get_adapter

    return get_adapter(engine).install.release_versions


def engine_table(engine: str, engine_version: str | None = None, directory: str | Path | None = None) -> dict[str, Any]:
    """methods.toml for one engine, with the legacy method/KV lists swapped in for old versions."""
    table = _methods(str(Path(directory) if directory else rules_dir()))
    if engine not in table:
        own = _adapter_methods(engine)  # a plugin's or a test's engine carries its own table
        if own is None:
            raise unknown("engine", engine, ENGINES)
        table = {engine: own}
    e = dict(table[engine])
    legacy = e.pop("legacy", None)
    if (legacy and engine_version and _release_versions(engine)
            and _cmp_prefix(parse_version(engine_version, f"{engine} version"), parse_version(legacy["below"])) < 0):
        e.update({k: legacy[k] for k in ("methods", "kv_choices", "source", "kv_source") if k in legacy})
        e["methods_source"] = legacy["source"]
        e["legacy"] = True
    return e


# ---------------------------------------------------------------- engine flags

def engine_flags(engine: str, arm: Arm, engine_version: str | None = None) -> dict[str, str]:
    """The engine's own flags for an arm's dtype, quantization and KV dtype, in that order.

    ``{"--quantization": "fp8", "--kv-cache-dtype": "fp8"}`` for vLLM, ``fp8_e4m3`` KV on SGLang,
    ``{"--cache-type-k": "q8_0", "--cache-type-v": "q8_0"}`` on llama.cpp. Defaults (auto) give no
    flag. A name the engine does not accept is a one-line BadInput with a did-you-mean.
    """
    e = engine_table(engine, engine_version)
    flags: dict[str, str] = {}
    if arm.dtype not in ("auto", ""):
        spelled = e.get("dtype", {}).get(arm.dtype)
        if not e.get("dtype_flag") or spelled is None:
            raise BadInput(f"{engine} has no --dtype spelling for {arm.dtype!r} (arm {arm.name!r})")
        flags[e["dtype_flag"]] = spelled
    method = arm.quantization.strip().lower() if arm.quantization else None
    if method:
        if not e.get("quant_flag"):
            raise BadInput(f"arm {arm.name!r}: {engine} takes no --quantization ({method!r}); "
                           "the GGUF file's tensor types are the weights format")
        method = e.get("method_aliases", {}).get(method, method)
        if method:
            if method not in e["methods"]:
                raise BadInput(f"arm {arm.name!r}: unknown {engine} quantization method {method!r}"
                               f"{did_you_mean(method, e['methods'])}; see `quantrack rules explain method-name`")
            flags[e["quant_flag"]] = method
    if arm.kv != "auto":
        spelled = e["kv"].get(arm.kv)
        if spelled is None:
            raise BadInput(f"arm {arm.name!r}: KV-cache dtype {arm.kv!r} is not available on {engine}; "
                           f"it accepts: {', '.join(e['kv_choices'])}")
        flags[e["kv_flag"]] = spelled
        if e.get("kv_flag_v"):
            flags[e["kv_flag_v"]] = spelled
    return flags


# ---------------------------------------------------------------- evaluation

def _match(rule: Rule, f: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """True / False / None (depends on unknown facts), plus the flags that would make it checkable."""
    missing: list[str] = []
    for key, want in rule.match.items():
        if key in STUDY_KEYS:
            continue
        kind = MATCH_KEYS[key]
        have = f.get(key.removesuffix("_min").removesuffix("_max") if kind in ("int", "version") else key)
        if key in ("cc_min", "cc_max"):
            have = f["cc"]
        if key == "weights_share_max":
            have = f["weights_share"]
        if have is None:
            if key in _FACT_FLAGS:
                missing.append(_FACT_FLAGS[key])
                continue
            return False, []
        if kind == "env":
            if not all(_env_holds(have, name, w) for name, w in want.items()):
                return False, []
        elif key == "args":
            if not set(have) & {w.lower() for w in _as_list(want)}:
                return False, []
        elif kind == "list":
            wanted = [w.lower() for w in _as_list(want)]
            if key == "weights" and "gguf" in wanted:
                wanted += GGUF_TYPES
            if str(have).lower() not in wanted:
                return False, []
        elif kind == "bool":
            if bool(have) != want:
                return False, []
        elif kind in ("int", "float"):
            ok = have >= want if key.endswith("_min") else have <= want
            if not ok:
                return False, []
        elif kind == "version":
            c = _cmp_prefix(have, parse_version(want))
            if (key.endswith("_min") and c < 0) or (key.endswith("_max") and c > 0):
                return False, []
    return (None if missing else True), sorted(set(missing))


def _env_holds(env: dict[str, str], name: str, want: bool | str) -> bool:
    value = env.get(name)
    if isinstance(want, bool):
        return (value is not None and value.strip().lower() in _ENV_TRUE) == want
    return value == want


def _facts(node: NodeFacts, arm: Arm, engine: str, engine_version: tuple[int, ...] | None,
           cuda: tuple[int, ...] | None, mig: bool | None, ctx: StudyContext | None) -> dict[str, Any]:
    arms = ctx.arms if ctx and ctx.arms else (arm,)
    share = None
    if ctx and ctx.model_params and node.memory_gib:
        share = weights_share(ctx.model_params, node.memory_gib, ctx.tp)
    return {
        "vendor": node.vendor, "arch": node.arch or arch_from_cc(node.cc), "cc": node.cc, "engine": engine,
        "engine_version": engine_version, "quantization": effective_method(arm), "weights": arm.weights,
        "kv": arm.kv, "dtype": arm.dtype, "cuda": cuda,
        "mig": bool(mig if mig is not None else node.mig),  # unknown MIG = a whole GPU
        "flash_attn": _flash_attn(arm), "kv_scales": "--quantization-param-path" in arm.engine_args,
        "arm_model": bool(arm.model), "quantized": _is_quantized(arm), "weights_share": share,
        "conflated": _conflated(arm, arms),
        "env": {**dict(ctx.engine_env if ctx else ()), **arm.env_dict},  # as the adapter's launch_env merges
        "args": _arg_flags(arm),
    }


def _arg_flags(arm: Arm) -> tuple[str, ...]:
    """The flags among an arm's engine args, lower-cased, without a ``=value`` (``--calculate-kv-scales=true``)."""
    return tuple(a.split("=", 1)[0].lower() for a in arm.engine_args if a.startswith("-"))


def evaluate(
    gpu: Any,
    arm: Arm,
    engine: str,
    engine_version: str | None = None,
    cuda: str | None = None,
    mig: bool | None = None,
    study_context: StudyContext | None = None,
    rules: Iterable[Rule] | None = None,
) -> list[Verdict]:
    """Every rule that applies to this arm on this device with this engine (pure)."""
    if engine not in ENGINES:
        raise unknown("engine", engine, ENGINES)
    node = facts_of(gpu)
    e = engine_table(engine, engine_version)
    version = None
    if _release_versions(engine):
        version = parse_version(engine_version or e["assumed_version"], f"{engine} version")
    cuda_v = parse_version(cuda, "CUDA version") if cuda else None
    f = _facts(node, arm, engine, version, cuda_v, mig, study_context)
    out: list[Verdict] = []
    for rule in rules if rules is not None else load_rules():
        if rule.study_level:
            continue
        ok, missing = _match(rule, f)
        if ok is False:
            continue
        if rule.check:
            out += _computed(rule, e, engine, arm, node, f)
            continue
        if ok is None:
            if rule.verdict != "allow":
                out.append(Verdict(rule.id, UNCHECKED, f"not checked (needs {', '.join(missing)}): {rule.message}",
                                   rule.fix, rule.source, rule.log_lines))
            continue
        out.append(Verdict(rule.id, rule.verdict, rule.message, rule.fix, rule.source, rule.log_lines))
    return out


def forced_fallbacks(gpu: Any, arm: Arm, engine: str, engine_version: str | None = None,
                     rules: Iterable[Rule] | None = None) -> list[Rule]:
    """The rules with a ``fallback`` whose every match fact is known and holds for this arm on this device (pure):
    the kernels the engine's own gates force (FP8 weights on SM75-88: weight-only FP8 via Marlin). A rule that
    depends on an unknown fact (no compute capability) is not returned: the caller says ``unknown``, not "clean"."""
    if engine not in ENGINES:
        return []
    node = facts_of(gpu)
    e = engine_table(engine, engine_version)
    version = None
    if _release_versions(engine):
        version = parse_version(engine_version or e["assumed_version"], f"{engine} version")
    f = _facts(node, arm, engine, version, None, None, None)
    out = []
    for rule in rules if rules is not None else load_rules():
        if rule.fallback and not rule.study_level and _match(rule, f)[0] is True:
            out.append(rule)
    return out


def evaluate_study(ctx: StudyContext, rules: Iterable[Rule] | None = None) -> list[Verdict]:
    """Rules about the study as a whole (e.g. accuracy sample size), reported once."""
    out = []
    for rule in rules if rules is not None else load_rules():
        if not rule.study_level:
            continue
        want = rule.match.get("eval_questions_max")
        if want is not None and (ctx.eval_questions is None or ctx.eval_questions > want):
            continue
        floor = rule.match.get("kl_util_sum_min")
        if floor is not None and (ctx.kl_util_sum is None or ctx.kl_util_sum < floor):
            continue
        msg = rule.message.replace("{eval_questions}", str(ctx.eval_questions)).replace(
            "{kl_util_sum}", f"{ctx.kl_util_sum:g}" if ctx.kl_util_sum is not None else "?")
        out.append(Verdict(rule.id, rule.verdict, msg, rule.fix, rule.source, rule.log_lines))
    return out


def _computed(rule: Rule, e: dict[str, Any], engine: str, arm: Arm, node: NodeFacts,
              f: dict[str, Any]) -> list[Verdict]:
    """The data-driven checks over methods.toml: method names, min capability, KV spellings."""
    fmt: dict[str, Any] = {"engine": engine, "arm": arm.name, "cc": node.cc, "gpu": node.name,
                           "version": e.get("assumed_version") if f["engine_version"] is None else
                           ".".join(map(str, f["engine_version"]))}
    source = f"{rule.source}; {e.get('methods_source', '')}".strip("; ")

    def v(verdict: str, **extra: Any) -> list[Verdict]:
        return [Verdict(rule.id, verdict, rule.message.format(**fmt, **extra), rule.fix.format(**fmt, **extra),
                        source, rule.log_lines)]

    if rule.check == "method-name":
        if not arm.quantization:
            return []
        method = arm.quantization.strip().lower()
        spelled = e.get("method_aliases", {}).get(method, method)
        if spelled == "" or spelled in e["methods"]:
            return []
        if not e.get("quant_flag"):
            return v("reject", method=method, hint="", choices="(none: llama.cpp reads the GGUF file's types)")
        return v("reject", method=method, hint=did_you_mean(method, e["methods"]),
                 choices=", ".join(e["methods"]))
    if rule.check == "method-min-capability":
        method = f["quantization"]
        if not method or node.cc is None:
            return []
        method = e.get("method_aliases", {}).get(method, method)
        need = e["methods"].get(method)
        if need is None or need < 0 or node.cc >= need:
            return []
        return v("reject", method=method, need=need)
    if rule.check == "kv-dtype":
        if arm.kv == "auto":
            return []
        spelled = e["kv"].get(arm.kv)
        if spelled is None:
            return v("reject", kv=arm.kv, spelled="", choices=", ".join(e["kv_choices"]))
        return []
    return []


# ---------------------------------------------------------------- fallbacks the GPU forces, read into logs and runs

# --quantization / checkpoint methods whose weights are FP8 (vLLM 0.33 and SGLang 0.5.23 names, rules/methods.toml)
FP8_WEIGHT_METHODS = ("fp8", "fbgemm_fp8", "fp8_w8a8", "w8a8_fp8", "fp8_per_tensor", "fp8_per_block",
                      "fp8_per_channel", "deepseek_v4_fp8", "ptpc_fp8")


@dataclass(frozen=True)
class GateFinding:
    """What the rulebook's gates say about an FP8-weights node whose log printed no fallback line.

    ``state`` "yes": the GPU's compute capability is known and a rule with a ``fallback`` matches (the engine
    must take that kernel, e.g. weight-only FP8 via Marlin below SM89); "unknown": the GPU is not known and
    nothing in the log shows the native path (no native FP8 kernel line), so a clean verdict has no evidence."""

    state: str  # yes | unknown
    kind: str  # the fallback kind (fp8_marlin), "" when unknown
    rule: str  # the rule id that decides it
    source: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "kind": self.kind, "rule": self.rule, "source": self.source,
                "reason": self.reason}


def fp8_weights(quantization: str | None, weights: str | None = None, kernel: str | None = None) -> bool:
    """The node serves FP8 weights: an FP8 method, an arm's fp8 weights, or an FP8 linear kernel line."""
    q = (quantization or "").strip().lower()
    return (q in FP8_WEIGHT_METHODS or (weights or "").lower() == "fp8"
            or "fp8" in (kernel or "").lower())


def native_fp8_kernel(kernel: str | None) -> bool:
    """A kernel line that names a native FP8 GEMM (Cutlass/FlashInfer/Torch ..FP8.. kernels, not Marlin):
    positive evidence of the native path (vllm@4ba787ec9:vllm/model_executor/kernels/linear/__init__.py:L458-L467)."""
    k = (kernel or "").lower()
    return "fp8" in k and "marlin" not in k


def parse_cc(value: object) -> int | None:
    """'8.6' / '86' / 86 -> 86; anything else -> None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*(\d{1,2})(?:\.(\d))?\s*", str(value or ""))
    if not m:
        return None
    return int(m.group(1)) * 10 + int(m.group(2)) if m.group(2) is not None else int(m.group(1))


def gpu_vendor_cc(name: str | None) -> tuple[str | None, int | None]:
    """(vendor, compute capability) the GPU catalog gives a GPU name (``NVIDIA GeForce RTX 3090`` ->
    ("nvidia", 86)); (None, None) for a name the catalog does not hold."""
    if not name:
        return None, None
    from quantrack.errors import QuantrackError
    from quantrack.hardware.catalog import get_gpu

    try:
        g = get_gpu(name)
    except QuantrackError:
        return None, None
    return g.vendor, g.cc_int


def fallback_gate(engine: str | None, *, quantization: str | None, weights: str | None = None,
                  kernel: str | None = None, cc: int | None = None, gpu: str | None = None,
                  engine_version: str | None = None) -> GateFinding | None:
    """The rulebook's verdict on an FP8-weights node with no fallback line; None when it has nothing to add
    (not FP8 weights, an engine without FP8 gates, a GPU with native FP8, or a native FP8 kernel line)."""
    gates = _gpu_gates(engine)
    if engine is None or not gates or not fp8_weights(quantization, weights, kernel):
        return None
    from quantrack.arms import make_arm
    from quantrack.errors import QuantrackError

    arm = make_arm("log", weights="fp8", quantization=None)
    if cc is not None:
        try:
            rules = forced_fallbacks(NodeFacts(name=gpu or "gpu", vendor="nvidia", cc=cc), arm, engine,
                                     engine_version)
        except QuantrackError:  # a version string the rulebook cannot read: use the assumed version's gates
            rules = forced_fallbacks(NodeFacts(name=gpu or "gpu", vendor="nvidia", cc=cc), arm, engine)
        if not rules:
            return None
        r = rules[0]
        where = f"{gpu} " if gpu else ""
        return GateFinding("yes", r.fallback, r.id, r.source,
                           f"FP8 weights on {where}(compute capability {cc // 10}.{cc % 10}): rule {r.id} says "
                           f"{engine} runs them as {r.fallback} (no FP8 tensor cores below 8.9), whether or not "
                           "the log shows the warning")
    if native_fp8_kernel(kernel):
        return None
    return GateFinding("unknown", "", gates[0].id, gates[0].source,
                       "FP8 weights on a GPU the log does not name (audit --gpu names it): below compute capability "
                       f"8.9 {engine} runs FP8 weights as weight-only FP8 via Marlin, and the log shows neither that "
                       "warning nor a native FP8 kernel line")


def _gpu_gates(engine: str | None) -> list[Rule]:
    """The engine's rules with a ``fallback`` that the GPU alone decides (a compute-capability range, no env):
    the engines without one (llama.cpp) have no FP8 gate to apply."""
    return [r for r in load_rules() if r.fallback and "env" not in r.match
            and ("cc_min" in r.match or "cc_max" in r.match) and engine in _as_list(r.match.get("engine", []))]


def report_gate(report: Any, gpu: str | None = None) -> GateFinding | None:
    """``fallback_gate`` for a parsed log (an engines.base.LogReport): the GPU from ``gpu`` (a catalog name) when
    given, else the compute capability or GPU name the log printed."""
    vendor, cc = gpu_vendor_cc(gpu) if gpu else (None, parse_cc(report.extra.get("compute_capability")))
    if cc is None and not gpu:
        vendor, cc = gpu_vendor_cc(report.gpu)
    if vendor not in (None, "nvidia"):  # the FP8 gates held are NVIDIA's (AMD: rule fp8-on-amd)
        return None
    return fallback_gate(report.engine, quantization=report.quantization, kernel=report.linear_kernel, cc=cc,
                         gpu=gpu or report.gpu, engine_version=report.engine_version)


def overall(verdicts: Iterable[Verdict]) -> str:
    """The worst verdict: reject > warn > allow (unchecked counts as allow)."""
    worst = "allow"
    for v in verdicts:
        if _RANK.get(v.verdict, 0) > _RANK[worst]:
            worst = v.verdict
    return worst


__all__ = [
    "UNCHECKED",
    "VERDICTS",
    "GateFinding",
    "NodeFacts",
    "Rule",
    "StudyContext",
    "Verdict",
    "arch_from_cc",
    "check_rules",
    "engine_flags",
    "engine_table",
    "evaluate",
    "evaluate_study",
    "facts_of",
    "fallback_gate",
    "forced_fallbacks",
    "get_rule",
    "load_rules",
    "overall",
    "parse_version",
    "report_gate",
    "weights_share",
]
