"""Bad input, every command: one line on stderr, exit 2, no traceback, nothing created.

A table of (command line, words the one line must contain). Each case runs ``quantrack.cli.main`` in a fresh
working directory with its own tracking store and spool, then checks:

* exit code 2;
* stderr is exactly one line, ``quantrack: error: ...``, containing the expected words (the flag or the file);
* no traceback and not the CLI's last-resort line for a bug ("unexpected X ... (a bug: ...)");
* nothing was created: the working directory, the store folder and the spool are as before.

Servers that answer garbage (not JSON, not text) are local fixtures on 127.0.0.1: they test quantrack's error
path only (a server that is not the engine it was said to be is a bad ``--base-url``/``--tracking-uri``).
Study keys are checked through the CLI (``quantrack preflight --study bad.toml``), whoever owns the schema.
``docs/reliability.md`` has the figures.
"""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from quantrack.cli import main

REPO = Path(__file__).resolve().parents[2]
CPU_STUDY = REPO / "examples" / "cpu-smollm2.toml"
BINARY = bytes(range(256)) * 4  # not UTF-8, not TOML, not JSON


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


class _Garbage(BaseHTTPRequestHandler):
    """HTTP 200 with bytes that are neither JSON nor UTF-8 on every path."""

    def _answer(self) -> None:
        body = b"\x00\xff\xfe garbage {{"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def garbage_url() -> Iterator[str]:
    srv, url = _serve(_Garbage)
    yield url
    srv.shutdown()
    srv.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _study(text_from: str, old: str, new: str) -> str:
    text = Path(text_from).read_text(encoding="utf-8")
    assert old in text, old
    return text.replace(old, new, 1)


