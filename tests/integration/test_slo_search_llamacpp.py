"""``quantrack sweep --slo-search ... --search-mode rate`` end to end on the real llama.cpp server (conftest's
SmolLM2 server, 2 slots): every probe is a measured rate level, repeated, saved with --save and shown with its
spread; the answer is a bracket. Bounded: 4 requests a probe, 16 tokens in, 4 out, rates 1 to 4/s.

Two criteria whose outcome does not depend on how fast this machine is: one no request can miss (60 s), so the
search climbs to the top of its range; one no request can meet (0.001 ms), so it stops at the range's low end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ARGS = ["--requests", "4", "--input-tokens", "16", "--output-tokens", "4", "--warmup", "0", "--seed", "5",
        "--search-mode", "rate", "--search-range", "1:4", "--search-tolerance", "0.25", "--search-repeats", "2"]


def _sweep(url: str, criterion: str, save: Path) -> tuple[str, dict[str, object]]:
    from click.testing import CliRunner

    from quantrack.cli import cli

    res = CliRunner().invoke(cli, ["sweep", "--engine", "llamacpp", "--base-url", url, "--slo-search", criterion,
                                   *ARGS, "--save", str(save)])
    print(res.output)
    assert res.exit_code == 0, res.output
    return res.output, json.loads(save.read_text())


def test_probe_search_climbs_to_the_top_and_saves_every_probe(llamacpp_server: str, tmp_path: Path) -> None:
    out, data = _sweep(llamacpp_server, "e2e_p95<=60s", tmp_path / "top.json")
    s = data["slo_search"]
    assert isinstance(s, dict) and s["method"] == "probe" and s["mode"] == "rate"
    assert s["stop"] == "top_of_range" and s["met"] == 4.0 and s["missed"] is None
    assert [p["level"] for p in s["probes"]] == [1.0, 2.0, 4.0] and s["n_probes"] <= s["probe_bound"]
    rows = data["rows"]
    assert isinstance(rows, list) and [r["rate"] for r in rows] == [1.0, 2.0, 4.0]
    for r, p in zip(rows, s["probes"]):
        assert r["search"] is True and r["repeats"] == 2 and r["n_ok"] == 8, r["failures"]
        assert len(r["sent"]) == 2 and all(len(rep) == 4 for rep in r["sent"])  # --save: what each repeat sent
        assert len(p["repeats_ms"]) == 2 and p["value_ms"] > 0
        assert p["spread_ms"] == [min(p["repeats_ms"]), max(p["repeats_ms"])] and p["meets"] is True
        assert r["achieved_rate"] > 0 and r["completion_rate"] > 0
    assert "SLO search e2e_p95<=60s (search result, measured probes): bracket [r4 met, none up to r4 missed]" in out
    assert "probe r2: " in out and "(repeats " in out and "r4*" in out


def test_probe_search_that_never_meets_stops_at_the_low_end(llamacpp_server: str, tmp_path: Path) -> None:
    out, data = _sweep(llamacpp_server, "ttft_p95<=0.001ms", tmp_path / "never.json")
    s = data["slo_search"]
    assert isinstance(s, dict) and s["stop"] == "never_met" and s["met"] is None and s["missed"] == 1.0
    assert len(s["probes"]) == 1 and len(data["rows"]) == 1  # type: ignore[arg-type]
    assert "bracket [none (below r1) met, r1 missed]" in out and "the limit is below the range" in out
