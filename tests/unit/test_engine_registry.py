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
# Files outside quantrack/engines/ that may spell an engine's name in code: none. Per-engine facts live behind the
# adapters (capacity models, log parsing, detection) or in quantrack/engines/evaltools.py (the engines' own
# evaluation tools, named as users name them).
ALLOWED: set[str] = set()


def _engine_names_in_code(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string constant that is exactly an engine's name, docstrings aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in BUILT_IN and id(n) not in docstrings]


def test_the_registry_is_the_one_list_of_engines() -> None:
    from quantrack import study
    from quantrack.accuracy import kl
    from quantrack.hardware import capacity, rulebook
    from quantrack.measure import client

    for mod in (capacity, rulebook, study, kl, client):
        assert mod.ENGINES is ENGINE_KINDS, mod.__name__
    assert DEFAULT_ENGINE in ENGINE_KINDS
    assert GPU_ENGINE_KINDS == tuple(k for k in ENGINE_KINDS if get_adapter(k).memory.gpu_share)


def test_no_engine_name_outside_the_engines_package() -> None:
    found = [f"{path.relative_to(PKG).as_posix()}:{no}: {name!r}" for path in sorted(PKG.rglob("*.py"))
             if not path.relative_to(PKG).as_posix().startswith("engines/")
             and path.relative_to(PKG).as_posix() not in ALLOWED
             for no, name in _engine_names_in_code(path)]
    assert found == []


def test_the_name_check_sees_a_branch_and_skips_a_docstring(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""kind = "vllm" in an example."""\n\ndef f(k):\n    return k == "sglang"\n', encoding="utf-8")
    assert _engine_names_in_code(f) == [(4, "sglang")]


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