# study-key cases: (file name, (old, new) edit of the CPU study, expected words)
STUDY_EDITS: list[tuple[str, tuple[str, str], str]] = [
    ("task-mmlu", ('task = "gsm8k"', 'task = "mmlu"'), "mmlu"),
    ("num-questions-neg", ("num_questions = 10 ", "num_questions = -4 "), "num_questions"),
    ("style-bogus", ('task = "gsm8k"', 'task = "gsm8k"\nstyle = "bogus"'), "style"),
    ("eval-concurrency-0", ("concurrency = 4\n", "concurrency = 0\n"), "concurrency"),
    ("kl-top-k-500", ("top_k = 20 }", "top_k = 500 }"), "top_k"),
    ("requests-per-level-neg", ("requests_per_level = 8", "requests_per_level = -3"), "requests_per_level"),
    ("sweep-trace-missing", ("requests_per_level = 8", 'requests_per_level = 8\ndataset = "trace"'),
     "[sweep] dataset trace needs trace FILE"),
    ("ready-timeout-neg", ("ready_timeout_s = 120.0", "ready_timeout_s = -5.0"), "ready_timeout_s"),
    ("ready-timeout-nan", ("ready_timeout_s = 120.0", "ready_timeout_s = nan"), "ready_timeout_s"),
    ("request-timeout-neg", ("ready_timeout_s = 120.0", "ready_timeout_s = 120.0\nrequest_timeout_s = -1.0"),
     "request_timeout_s"),
    ("request-timeout-nan", ("ready_timeout_s = 120.0", "ready_timeout_s = 120.0\nrequest_timeout_s = nan"),
     "request_timeout_s"),
    ("request-timeout-str", ("ready_timeout_s = 120.0", 'ready_timeout_s = 120.0\nrequest_timeout_s = "10"'),
     "request_timeout_s"),
    ("port-70000", ('kind = "llamacpp"', 'kind = "llamacpp"\nport = 70000'), "port"),
    ("sweep-concurrency-str", ("concurrency = [1, 2, 4]", 'concurrency = ["a", "b"]'), "concurrency"),
    ("engine-args-int", ('kind = "llamacpp"', 'kind = "llamacpp"\nargs = [1, 2]'), "args"),
    ("arm-env-str", ('baseline = true\n', 'baseline = true\nenv = "FOO=1"\n'), "env"),
    ("engine-kind-bogus", ('kind = "llamacpp"', 'kind = "llamacp"'), "llamacp"),
    ("latency-output-1", ("output_tokens = 32", "output_tokens = 1"), "latency"),
    ("gpu-util-2", ('name = "x86-cpu"', 'name = "x86-cpu"\nutil = 2.0'), "util"),
    # issue #30: names become paths (work folder, server logs, records, plots, exported files)
    ("name-dotdot", ('name = "cpu-smollm2"', 'name = "../x"'), "'/'"),
    ("name-absolute", ('name = "cpu-smollm2"', 'name = "/some/dir"'), "/some/dir"),
    ("name-dot", ('name = "cpu-smollm2"', 'name = ".."'), "'..'"),
    ("name-5000", ('name = "cpu-smollm2"', 'name = "' + "x" * 5000 + '"'), "5000 characters"),
    ("experiment-5000", ('[model]', '[tracking]\nexperiment = "' + "e" * 5000 + '"\n\n[model]'), "5000 characters"),
    ("arm-escape", ('name = "Q8_0"\n', 'name = "../escape"\n'), "../escape"),
    ("arm-slash", ('name = "Q8_0"\n', 'name = "f/16"\n'), "f/16"),
    ("arm-nul", ('name = "Q8_0"\n', 'name = "a\\u0000b"\n'), "NUL"),
    ("arm-backslash", ('name = "Q8_0"\n', 'name = "a\\\\b"\n'), "name"),
    # issue #30: numbers a machine cannot hold, strings for numbers, non-ASCII digits
    ("iterations-2^64", ("iterations = 5", "iterations = 18446744073709551616"), "iterations"),
    ("warmup-2^64", ("warmup = 2", "warmup = 18446744073709551616"), "warmup"),
    ("requests-2^64", ("requests_per_level = 8", "requests_per_level = 18446744073709551616"), "requests_per_level"),
    ("sweep-concurrency-2^64", ("concurrency = [1, 2, 4]", "concurrency = [1, 18446744073709551616]"), "concurrency"),
    # keys added in round four (#28 load, #26 KV fidelity)
    ("sweep-rates-negative", ("concurrency = [1, 2, 4]", "concurrency = [1, 2, 4]\nrates = [-1.0]"), "rates"),
    ("sweep-max-concurrency-negative", ("concurrency = [1, 2, 4]", "concurrency = [1, 2, 4]\nmax_concurrency = -1"),
     "max_concurrency"),
    ("sweep-arrival-unknown", ("concurrency = [1, 2, 4]", 'concurrency = [1, 2, 4]\narrival = "bursty"'), "arrival"),
    ("eval-concurrency-2^64", ("concurrency = 4\n", "concurrency = 18446744073709551616\n"), "concurrency"),
    ("max-tokens-2^64", ("max_tokens = 128", "max_tokens = 18446744073709551616"), "max_tokens"),
    ("parallel-2^64", ("parallel = 4", "parallel = 18446744073709551616"), "parallel"),
    ("num-questions-2^64", ("num_questions = 10 ", "num_questions = 18446744073709551616 "), "num_questions"),
    ("context-2^64", ("context_len = 4096", "context_len = 18446744073709551616"), "context_len"),
    ("max-kl-string", ("max_kl = 0.01", 'max_kl = "0.01"'), "not a string"),
    ("slo-arabic-digit", ('"tpot_p90<=60ms@4"', '"tpot_p90<=60ms@\u0664"'), "slo"),
    ("slo-long-digits", ('"tpot_p90<=60ms@4"', '"tpot_p90<=' + "1" * 100000 + 'ms@4"'), "at most 200"),
    ("budget-long-digits", ('max_accuracy_drop = "1pp"', 'max_accuracy_drop = "' + "1" * 100000 + 'pp"'),
     "at most 200"),
    # keys added for the budget verdict (#37): pools, order, budget
    ("eval-task-unknown-pool", ('task = "gsm8k"', 'task = "gsm8k-bogus"'), "gsm8k-bogus"),
    ("eval-order-unknown", ('task = "gsm8k"', 'task = "gsm8k"\norder = "random"'), "order"),
    ("eval-budget-words", ('task = "gsm8k"', 'task = "gsm8k"\norder = "shuffled"\nbudget = "lots"'), "budget"),
    ("eval-budget-negative", ('task = "gsm8k"', 'task = "gsm8k"\norder = "shuffled"\nbudget = "-1pp"'), "budget"),
    ("eval-budget-natural-order", ('task = "gsm8k"', 'task = "gsm8k"\nbudget = "1pp"'), "shuffled"),
    ("eval-pool-past-test-split", ("num_questions = 10 ", "num_questions = 1320 "), "the gsm8k pool has 1319"),
    ("eval-pool-past-all", ('task = "gsm8k"\nnum_questions = 10 ', 'task = "gsm8k-all"\nnum_questions = 8788 '),
     "the gsm8k-all pool has 8787"),
    ("eval-train-pool-lm-eval", ('task = "gsm8k"', 'task = "gsm8k-train"\nstyle = "lm-eval"'), "style"),
    # the SLO search that measures (#40): every probe key checked before anything starts
    ("sweep-search-mode-unknown", ("requests_per_level = 8", 'requests_per_level = 8\nsearch_mode = "binary"'),
     "search_mode"),
    ("sweep-search-no-criterion", ("requests_per_level = 8", ('requests_per_level = 8\nsearch_mode = "rate"\n'
                                   'search_range = "0.5:4"')), "[sweep] search_mode rate needs [sweep] slo_search"),
    ("sweep-search-no-range", ("requests_per_level = 8", ('requests_per_level = 8\nsearch_mode = "rate"\n'
                               'slo_search = "ttft_p95<=1s"')), "[sweep] search_mode rate needs [sweep] search_range"),
    ("sweep-search-range-reversed", ("requests_per_level = 8", ('requests_per_level = 8\nsearch_mode = "rate"\n'
                                     'slo_search = "ttft_p95<=1s"\nsearch_range = "8:1"')),
     "[sweep] search_range '8:1': LOW and HIGH"),
    ("sweep-search-range-measured", ("requests_per_level = 8", 'requests_per_level = 8\nsearch_range = "1:8"'),
     "[sweep] search_range applies to [sweep] search_mode rate or concurrency"),
    ("sweep-search-tolerance-1", ("requests_per_level = 8", "requests_per_level = 8\nsearch_tolerance = 1.0"),
     "search_tolerance"),
    ("sweep-search-repeats-0", ("requests_per_level = 8", "requests_per_level = 8\nsearch_repeats = 0"),
     "search_repeats"),
]
# (id, argv, words). Placeholders: {bin} a binary file, {missing} a path that does not exist, {nodir} a
# path in a folder that does not exist, {file} an existing text file, {study} the CPU study, {garbage} a
# server answering garbage, {closed} a URL where nothing listens.
CASES: list[tuple[str, list[str], str]] = [
    # usage errors: one line instead of click's Usage/Try/Error block
    ("top-unknown-option", ["--bogus"], "--bogus"),
    ("unknown-command", ["nosuchcmd"], "nosuchcmd"),
    ("plan-unknown-option", ["plan", "--nope"], "--nope"),
    ("latency-int-not-int", ["latency", "--input-tokens", "abc"], "--input-tokens"),
    ("server-bad-engine", ["server", "info", "--engine", "x", "--base-url", "http://127.0.0.1:1"], "--engine"),
    ("eval-bad-style", ["eval", "--style", "bogus", "--base-url", "{closed}"], "--style"),
    ("run-missing-arg", ["run"], "STUDY.toml"),
    ("log-missing-required", ["log", "--arm", "x"], "--study"),
    ("compare-missing-experiment", ["compare"], "--experiment"),
    ("probe-repeats-range", ["probe", "--repeats", "0"], "--repeats"),
    # options added in round four (#28 load, #26 KV fidelity)
    ("sweep-range-ratio-out", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                               "--random-range-ratio", "2"], "--random-range-ratio"),
    ("sweep-dataset-unknown", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                               "--dataset", "sharegptx"], "--dataset"),
    ("eval-kl-method-unknown", ["eval", "kl", "--method", "sideways"], "--method"),
    # workloads (#40): each file and option checked before the server is asked anything
    ("sweep-trace-missing", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                             "--dataset", "trace"], "--dataset trace needs --trace FILE"),
    ("sweep-trace-no-file", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                             "--dataset", "trace", "--trace", "{missing}"], "no such file"),
    ("sweep-trace-binary", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                            "--dataset", "trace", "--trace", "{bin}"], "--trace"),
    ("sweep-lengths-garbage", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                               "--dataset", "length-mix", "--lengths", "{file}"], "--lengths"),
    ("sweep-prefix-too-long", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                               "--dataset", "shared-prefix", "--input-tokens", "16", "--prefix-tokens", "16"],
     "--prefix-tokens must be >= 1 and below --input-tokens 16"),
    # the SLO search that measures (#40)
    ("sweep-search-mode-unknown", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                                   "ttft_p95<=1s", "--search-mode", "binary"], "--search-mode"),
    ("sweep-search-no-range", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                               "ttft_p95<=1s", "--search-mode", "rate"], "--search-mode rate needs --search-range"),
    ("sweep-search-no-criterion", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--search-mode",
                                   "rate", "--search-range", "1:4"], "--search-mode rate needs --slo-search"),
    ("sweep-search-range-bad", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                                "ttft_p95<=1s", "--search-mode", "rate", "--search-range", "4:x"],
     "--search-range '4:x'"),
    ("sweep-search-range-measured", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                                     "--slo-search", "ttft_p95<=1s", "--search-range", "1:4"],
     "--search-range applies to --search-mode rate or concurrency"),
    ("sweep-search-tolerance-0", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                                  "ttft_p95<=1s", "--search-mode", "rate", "--search-range", "1:4",
                                  "--search-tolerance", "0"], "--search-tolerance"),
    ("sweep-search-repeats-0", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                                "ttft_p95<=1s", "--search-mode", "rate", "--search-range", "1:4",
                                "--search-repeats", "0"], "--search-repeats"),
    ("sweep-search-concurrency-fraction", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--slo-search",
                                           "ttft_p95<=1s", "--search-mode", "concurrency", "--search-range",
                                           "1.5:8", "--save", "out.json"], "concurrency levels are whole numbers"),
    ("sweep-turns-0", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                       "--dataset", "multi-turn", "--turns", "0"], "--turns"),
    # plan / preflight / rules / catalog / logs
    ("plan-binary-config", ["plan", "--config", "{bin}", "--gpu", "H100"], "config"),
    ("plan-missing-config", ["plan", "--config", "{missing}", "--gpu", "H100"], "missing"),
    ("plan-binary-gguf", ["plan", "--gguf", "{bin}", "--gpu", "H100"], "gguf"),
    ("plan-unknown-model", ["plan", "--model", "Llama-3-9B", "--gpu", "H100"], "Llama-3-9B"),
    ("plan-util-2", ["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--util", "2"], "util"),
    ("plan-vram-neg", ["plan", "--model", "Llama-3-8B", "--vram", "-1"], "vram"),
    ("preflight-binary-study", ["preflight", "--study", "{bin}"], "TOML"),
    ("preflight-missing-study", ["preflight", "--study", "{missing}"], "missing"),
    ("preflight-binary-config", ["preflight", "--config", "{bin}", "--gpu", "H100", "--arm", "bf16"], "config"),
    ("preflight-unknown-gpu", ["preflight", "--gpu", "H1000", "--model", "Llama-3-8B", "--arm", "bf16"], "H1000"),
    ("preflight-tp-0", ["preflight", "--gpu", "H100", "--model", "Llama-3-8B", "--arm", "bf16", "--tp", "0"], "tp"),
    ("rules-explain-unknown", ["rules", "explain", "no-such-rule"], "no-such-rule"),
    ("catalog-unknown", ["catalog", "nope"], "nope"),
    ("logs-parse-missing", ["logs", "parse", "{missing}"], "missing"),
    # serve / server info
    ("serve-missing-gguf", ["serve", "--engine", "llamacpp", "--model", "{missing}", "--arm", "q4_0", "--dry-run"],
     "missing"),
    ("serve-parallel-0", ["serve", "--engine", "llamacpp", "--model", "{file}", "--arm", "q4_0", "--parallel", "0",
                          "--dry-run"], "parallel"),
    ("serve-port-70000", ["serve", "--engine", "llamacpp", "--model", "{file}", "--arm", "q4_0", "--port", "70000",
                          "--dry-run"], "port"),
    ("server-timeout-neg", ["server", "info", "--engine", "vllm", "--base-url", "{closed}", "--timeout", "-1"],
     "--timeout"),
    ("server-timeout-nan", ["server", "info", "--engine", "vllm", "--base-url", "{closed}", "--timeout", "nan"],
     "--timeout"),
    ("server-ftp-url", ["server", "info", "--engine", "vllm", "--base-url", "ftp://x"], "--base-url"),
    ("server-garbage", ["server", "info", "--engine", "llamacpp", "--base-url", "{garbage}"], "--base-url"),
    # latency / sweep
    ("latency-timeout-nan", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--timeout", "nan"],
     "--timeout"),
    ("latency-timeout-0", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--timeout", "0"],
     "--timeout"),
    ("latency-timeout-inf", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--timeout", "inf"],
     "--timeout"),
    ("latency-merge-binary", ["latency", "--merge", "{bin}"], "bin"),
    ("latency-merge-missing", ["latency", "--merge", "{missing}"], "missing"),
    ("latency-save-nodir", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--save", "{nodir}"],
     "--save"),
    ("latency-garbage", ["latency", "--engine", "llamacpp", "--base-url", "{garbage}", "--warmup", "0",
                         "--iterations", "1"], "--base-url"),
    ("latency-not-url", ["latency", "--engine", "llamacpp", "--base-url", "not a url"], "--base-url"),
    ("latency-unknown-engine", ["latency", "--engine", "vlm", "--base-url", "{closed}"], "vlm"),
    ("latency-stray-file", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "{file}"], "--merge"),
    ("latency-output-1", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--output-tokens", "1"],
     "output"),
    ("sweep-timeout-nan", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "1",
                           "--timeout", "nan"], "--timeout"),
    ("sweep-concurrency-0", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "0"],
     "concurrency"),
    ("sweep-concurrency-str", ["sweep", "--engine", "llamacpp", "--base-url", "{closed}", "--concurrency", "a,b"],
     "concurrency"),
    # eval and its sub-commands
    ("eval-task-mmlu", ["eval", "--task", "mmlu", "--base-url", "{closed}"], "mmlu"),
    ("eval-order-unknown", ["eval", "--order", "random", "--base-url", "{closed}"], "--order"),
    ("eval-pool-past-test", ["eval", "--num-questions", "2000", "--base-url", "{closed}"], "--num-questions"),
    ("eval-train-pool-lm-eval", ["eval", "--task", "gsm8k-all", "--style", "lm-eval", "--base-url", "{closed}"],
     "first_n"),
    ("eval-compare-budget-words", ["eval", "compare", "{file}", "{file}", "--budget", "lots"], "--budget"),
    ("eval-compare-sequential-alone", ["eval", "compare", "{file}", "{file}", "--sequential"], "--budget"),
    ("compare-budget-negative", ["compare", "--experiment", "x", "--budget", "-3pp"], "--budget"),
    ("eval-timeout-neg", ["eval", "--base-url", "{closed}", "--timeout", "-1"], "--timeout"),
    ("eval-num-questions-neg", ["eval", "--base-url", "{closed}", "--num-questions", "-4"], "--num-questions"),
    ("eval-output-nodir", ["eval", "--base-url", "{closed}", "--output", "{nodir}"], "--output"),
    ("eval-no-base-url", ["eval", "--num-questions", "3"], "--base-url"),
    ("eval-import-binary", ["eval", "import", "{bin}"], "bin"),
    ("eval-import-missing", ["eval", "import", "{missing}"], "missing"),
    ("eval-compare-binary", ["eval", "compare", "{bin}", "{bin}"], "bin"),
    ("eval-kl-texts-binary", ["eval", "kl", "--baseline", "{closed}", "--candidate", "{closed}", "--engine",
                              "llamacpp", "--texts", "{bin}"], "bin"),
    ("eval-kl-timeout-nan", ["eval", "kl", "--baseline", "{closed}", "--candidate", "{closed}", "--engine",
                             "llamacpp", "--timeout", "nan"], "--timeout"),
    ("eval-kl-out-nodir", ["eval", "kl", "--baseline", "{closed}", "--candidate", "{closed}", "--engine",
                           "llamacpp", "--out", "{nodir}"], "--out"),
    ("eval-kl-top-k-500", ["eval", "kl", "--baseline", "{closed}", "--candidate", "{closed}", "--engine",
                           "llamacpp", "--top-k", "500"], "--top-k"),
    # run / log / compare / audit / sync
    ("run-binary-study", ["run", "{bin}"], "TOML"),
    ("run-missing-study", ["run", "{missing}"], "missing"),
    ("run-bogus-tracking", ["run", "{study}", "--tracking-uri", "bogus://x"], "bogus"),
    ("run-plain-path-tracking", ["run", "{study}", "--tracking-uri", "mlruns"], "--tracking-uri"),
    ("run-unknown-arm", ["run", "{study}", "--arm", "Q9_9"], "Q9_9"),
    ("run-workdir-under-file", ["run", "{study}", "--workdir", "{file}/sub"], "plain.txt/sub"),
    # --eval goes through the one importer (quantrack.accuracy.importers), which names the file
    ("log-binary-eval", ["log", "--study", "{study}", "--arm", "Q8_0", "--eval", "{bin}"], "bin.dat: not valid JSON"),
    ("log-unknown-arm", ["log", "--study", "{study}", "--arm", "Q9_9", "--eval", "{file}"], "Q9_9"),
    ("log-bogus-tracking", ["log", "--study", "{study}", "--arm", "Q8_0", "--tracking-uri", "bogus://x"], "bogus"),
    ("compare-bogus-tracking", ["compare", "--experiment", "x", "--tracking-uri", "bogus://x"], "bogus"),
    ("compare-garbage-tracking", ["compare", "--experiment", "x", "--tracking-uri", "{garbage}"],
     "--tracking-uri"),
    ("compare-timeout-nan", ["compare", "--experiment", "x", "--tracking-uri", "{closed}", "--timeout", "nan"],
     "--timeout"),
    ("compare-no-host", ["compare", "--experiment", "x", "--tracking-uri", "http://"], "--tracking-uri"),
    ("compare-wide-not-table", ["compare", "--experiment", "x", "--wide", "--format", "md"], "--wide"),
    ("run-quick-missing-study", ["run", "{missing}", "--quick"], "missing"),
    ("audit-missing-logs", ["audit", "--logs", "{missing}"], "missing"),
    ("audit-bogus-tracking", ["audit", "--experiment", "x", "--tracking-uri", "bogus://x"], "bogus"),
    ("sync-bogus-tracking", ["sync", "--tracking-uri", "bogus://x"], "bogus"),
    # report
    ("report-bogus-tracking", ["report", "--experiment", "x", "--tracking-uri", "bogus://x"], "bogus"),
    ("report-bad-slo", ["report", "--experiment", "x", "--slo", "tpot<=fast"], "--slo"),
    ("report-binary-study", ["report", "--experiment", "x", "--study", "{bin}"], "TOML"),
    ("report-binary-prices", ["report", "--experiment", "x", "--prices", "{bin}"], "bin"),
    ("report-out-nodir", ["report", "--experiment", "x", "--out", "{nodir}"], "--out"),
    # probe / export
    ("probe-batch-str", ["probe", "--batch", "abc"], "batch"),
    ("probe-unknown-model", ["probe", "--model", "Llama-3-9B"], "Llama-3-9B"),
    ("export-binary-study", ["export", "skypilot", "{bin}", "--out", "sky"], "TOML"),
    ("export-out-is-file", ["export", "skypilot", "{study}", "--out", "{file}"], "--out"),
    # issue #30: refused up front, not after a request, a hang or a store created
    ("latency-input-tokens-1e9", ["latency", "--engine", "llamacpp", "--base-url", "{closed}", "--input-tokens",
                                  "1000000000"], "--input-tokens"),
    ("eval-temperature-nan", ["eval", "--base-url", "{closed}", "--temperature", "nan"], "--temperature"),
    ("eval-temperature-neg", ["eval", "--base-url", "{closed}", "--temperature", "-1"], "--temperature"),
    ("reconcile-llamacpp-tp", ["logs", "reconcile", str(REPO / "tests/data/real/llamacpp-cpu/xllamacpp-F16-kvf16.log"), "--model", "SmolLM2-135M",
                               "--tp", "2"], "--tp"),
    ("reconcile-llamacpp-vram-util", ["logs", "reconcile", str(REPO / "tests/data/real/llamacpp-cpu/xllamacpp-F16-kvf16.log"), "--model",
                                      "SmolLM2-135M", "--vram", "24GiB", "--util", "0.5"], "--vram, --util"),
    ("verify-missing-experiment", ["verify"], "--experiment"),
    ("verify-new-sqlite", ["verify", "--experiment", "x", "--tracking-uri", "sqlite:///{work}/new/dir/mlflow.db"],
     "no tracking store"),
    ("verify-bad-format", ["verify", "--experiment", "x", "--format", "xml"], "--format"),
    ("compare-new-sqlite", ["compare", "--experiment", "x", "--tracking-uri", "sqlite:///{work}/new/dir/mlflow.db"],
     "no tracking store"),
    ("report-new-sqlite", ["report", "--experiment", "x", "--tracking-uri", "sqlite:///{work}/new/dir/m.db",
                           "--out", "{work}/r.html"], "no tracking store"),
    ("audit-new-sqlite", ["audit", "--experiment", "x", "--tracking-uri", "sqlite:///{work}/new/mlflow.db"],
     "no tracking store"),
    ("report-timeout-nan", ["report", "--experiment", "x", "--timeout", "nan"], "--timeout"),
    ("audit-timeout-neg", ["audit", "--experiment", "x", "--timeout", "-1"], "--timeout"),
    ("plan-hub-endpoint-not-url", ["plan", "--model", "org/name", "--gpu", "H100", "--hub-timeout", "nan"],
     "--hub-timeout"),
]
def _snapshot(*roots: Path) -> set[str]:
    out: set[str] = set()
    for root in roots:
        if root.exists():
            out.update(str(p) for p in [root, *root.rglob("*")])
    return out


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
        code = 0 if rc is None else int(rc)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def check_one_line(code: int, err: str, words: str) -> None:
    lines = err.strip("\n").splitlines()
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert "Traceback" not in err and "(a bug:" not in err, err
    assert len(lines) == 1, f"{len(lines)} lines on stderr: {err!r}"
    assert lines[0].startswith("quantrack: error: "), lines[0]
    assert words in lines[0], f"{words!r} not in {lines[0]!r}"


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "bin.dat").write_bytes(BINARY)
    (fixtures / "plain.txt").write_text("a text file\n", encoding="utf-8")
    study = fixtures / "study.toml"
    shutil.copyfile(CPU_STUDY, study)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return {"bin": str(fixtures / "bin.dat"), "missing": str(fixtures / "missing.dat"),
            "nodir": str(tmp_path / "no-such-folder" / "out.json"), "file": str(fixtures / "plain.txt"),
            "study": str(study), "closed": f"http://127.0.0.1:{_closed_port()}", "work": str(work)}


