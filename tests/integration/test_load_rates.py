"""A study with ``[sweep] rates`` end to end on a real llama.cpp server (xllamacpp, SmolLM2-135M GGUF arms):
open-loop Poisson levels with a seed and a concurrency cap, goodput against per-request SLOs, p95, two repeats,
the SLO search and llama.cpp's own /metrics and /slots scraped per level; then every one of those figures is read
back from the MLflow run, ``compare --wide`` and the report. Lean on purpose (2 shared cores): two arms, 16 tokens
in, 4 out, 4 requests a level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_rates_study_goodput_repeats_search_and_engine_metrics(
        gguf_arms: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    study = tmp_path / "study.toml"
    study.write_text(f"""
name = "cpu-rates"
context_len = 1024
parallel = 2
[model]
gguf = "{gguf_arms['Q8_0']}"
[engine]
kind = "llamacpp"
ready_timeout_s = 120.0
[gpu]
name = "cpu"
[latency]
input_tokens = 16
output_tokens = 4
warmup = 1
iterations = 2
[sweep]
rates = [0.5, 4.0]
arrival = "poisson"
seed = 3
max_concurrency = 3
requests_per_level = 4
input_tokens = 16
output_tokens = 4
goodput = "ttft:120000,tpot:60000"
slo_search = "tpot_p95<=60s"
repeats = 2
[[arms]]
name = "q8_0"
weights = "q8_0"
model = "{gguf_arms['Q8_0']}"
baseline = true
[[arms]]
name = "q4_0"
weights = "q4_0"
model = "{gguf_arms['Q4_0']}"
""", encoding="utf-8")
    main_exit = None
    try:
        main(["run", str(study), "--tracking-uri", uri, "--workdir", str(tmp_path / "work")])
    except SystemExit as exc:
        main_exit = exc.code
    captured = capsys.readouterr()
    assert main_exit in (None, 0), captured.err[-2000:]
    assert "sweep: rates [0.5, 4.0]/s (poisson)" in captured.err
    assert "SLO search tpot_p95<=60s" in captured.err

    runs = {r.arm: r for r in load_runs("cpu-rates", uri)}
    assert set(runs) == {"q8_0", "q4_0"} and all(r.status == "FINISHED" for r in runs.values())
    r = runs["q4_0"]
    m = r.metrics
    assert r.params["sweep_rates"] == "0.5,4" and r.params["sweep_arrival"] == "poisson"
    assert r.params["sweep_seed"] == "3" and r.params["sweep_max_concurrency"] == "3"
    assert r.params["sweep_repeats"] == "2" and r.params["sweep_goodput_slo"] == "ttft:120000,tpot:60000"
    for lvl in ("r0.5", "r4"):
        assert m[f"sweep_output_tps_{lvl}"] > 0 and m[f"sweep_achieved_rate_{lvl}"] > 0
        assert m[f"sweep_tpot_ms_p95_{lvl}"] >= m[f"sweep_tpot_ms_p50_{lvl}"] > 0
        # the generous SLO: every request of a finished level is good
        assert m[f"sweep_goodput_fraction_{lvl}"] == 1.0 and m[f"sweep_goodput_rps_{lvl}"] > 0
        lo, hi = m[f"sweep_output_tps_ci_low_{lvl}"], m[f"sweep_output_tps_ci_high_{lvl}"]
        assert lo <= m[f"sweep_output_tps_{lvl}"] <= hi  # mean of the two repeats inside its interval
        # llama.cpp's own view: requests processing (never above its 2 slots) from /metrics, busy slots from /slots
        # (sampled every 0.5 s: on a quiet machine SmolLM2's requests can start and end between two samples, so
        # the figure is recorded and bounded by the slots, not required to have caught a request in flight)
        assert 0 <= m[f"sweep_engine_running_max_{lvl}"] <= 2 and 0 <= m[f"sweep_engine_busy_slots_max_{lvl}"] <= 2
        assert f"sweep_engine_kv_usage_max_{lvl}" not in m  # llama.cpp serves no KV-usage gauge: not a zero
    # the open loop at 4/s on 2 slots: llama.cpp's queue length is recorded (how many it deferred depends on how
    # fast the requests ran on this machine: 0 when each finished before the next arrived)
    assert m["sweep_engine_waiting_max_r4"] >= 0
    # the search: a measured level (both meet the generous limit, so the limit is the highest one, unbounded)
    assert r.tags["quantrack.sweep_slo_search"] == "tpot_p95<=60s" and m["sweep_slo_limit"] == 4.0
    assert r.tags["quantrack.sweep_slo_search_first_miss"] == "none"

    art = Path(r.artifact_uri.removeprefix("file://")) if r.artifact_uri else None
    if art is not None and (art / "sweep" / "sweep.json").is_file():
        sweep = json.loads((art / "sweep" / "sweep.json").read_text())
        rows = sweep["rows"]
        assert [row["rate"] for row in rows] == [0.5, 4.0] and all(row["repeats"] == 2 for row in rows)
        assert all(row["server_metrics"]["unknown"]["kv_usage_max"] == "llamacpp serves no kv_usage series"
                   for row in rows)
        assert sweep["load"]["seed"] == 3 and sweep["slo_search"]["limit"] == 4.0
        assert (art / "plots" / "engine-q4_0.png").is_file()

    main(["compare", "--experiment", "cpu-rates", "--tracking-uri", uri, "--wide"])
    wide = capsys.readouterr().out
    for head in ("Sweep level", "Sweep out tok/s", "TPOT p95", "Goodput req/s", "Engine KV / run / wait",
                 "SLO limit"):
        assert head in wide
    assert "r4/s (achieved" in wide and "r4 (tpot_p95<=60s; first miss none)" in wide
    assert " [" in wide.split("r4/s (achieved", 1)[1].splitlines()[0]  # the repeat interval beside tok/s

    out = tmp_path / "report.md"
    main(["report", "--experiment", "cpu-rates", "--tracking-uri", uri, "--out", str(out), "--format", "md"])
    capsys.readouterr()
    text = out.read_text()
    from quantrack.report.page import _md  # the Markdown page escapes run text (names, log lines, reasons: #30)

    assert _md("SLO search tpot_p95<=60s: highest measured level meeting it r4") in text
    assert _md("goodput at r4:") in text and _md("engine at r4: ") in text
