"""One engine registry and one engine interface: what the rest of quantrack asks of an engine is an adapter
fact, so nothing outside quantrack/engines/ branches on an engine's name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from quantrack.arms import make_arm
from quantrack.engines import (
    DEFAULT_ENGINE,
    ENGINE_KINDS,
    GPU_ENGINE_KINDS,
    get_adapter,
)
from quantrack.engines.base import LaunchSpec

PKG = Path(__file__).resolve().parents[2] / "quantrack"
BUILT_IN = {"vllm", "sglang", "llamacpp"}
# The modules that are an engine: its adapter module, and llama.cpp's in-process server entry point (xllamacpp).
# Everything engine-specific lives there; every other module of the package, engines/ included, asks the adapter.
ADAPTER_MODULES = {"engines/vllm.py", "engines/sglang.py", "engines/llamacpp.py", "engines/xllamacpp_server.py"}
# Outside the adapter modules an engine's name may be spelled in these module-level assignments only: the registry
# itself (its table of built-in engines and the default one), and the engines' own evaluation tools, named as users
# name them (quantrack/engines/evaltools.py: file formats, not engine branches). Nothing else, anywhere.
ALLOWED_ASSIGNMENTS = {("engines/registry.py", "_REGISTRY"), ("engines/registry.py", "DEFAULT_ENGINE"),
                       ("engines/evaltools.py", "VLLM_GSM8K"), ("engines/evaltools.py", "SGLANG_RUN_EVAL")}


def _engine_names_in_code(path: Path, allowed: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, name) of every string constant that is exactly an engine's name, docstrings aside, and those inside
    the module-level assignments to the names in ``allowed``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in allowed for t in targets):
            skip |= {id(n) for n in ast.walk(stmt)}
    return sorted((n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in BUILT_IN and id(n) not in skip)


def _engine_names_outside_the_adapters() -> list[str]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in ADAPTER_MODULES:
            continue
        allowed = frozenset(name for f, name in ALLOWED_ASSIGNMENTS if f == rel)
        found += [f"{rel}:{no}: {name!r}" for no, name in _engine_names_in_code(path, allowed)]
    return found


def test_the_registry_is_the_one_list_of_engines() -> None:
    from quantrack import study
    from quantrack.accuracy import kl
    from quantrack.hardware import capacity, rulebook
    from quantrack.measure import client

    for mod in (capacity, rulebook, study, kl, client):
        assert mod.ENGINES is ENGINE_KINDS, mod.__name__
    assert DEFAULT_ENGINE in ENGINE_KINDS
    assert GPU_ENGINE_KINDS == tuple(k for k in ENGINE_KINDS if get_adapter(k).memory.gpu_share)


def test_no_engine_name_outside_the_adapter_modules() -> None:
    """Every module but the adapters' -- the rest of the package and engines/ itself (the KV-scale plan and
    observation, the decode-side KL requests, detection, parsing, reconciliation) -- asks the adapter."""
    assert _engine_names_outside_the_adapters() == []


def test_the_name_check_covers_every_module_but_the_adapters() -> None:
    from quantrack.engines.registry import _REGISTRY

    modules = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}
    assert ADAPTER_MODULES <= modules and {f for f, _ in ALLOWED_ASSIGNMENTS} <= modules
    built_in = {e.module.removeprefix("quantrack.").replace(".", "/") + ".py" for e in _REGISTRY.values()
                if e.adapter is None}
    assert built_in <= ADAPTER_MODULES  # each registered engine's module is one the check leaves to the engine
    scanned = modules - ADAPTER_MODULES
    assert {"engines/kvplan.py", "engines/kvscale.py", "engines/scoring.py", "engines/detect.py",
            "engines/logparse.py", "engines/reconcile.py", "study.py", "accuracy/kl.py"} <= scanned


def test_the_name_check_sees_a_branch_and_skips_a_docstring(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""kind = "vllm" in an example."""\n\ndef f(k):\n    return k == "sglang"\n', encoding="utf-8")
    assert _engine_names_in_code(f) == [(4, "sglang")]


