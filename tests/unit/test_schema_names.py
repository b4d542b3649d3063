"""Every name a logged run carries is spelled once, in ``quantrack/run/schema.py``.

The test reads the package's source (``ast``: string constants and the literal parts of f-strings) and fails on:

* a tag (``quantrack.<name>``, MLflow's own tags quantrack reads), an artifact path or a node-fact name, or the
  literal head of a name built by one of schema's name functions (``sweep_output_tps_c…``, ``probe_fp8_speedup_b…``);
* a literal name given to a run's accessors: ``X.params/metrics/tags.get("…")`` or ``[…]``, and
  ``rec.param/metric/tag("…")``.

A metric or param name standing alone elsewhere is not checked: the engine parsers' log-report fields, the latency
statistics' keys, the compare table's column keys and the CLI's option names share some of those words, and they
are not names of a logged run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from quantrack.run import schema

PKG = Path(__file__).resolve().parents[2] / "quantrack"
SCHEMA = PKG / "run" / "schema.py"


def _values(cls: type) -> set[str]:
    return {v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}


TAGS = _values(schema.Tag) | {v.format(step=s) for v in _values(schema.Tag) for s in schema.HYGIENE_STEPS}
ARTIFACTS = _values(schema.Artifact) | {schema.Artifact.HYGIENE.format(step=s) for s in schema.HYGIENE_STEPS}
# the node-fact names that are not everyday words ('probe', 'torch', 'model' are also commands, packages, keys)
NODE_FACT = {schema.NodeFact.EXPERIMENT, schema.NodeFact.PARAM_HOSTNAME, schema.NodeFact.TAG_PROBE_VERDICT,
             schema.NodeFact.METRIC_COPY_TBPS}
METRICS = _values(schema.Metric)
STORES = {"params", "metrics", "tags"}
WRITERS = {"param", "metric", "tag"}
# the literal heads of the names schema builds from a value
BUILT = ("sweep_output_tps_c", "sweep_tpot_ms_p50_c", "sweep_ttft_ms_p50_c", "sweep_request_tps_c",
         "probe_fp8_speedup_b", "probe_bf16_stack_ms_b", "probe_fp8_stack_ms_b")
TAG_LIKE = re.compile(r"^quantrack\.[a-z0-9_{}.]+$")


def _modules() -> set[str]:
    """quantrack's own module names (``quantrack.api`` is a module, not a tag)."""
    out = set()
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


# strings of the tag form that are not tags, with why
NOT_TAGS = {
    "quantrack.setting",  # the dataclass-field metadata key of a study setting (quantrack's settings machinery)
}


def _strings(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, text, whole) of every string constant; ``whole`` is False for the literal part of an f-string."""
    out: list[tuple[int, str, bool]] = []
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    in_fstring.add(id(part))
                    out.append((node.lineno, part.value, False))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            out.append((node.lineno, node.value, True))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(first.value.lineno)
    return ids


def _accessed(tree: ast.AST) -> list[tuple[int, str]]:
    """Literal names handed to a run's accessors: ``r.tags.get("x")``, ``r.metrics["x"]``, ``rec.tag("x", v)``."""
    out = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            reads = f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr in STORES
            if reads or f.attr in WRITERS:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr in STORES:
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((node.lineno, key.value))
        elif isinstance(key, ast.JoinedStr):
            out.append((node.lineno, "f-string"))
    return out


def offending_names() -> list[str]:
    modules = _modules()
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path == SCHEMA:
            continue
        rel = path.relative_to(PKG).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for line, text, whole in _strings(tree):
            if line in docs:
                continue
            why = None
            if whole and (text in TAGS or text in ARTIFACTS or text in NODE_FACT):
                why = "a run's name"
            elif whole and TAG_LIKE.match(text) and text not in modules and text not in NOT_TAGS:
                why = "a tag"
            elif any(text.startswith(b) or (not whole and text.endswith(b)) for b in BUILT):
                why = "a name built by run/schema"
            if why:
                found.append(f"quantrack/{rel}:{line}: {text!r} ({why})")
        for line, text in _accessed(tree):
            found.append(f"quantrack/{rel}:{line}: {text!r} (spelled at a run's accessor)")
    return sorted(set(found))


def test_no_run_name_is_spelled_outside_the_schema() -> None:
    assert offending_names() == []


def test_the_check_finds_a_spelled_name() -> None:
    # the check itself can fail: the same walk over a module that spells a tag, a metric and a built name
    tree = ast.parse('T = "quantrack.fallback"\nM = f"sweep_output_tps_c{c}"\nX = r.metrics.get("gsm8k_n")\n'
                     'rec.param("weights", w)\n')
    texts = {t for _, t, _ in _strings(tree)}
    assert "quantrack.fallback" in TAGS & texts
    assert any(t.startswith(BUILT) for t in texts)
    assert sorted(t for _, t in _accessed(tree)) == ["gsm8k_n", "weights"]
