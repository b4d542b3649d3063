"""``quantrack sweep --dataset shared-prefix`` and ``multi-turn`` end to end on the real llama.cpp server
(conftest's SmolLM2 server, 2 slots, f16 KV): token ids from its /tokenize, its answers resent as history, its own
/metrics counters read for the level's prefix-cache hit rate. Bounded: 6 requests a level, 32 tokens in, 6 out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_shared_prefix_sweep_saves_what_it_sent(llamacpp_server: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from quantrack.cli import cli

    out = tmp_path / "sp.json"
    res = CliRunner().invoke(cli, ["sweep", "--engine", "llamacpp", "--base-url", llamacpp_server,
                                   "--concurrency", "2", "--requests", "6", "--input-tokens", "32",
                                   "--output-tokens", "6", "--warmup", "0", "--dataset", "shared-prefix",
                                   "--prefix-groups", "2", "--prefix-tokens", "24", "--seed", "11",
                                   "--save", str(out)])
    print(res.output)
    assert res.exit_code == 0, res.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["n_ok"] == 6 and row["workload"]["dataset"] == "shared-prefix" and row["workload"]["seed"] == 11
    sent = row["sent"]
    assert [s["group"] for s in sent] == [0, 1, 0, 1, 0, 1] and all(len(s["prompt"]) == 32 for s in sent)
    for g in (0, 1):
        prompts = [s["prompt"] for s in sent if s["group"] == g]
        assert all(p[:24] == prompts[0][:24] for p in prompts) and len({tuple(p[24:]) for p in prompts}) == 3
    # the server counted exactly the tokens sent (usage.prompt_tokens; a mismatch would be a note on the sample)
    hit = row["prefix_cache_hit_rate"]
    assert hit is not None and 0 <= hit <= 1, row["prefix_cache"]
    assert "prefix hit" in res.output


def test_multi_turn_resends_history_and_the_cache_answers_it(llamacpp_server: str) -> None:
    from quantrack.measure.sweep import LoadOptions, run_sweep

    res = run_sweep(llamacpp_server, "llamacpp", [2], requests_per_level=6, input_tokens=32, output_tokens=6,
                    warmup=0, load=LoadOptions(dataset="multi-turn", turns=3, keep_sent=True, seed=4))
    row = res.rows[0]
    assert row["n_ok"] == 6, row["failures"]
    sent = {(s["group"], s["turn"]): s for s in row["sent"]}
    for c in (0, 1):
        p1, p2, p3 = (sent[(c, t)]["prompt"] for t in (1, 2, 3))
        assert p2[: len(p1)] == p1 and p3[: len(p2)] == p2  # each turn holds the whole history
        assert len(p1) == 32 and len(p2) > 32 + 32 and len(p3) > len(p2) + 32  # + the answer + a new message
        assert sent[(c, 3)]["input_tokens"] == len(p3)
    # turns 2 and 3 start with what the slot just processed: llama.cpp's cache answers part of each prefill
    hit = row["prefix_cache_hit_rate"]
    assert hit is not None and hit > 0, row["prefix_cache"]
    print(json.dumps(row["prefix_cache"]))


def test_trace_replays_its_records_at_their_times(llamacpp_server: str, tmp_path: Path) -> None:
    from quantrack.measure.sweep import LoadOptions, run_sweep

    trace = tmp_path / "t.jsonl"  # the Mooncake format; hash id 0 shared by the first two records
    rows = [{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [0]},
            {"timestamp": 300, "input_length": 24, "output_length": 3, "hash_ids": [0, 1]},
            {"timestamp": 600, "input_length": 12, "output_length": 2}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res = run_sweep(llamacpp_server, "llamacpp", [], rates=[2 / 0.6], input_tokens=32, output_tokens=6, warmup=0,
                    load=LoadOptions(dataset="trace", trace=str(trace), keep_sent=True))
    row = res.rows[0]
    assert row["n_ok"] == 3 and row["requests"] == 3, row["failures"]  # every record, no --requests
    sent = sorted(row["sent"], key=lambda s: s["i"])
    assert [len(s["prompt"]) for s in sent] == [20, 24, 12] and [s["output_tokens"] for s in sent] == [4, 3, 2]
    assert [s["due_s"] for s in sent] == pytest.approx([0.0, 0.3, 0.6])  # its own rate: the recorded times
    assert all(abs(s["sent_s"] - s["due_s"]) < 0.25 for s in sent), sent
    assert row["workload"]["native_rate"] == pytest.approx(2 / 0.6)