@pytest.mark.parametrize(("argv", "words"), [pytest.param(argv, words, id=cid) for cid, argv, words in CASES])
def test_bad_input_is_one_line_exit_2(argv: list[str], words: str, sandbox: dict[str, str], garbage_url: str,
                                      capsys: pytest.CaptureFixture[str], _isolated_tracking: Path) -> None:
    places = {**sandbox, "garbage": garbage_url}
    args = [a.format(**places) for a in argv]
    watched = (Path(sandbox["work"]), _isolated_tracking, Path(sandbox["nodir"]).parent)
    before = _snapshot(*watched)
    code, _out, err = _run(args, capsys)
    check_one_line(code, err, words.format(**places))
    assert _snapshot(*watched) == before, "a bad input created files"


@pytest.mark.parametrize(("name", "edit", "words"), [pytest.param(name, edit, words, id=name)
                                                    for name, edit, words in STUDY_EDITS])
def test_bad_study_key_is_one_line_exit_2(name: str, edit: tuple[str, str], words: str, sandbox: dict[str, str],
                                          capsys: pytest.CaptureFixture[str], _isolated_tracking: Path) -> None:
    bad = Path(sandbox["work"]).parent / f"{name}.toml"
    bad.write_text(_study(str(CPU_STUDY), *edit), encoding="utf-8")
    watched = (Path(sandbox["work"]), _isolated_tracking)
    before = _snapshot(*watched)
    code, _out, err = _run(["preflight", "--study", str(bad)], capsys)
    check_one_line(code, err, words)
    assert _snapshot(*watched) == before, "a bad study created files"


def test_case_table_covers_every_command() -> None:
    from quantrack.cli import COMMANDS

    covered = {argv[0] for _cid, argv, _w in CASES if argv and not argv[0].startswith("-")}
    assert set(COMMANDS) <= covered, f"commands without a bad-input case: {sorted(set(COMMANDS) - covered)}"


def test_context_beyond_model_and_memory_is_a_preflight_reject(sandbox: dict[str, str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Not bad input but a plan that cannot run: preflight rejects it (exit 3) naming both rules."""
    bad = Path(sandbox["work"]).parent / "huge.toml"
    bad.write_text(_study(str(CPU_STUDY), "context_len = 4096", "context_len = 2000000000"), encoding="utf-8")
    code, out, err = _run(["preflight", "--study", str(bad)], capsys)
    assert code == 3 and "Traceback" not in err
    assert "context-exceeds-model" in out and "context-exceeds-memory" in out
