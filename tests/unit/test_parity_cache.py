"""bench/parity_vllm_bench.py: each run's prefix-cache hit rate from the engine's /metrics, and the refusal to
print a ratio when the two runs' hit rates differ (a cache would otherwise decide the verdict: issue 40).

Real /metrics text: tests/data/real/vllm-h200/metrics-bf16.txt (vLLM 0.25.0 on an H200, from the shared data; it
holds the ``vllm:cache_config_info`` sample only) and tests/data/real/llamacpp-cpu/metrics-*.txt (xllamacpp). No
real vLLM text with the prefix-cache counters is in the shared data, so their samples are filled in on top of the
real vLLM text from the names vLLM declares (``Counter(name="vllm:prefix_cache_queries")`` and
``"vllm:prefix_cache_hits"`` in ``vllm/v1/metrics/loggers.py``) in prometheus_client's text format, which appends
``_total`` to a counter's name and exposes a ``_created`` sample beside it, with vLLM's ``engine`` and
``model_name`` labels (as on the cache_config_info line)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
BENCH = HERE.parent / "bench" / "parity_vllm_bench.py"
REAL = HERE / "data" / "real"
VLLM_REAL = REAL / "vllm-h200" / "metrics-bf16.txt"
LABELS = '{engine="0",model_name="llama3-8b"}'


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("parity_vllm_bench", BENCH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _bench()


def _vllm_text(queries: float | None, hits: float | None) -> str:
    """The real vLLM 0.25 text plus the prefix-cache counter samples (HELP/TYPE, _total, _created)."""
    out = VLLM_REAL.read_text(encoding="utf-8").rstrip("\n") + "\n"
    for name, v, doc in (("queries", queries, "Prefix cache queries, in terms of number of queried tokens."),
                         ("hits", hits, "Prefix cache hits, in terms of number of cached tokens.")):
        if v is not None:
            out += (f"# HELP vllm:prefix_cache_{name}_total {doc}\n# TYPE vllm:prefix_cache_{name}_total counter\n"
                    f"vllm:prefix_cache_{name}_total{LABELS} {v}\n"
                    f"vllm:prefix_cache_{name}_created{LABELS} 1.7537953269352946e+09\n")
    return out


def test_vllm_text_without_the_hits_counter_gives_unknown_never_zero() -> None:
    c = bench.cache_counters(_vllm_text(32.0, None), "vllm")  # type: ignore[attr-defined]
    assert c == {"hits": None, "queries": None, "missing": "vllm:prefix_cache_hits_total"}
    r = bench.hit_rate(c, c)  # type: ignore[attr-defined]
    assert r["hit_rate"] is None and r["why"] == "/metrics has no vllm:prefix_cache_hits_total"


def test_hit_rate_is_the_counter_increase_over_the_run() -> None:
    before = bench.cache_counters(_vllm_text(32.0, 0.0), "vllm")  # type: ignore[attr-defined]
    assert before == {"hits": 0.0, "queries": 32.0, "missing": None}  # _created samples are not the counter
    # a run that queried 1,024,000 prompt tokens, 512,000 of them from the cache
    after = bench.cache_counters(_vllm_text(32.0 + 1_024_000, 512_000.0), "vllm")  # type: ignore[attr-defined]
    r = bench.hit_rate(before, after)  # type: ignore[attr-defined]
    assert r == {"hit_rate": 0.5, "hits": 512_000.0, "queries": 1_024_000.0}
    # the server totals (988,288 hits of 10.8 M queried) are cumulative: only the increase is the run's
    idle = bench.hit_rate(after, after)  # type: ignore[attr-defined]
    assert idle["hit_rate"] is None and idle["why"] == "no prompt tokens were counted during the run"
    restarted = bench.hit_rate(after, before)  # type: ignore[attr-defined]
    assert restarted["hit_rate"] is None and "went down" in restarted["why"]


def test_llamacpp_counters_are_cached_over_cached_plus_uncached() -> None:
    # the real xllamacpp text: prompt_tokens_total 45 (not from cache), prompt_tokens_cached_total 84
    text = (REAL / "llamacpp-cpu" / "metrics-F16-kvf16.txt").read_text(encoding="utf-8")
    c = bench.cache_counters(text, "llamacpp")  # type: ignore[attr-defined]
    assert c == {"hits": 84.0, "queries": 129.0, "missing": None}


def test_prefix_caching_flag_from_the_real_vllm_cache_config() -> None:
    assert bench.prefix_caching_enabled(VLLM_REAL.read_text(encoding="utf-8")) is True  # type: ignore[attr-defined]
    llama = (REAL / "llamacpp-cpu" / "metrics-F16-kvf16.txt").read_text(encoding="utf-8")
    assert bench.prefix_caching_enabled(llama) is None  # type: ignore[attr-defined]


def test_a_ratio_is_refused_when_the_hit_rates_differ() -> None:
    verdict = bench.cache_verdict  # type: ignore[attr-defined]
    q = {"hit_rate": 0.0}
    assert verdict(q, {"hit_rate": 0.04}, 0.05) is None
    # issue 40: quantrack's prompts salted (0), the peer's re-sent with its default seed (0.46 at c64)
    why = verdict(q, {"hit_rate": 0.46}, 0.05)
    assert why == ("prefix-cache hit rates differ: quantrack 0.000, reference 0.460 (|diff| 0.460 > tolerance "
                   "0.05): the ratio would measure the cache, not the client")
    unknown = verdict(q, {"hit_rate": None, "why": "a saved result: its server's counters were not read"}, 0.05)
    assert unknown == ("the reference's prefix-cache hit rate is unknown (a saved result: its server's counters "
                       "were not read): a ratio could be the cache's")
    assert verdict(q, {"hit_rate": None, "why": "x"}, 0.05, accept_unknown=True) is None


def test_summary_leaves_refused_rounds_out_and_says_why() -> None:
    def rnd(tok_q: float, tok_r: float, hq: float, hr: float) -> dict[str, object]:
        qc, rc = {"hit_rate": hq}, {"hit_rate": hr}
        return {"quantrack": {"output_tok_s": tok_q, "median_ttft_ms": 10.0, "median_tpot_ms": 5.0,
                              "client_cpu_ms_per_token": 0.1},
                "reference": {"output_tok_s": tok_r, "median_ttft_ms": 10.0, "median_tpot_ms": 5.0},
                "quantrack_cache": qc, "reference_cache": rc,
                "refused": bench.cache_verdict(qc, rc, 0.05)}  # type: ignore[attr-defined]

    s = bench.summary([rnd(98.0, 100.0, 0.0, 0.01), rnd(50.0, 100.0, 0.0, 0.46)])  # type: ignore[attr-defined]
    assert s["ratio_output_tok_s"] == pytest.approx(0.98) and s["rounds_compared"] == 1
    assert s["ratio_output_tok_s_range"] == [pytest.approx(0.98), pytest.approx(0.98)]
    assert s["refused"] and "0.460" in s["refused"][0]
    none = bench.summary([rnd(50.0, 100.0, 0.0, 0.46)])  # type: ignore[attr-defined]
    assert none["ratio_output_tok_s"] is None and none["rounds_compared"] == 0
    res = {"reference": "vllm", "hit_rate_tolerance": 0.05,
           "levels": [{"concurrency": 64, "rounds": [rnd(50.0, 100.0, 0.0, 0.46)], **none}]}
    text = bench.render(res)  # type: ignore[attr-defined]
    assert "c64: NO RATIO for a round: prefix-cache hit rates differ" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--concurrency", "1,x", "--base-url", "http://127.0.0.1:9"],
     "--concurrency: expected comma-separated integers >= 1, got '1,x'"),
    (["--hit-rate-tolerance", "2", "--base-url", "http://127.0.0.1:9"],
     "--hit-rate-tolerance must be in [0, 1] (got 2.0)"),
    (["--requests", "nope"], "argument --requests: invalid int value: 'nope'"),
    ([], "give --base-url URL or --llamacpp"),
    (["--reference", "vllm", "--base-url", "http://127.0.0.1:9"],
     "--reference vllm needs --model (the name vllm bench serve sends)"),
    (["--reference", "vllm-json", "--concurrency", "1,2", "--vllm-json", "a.json", "--base-url", "http://x:1"],
     "--reference vllm-json needs one --vllm-json file per level (2), got 1"),
])
def test_bad_inputs_are_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)  # type: ignore[attr-defined]
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == f"parity_vllm_bench: error: {message}\n"


def test_a_bad_json_path_is_refused_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the server URL points nowhere: had the script measured first, it would fail on the connection instead
    for path, why in ((tmp_path / "missing" / "r.json", f"the folder {tmp_path / 'missing'} does not exist"),
                      (tmp_path, "is a folder, not a file")):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--base-url", "http://127.0.0.1:9", "--json", str(path)])  # type: ignore[attr-defined]
        assert exc.value.code == 2
        assert capsys.readouterr().err == f"parity_vllm_bench: error: --json {path}: {why}\n"
    assert list(tmp_path.iterdir()) == []  # nothing created
