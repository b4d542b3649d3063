"""The package's import graph: no cycle, and the layers the architecture promises.

The graph is read from the source (``ast``), file by file: every ``import`` / ``from … import`` of a quantrack module,
at module level or inside a function (a lazy import is still a dependency), ``TYPE_CHECKING`` blocks included. An
edge goes to the module file named (``from quantrack.a import b`` names ``quantrack/a/b.py`` when that file exists,
else ``quantrack/a``'s own file). Print the graph's cycles with ``python tests/unit/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "quantrack"


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            if n.startswith("quantrack"):
                target = _resolve(n, known)
                if target and target != me:
                    out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(p, known) for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def reaches(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in g.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _under(names: Iterable[str], prefix: str) -> list[str]:
    return sorted(n for n in names if n == prefix or n.startswith(prefix + "."))


# cycles being removed elsewhere, each with where: the list may only shrink
KNOWN_CYCLES = [
]


def test_the_import_graph_has_no_cycle() -> None:
    found = {frozenset(c) for c in cycles(graph())}
    known = {frozenset(c) for c in KNOWN_CYCLES}
    assert sorted(sorted(c) for c in found - known) == []
    assert sorted(sorted(c) for c in known - found) == [], "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_study_schema_imports_neither_the_report_nor_the_fleet() -> None:
    g = graph()
    below = reaches(g, "quantrack.study")
    assert _under(below, "quantrack.report") == []
    # the [fleet] table's schema is the one fleet module the study checks its file with
    assert _under(below, "quantrack.fleet") in ([], ["quantrack.fleet", "quantrack.fleet.spec"],
                                               ["quantrack.fleet.spec"])
    assert "quantrack.fleet.ray_runner" not in below and "quantrack.fleet.skypilot" not in below


def test_nothing_in_the_package_imports_the_runner_facade() -> None:
    # quantrack.runner keeps `from quantrack.runner import ...` working for scripts outside the package only
    users = sorted(m for m, deps in graph().items() if "quantrack.runner" in deps)
    assert users == []


if __name__ == "__main__":
    for c in cycles(graph()):
        print(" <-> ".join(c))
