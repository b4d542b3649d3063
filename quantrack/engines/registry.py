"""The engine registry: which engines exist, by name, and their adapters (``get_adapter``, ``register``).

A leaf of the engines package (it imports no other module of it at run time), so detection, log parsing and the
capacity model can ask it for the registered adapters without an import cycle.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from quantrack.errors import BadInput, NotFound, did_you_mean

if TYPE_CHECKING:
    from quantrack.engines.base import EngineAdapter


@dataclass(frozen=True)
class _Entry:
    """A registered engine: its adapter (or where to import it from), whether it takes a share of GPU memory
    (known without importing the adapter, for option choices) and the other spellings of its name."""

    module: str
    attr: str
    gpu_share: bool
    aliases: tuple[str, ...] = ()
    adapter: EngineAdapter | None = None


# The built-in engines: adding one is one line here plus its module (docs/engines.md).
_REGISTRY: dict[str, _Entry] = {
    "vllm": _Entry("quantrack.engines.vllm", "VllmAdapter", True),
    "sglang": _Entry("quantrack.engines.sglang", "SglangAdapter", True, ("sgl",)),
    "llamacpp": _Entry("quantrack.engines.llamacpp", "LlamacppAdapter", False,
                       ("llama.cpp", "llama-cpp", "llama_cpp", "xllamacpp")),
}
_generation = 0  # bumped by register/unregister: tables built from every adapter (markers, prefixes) rebuild


class EngineKinds(Sequence[str]):
    """The registered engine names, in registration order: a live view of the registry, so every module that
    imported it (study, rulebook, capacity, the client ...) sees an engine registered later."""

    def __init__(self, gpu_only: bool = False) -> None:
        self._gpu_only = gpu_only

    def _names(self) -> tuple[str, ...]:
        return tuple(k for k, e in _REGISTRY.items() if e.gpu_share or not self._gpu_only)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, kind: object) -> bool:
        return kind in self._names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EngineKinds):
            return self._names() == other._names()
        return isinstance(other, (tuple, list)) and self._names() == tuple(other)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return repr(self._names())


ENGINE_KINDS = EngineKinds()
# the engines with a GPU memory-share model (``EngineAdapter.memory.gpu_share``), for option choices that must
# not import the adapters (a test checks the two agree)
GPU_ENGINE_KINDS = EngineKinds(gpu_only=True)
DEFAULT_ENGINE = "vllm"  # where a command or a study names none
# The memory share a study, a plan or a KL baseline assume where none is given: vLLM 0.25.0's
# gpu_memory_utilization default (vllm/config/cache.py:L68). The one definition.
DEFAULT_UTIL = 0.92


def register(adapter: EngineAdapter, *, aliases: Iterable[str] = ()) -> None:
    """Register an adapter object under its ``kind`` (a plugin's engine, or a test's). Its module carries
    everything else: markers and line prefixes (detection, parsing), fallback rules, launch, queries, capacity."""
    global _generation
    kind = adapter.kind.strip().lower()
    if not kind or kind in _REGISTRY:
        raise BadInput(f"cannot register engine {adapter.kind!r}: "
                       + ("it is registered already" if kind else "the adapter has no kind"))
    _REGISTRY[kind] = _Entry(type(adapter).__module__, type(adapter).__qualname__, adapter.memory.gpu_share,
                             tuple(a.lower() for a in aliases), adapter)
    _generation += 1


def unregister(kind: str) -> None:
    """Remove an engine ``register`` added (built-in engines stay)."""
    global _generation
    entry = _REGISTRY.get(kind)
    if entry is None or entry.adapter is None:
        raise BadInput(f"engine {kind!r} was not registered with register()")
    del _REGISTRY[kind]
    _generation += 1


def registry_generation() -> int:
    """Changes whenever the set of engines changes (for tables built from every adapter)."""
    return _generation


def normalize_kind(kind: str) -> str:
    k = kind.strip().lower()
    if k not in _REGISTRY:
        k = next((name for name, e in _REGISTRY.items() if k in e.aliases), k)
    if k not in _REGISTRY:
        raise NotFound(f"unknown engine {kind!r}{did_you_mean(k, ENGINE_KINDS)}; known: {', '.join(ENGINE_KINDS)}")
    return k


def get_adapter(kind: str) -> EngineAdapter:
    """The adapter registered under ``kind``; unknown kinds list the known ones (BadInput)."""
    entry = _REGISTRY[normalize_kind(kind)]
    if entry.adapter is not None:
        return entry.adapter
    cls = getattr(importlib.import_module(entry.module), entry.attr)
    adapter: EngineAdapter = cls()
    return adapter


def adapters() -> list[EngineAdapter]:
    """Every registered adapter, in registration order (imports the built-in modules)."""
    return [get_adapter(k) for k in ENGINE_KINDS]


__all__ = ["DEFAULT_ENGINE", "DEFAULT_UTIL", "ENGINE_KINDS", "GPU_ENGINE_KINDS", "EngineKinds", "adapters",
           "get_adapter", "normalize_kind", "register", "registry_generation", "unregister"]