def test_an_allowed_assignment_allows_only_itself(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('TABLE = {"vllm": 1}\nOTHER = {"sglang": 2}\n\ndef f(k):\n    TABLE = "llamacpp"\n',
                 encoding="utf-8")
    assert _engine_names_in_code(f, frozenset({"TABLE"})) == [(2, "sglang"), (5, "llamacpp")]


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_every_adapter_answers_the_interface(kind: str) -> None:
    a = get_adapter(kind)
    assert a.kind == kind and a.label and a.serving.health_path.startswith("/")
    path, body = a.tokenize_request("hello", add_special=True, model="m")
    assert path == "/tokenize" and "hello" in body.values()
    assert isinstance(a.fixed_length_fields(8), dict)
    spec = LaunchSpec(model="/m.gguf", arm=make_arm("x", weights="f16"), context_len=512, util=0.5, parallel=4)
    side = a.side_server_spec(spec, 0.3)
    assert side.parallel == 1 and side.util == (0.3 if a.memory.gpu_share else None)
    assert side.context_len == 512 and side.tp == spec.tp


def test_scoring_goes_through_the_adapter() -> None:
    """score_prompt posts the engine's own request and parses its answer (llama.cpp: one per position)."""
    posted: list[tuple[str, dict[str, object]]] = []

    def post(path: str, body: dict[str, object]) -> object:
        posted.append((path, body))
        return {"completion_probabilities": [{"id": 5, "token": "x", "logprob": -0.1,
                                              "top_logprobs": [{"id": 5, "token": "x", "logprob": -0.1},
                                                               {"id": 6, "token": "y", "logprob": -2.5}]}]}

    out = get_adapter("llamacpp").score_prompt(post, [1, 2, 3, 4], 2, 2)
    assert [p for p, _ in posted] == ["/completion", "/completion"] and len(out) == 2
    assert [b["prompt"] for _, b in posted] == [[1, 2], [1, 2, 3]]


def test_one_table_of_gguf_types() -> None:
    from quantrack import arms
    from quantrack.engines import vllm, xllamacpp_server
    from quantrack.hardware import rulebook

    assert rulebook.GGUF_TYPES is arms.GGUF_TYPES
    assert vllm.GGUF_TYPES == frozenset(arms.GGUF_ONLY_TYPES)
    assert xllamacpp_server.KV_TYPES is arms.GGUF_KV_TYPES
    assert "bf16" not in arms.GGUF_ONLY_TYPES and "mxfp4" not in arms.GGUF_ONLY_TYPES  # also HF formats
    assert set(arms.GGUF_ONLY_TYPES) <= set(arms.WEIGHT_FORMATS)


def test_one_default_util() -> None:
    import inspect

    from quantrack.engines import DEFAULT_UTIL
    from quantrack.hardware import capacity
    from quantrack.study import GpuSpec

    assert get_adapter("vllm").memory.default_share == DEFAULT_UTIL == GpuSpec().util
    assert inspect.signature(capacity.plan).parameters["util"].default == DEFAULT_UTIL
    literal = re.compile(r"(?<![\d.])0\.92(?!\d)")
    hits = [f"{p.relative_to(PKG)}:{no}" for p in sorted(PKG.rglob("*.py"))
            for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if literal.search(line.split("#", 1)[0])]
    assert hits == ["engines/registry.py:" + str(next(
        no for no, line in enumerate((PKG / "engines" / "registry.py").read_text().splitlines(), 1)
        if line.startswith("DEFAULT_UTIL =")))]


def test_an_engine_the_adapter_gives_no_kv_rules_or_next_token_says_so() -> None:
    """An engine without KV-scale rules plans none and observes none; one without a next-token request is BadInput
    for the decode-side KL before any server is asked (it was a KeyError); an engine not registered is BadInput
    naming the known ones. None of it is a KeyError."""
    from quantrack.accuracy import kl
    from quantrack.engines import plan_scales
    from quantrack.engines.base import EngineAdapter, LogReport
    from quantrack.engines.logparse import finish_kv_scales
    from quantrack.errors import BadInput, NotFound
    from tests.fake_engine import FakeAdapter, registered

    class Bare(FakeAdapter):  # the fake engine without its decode-side KL: the interface's defaults
        kind = "bare"
        next_token_request = EngineAdapter.next_token_request
        parse_next_token = EngineAdapter.parse_next_token

    arm = make_arm("fp8kv", weights="f16", kv="fp8")
    with registered(Bare()):
        assert plan_scales(arm, "bare") is None
        report = LogReport(engine="bare", extra={"_kv_scale_lines": {"unscaled": (3, "Using KV cache scaling")}})
        finish_kv_scales(report)
        assert report.kv_scales is None and "_kv_scale_lines" not in report.extra
        with pytest.raises(BadInput, match=r"^fake engine: no decode-side KL \(its adapter has no "
                                           r"next_token_request\)$"):
            kl.run_kl("http://127.0.0.1:1", "http://127.0.0.1:1", "bare", method=kl.KLMethod.DECODE_GREEDY)
        with pytest.raises(BadInput, match=r"^fake engine: no teacher-forced KL \(its adapter has no score_prompt\)$"):
            kl.run_kl("http://127.0.0.1:1", "http://127.0.0.1:1", "bare")
        with pytest.raises(BadInput, match="no decode-side KL"):
            Bare().next_token_request([1], 2)  # called anyway: the same line, not a KeyError
    with pytest.raises(NotFound, match="unknown engine 'nosuch'.*known: vllm, sglang, llamacpp"):
        plan_scales(arm, "nosuch")
    report = LogReport(engine=None)
    finish_kv_scales(report)  # no engine: nothing to observe
    assert report.kv_scales is None
    report = LogReport(engine="nosuch")
    finish_kv_scales(report)
    assert report.kv_scales is None


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_every_built_in_engine_plans_and_observes_kv_scales_and_decodes(kind: str) -> None:
    """The three built-in adapters each answer the KV-scale plan, the log observation and the next-token request."""
    from quantrack.engines import plan_scales
    from quantrack.engines.base import LogReport
    from quantrack.engines.kvplan import ScaleSource

    a = get_adapter(kind)
    assert a.kl_unsupported(decode=True) is None and a.kl_unsupported(decode=False) is None
    plan = plan_scales(make_arm("x", weights="f16", kv="auto"), kind)
    assert plan is not None and plan.engine == kind and plan.source == ScaleSource.NOT_QUANTIZED
    assert a.observe_kv_scales(LogReport(engine=kind), {}) is not None
    path, body = a.next_token_request([1, 2, 3], 4)
    assert path.startswith("/") and [1, 2, 3] in body.values()
