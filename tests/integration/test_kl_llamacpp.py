"""`eval kl` against real llama.cpp servers (xllamacpp, SmolLM2-135M GGUF on CPU, 127.0.0.1 only).

An arm against itself must agree exactly with ~0 KL; Q4_0 must be measurably less faithful to F16 than Q8_0.
Uses tests/integration/conftest.py (``gguf_arms``, ``llamacpp_server``) and starts three more servers with
quantrack's ``server_for_arm``, one thread each; runs are short (a few hundred positions): two shared cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

xllamacpp = pytest.importorskip("xllamacpp")
lifecycle = pytest.importorskip("quantrack.engines.lifecycle")

from quantrack.accuracy.kl import run_kl
from quantrack.arms import make_arm


@pytest.fixture(scope="module")
def kl_servers(gguf_arms: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """F16, Q8_0 and Q4_0 servers (conftest's ``gguf_arms`` files), one slot and one thread each."""
    logs = tmp_path_factory.mktemp("kl-servers")
    servers = {}
    try:
        for name in ("F16", "Q8_0", "Q4_0"):
            srv = lifecycle.server_for_arm("llamacpp", str(gguf_arms[name]), make_arm(name.lower(), weights=name.lower()),
                                           context_len=2048, parallel=1, extra_args=("-t", "1"),
                                           log_path=logs / f"{name}.log", startup_timeout=180)
            servers[name] = srv.start()
        yield {name: s.base_url for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()


def test_arm_against_itself_agrees_with_zero_kl(kl_servers: dict[str, str]) -> None:
    # one server (F16, one slot, one thread) as both baseline and candidate. With conftest's two-slot server the
    # two sides can be computed in differently shaped batches, which moved KL to ~5e-4 nats in CI: batched
    # numerics, not a measurement difference; one slot keeps the computation identical.
    url = kl_servers["F16"]
    r = run_kl(url, url, "llamacpp", tokens=120)
    assert r.n_positions == 120
    assert r.top1_agree == 1.0
    assert r.kl_mean < 1e-4 and r.kl_p99 < 1e-3  # numerical noise only
    assert r.topk_overlap > 0.99
    assert r.base_tail_mass == pytest.approx(r.cand_tail_mass, abs=1e-4)


def test_q4_0_is_less_faithful_than_q8_0(kl_servers: dict[str, str]) -> None:
    base = kl_servers["F16"]
    q8 = run_kl(base, kl_servers["Q8_0"], "llamacpp", tokens=200)
    q4 = run_kl(base, kl_servers["Q4_0"], "llamacpp", tokens=200)
    assert q8.n_positions == q4.n_positions == 200
    assert q4.top1_agree < q8.top1_agree
    assert q4.kl_mean > q8.kl_mean
    assert q8.ci is not None and q4.ci is not None
    assert q8.ci["kl_mean"][1] < q4.ci["kl_mean"][0]  # the intervals do not overlap
    for r in (q8, q4):
        assert 0.0 <= r.kl_lower_mean <= r.kl_mean
        assert 0.0 < r.base_tail_mass < 0.5
        assert set(r.metrics()) == {"kl_top1_agree", "kl_mean", "kl_median", "kl_p99", "kl_positions"}


def test_cli_writes_json_against_a_real_server(kl_servers: dict[str, str], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from quantrack.cli import cli

    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"prompt": "Question: What is 12 plus 30?\nAnswer:",
                                 "continuation": " 12 plus 30 is 42.\n#### 42"}) + "\n")
    out = tmp_path / "kl.json"
    url = kl_servers["Q4_0"]
    res = CliRunner().invoke(cli, ["eval", "kl", "--baseline", url, "--candidate", url + "/v1", "--engine",
                                   "llamacpp", "--texts", str(texts), "--tokens", "6", "--format", "json",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["n_positions"] == 6 and data["n_texts"] == 1
    assert data["ci"] is None  # one text: no bootstrap interval
    assert data["metrics"]["kl_top1_agree"] == 1.0
    assert data["candidate_url"] == url
