"""Real lm-eval ``--log_samples`` output of two non-GSM8K tasks, imported and paired by ``eval compare``.

lm-eval 0.4.13 (``local-completions``) runs two task YAMLs written here against local JSONL data made here:
``capitals_mc`` (``output_type: multiple_choice``, metrics ``acc`` and ``acc_norm``) and ``sums_gen``
(``generate_until``, ``exact_match`` under two filters). Run A asks the conftest llama.cpp server (real SmolLM2-135M
Q4_1 GGUF); run B asks a second llama.cpp server on the Q8_0 GGUF requantized from it (conftest ``gguf_arms``), with
one document of each task reworded, so its prompt hash differs and ``eval compare`` must drop it.

Why a proxy: lm-eval's multiple-choice requests are ``/v1/completions`` with ``echo: true, logprobs: 1``, reading the
prompt tokens' ``token_logprobs`` (lm_eval/models/openai_completions.py:88-123); llama.cpp's server returns logprobs
of generated tokens only, and lm-eval's ``remote`` tokenizer speaks SGLang's ``/tokenizer_info``, ``/tokenize``
(``prompt``) and ``/detokenize`` (``prompt``) where llama.cpp has ``/props``, ``/tokenize`` (``content``) and
``/detokenize`` (``content``). The proxy below translates the tokenizer calls and answers an echo request with
logprobs the real server computes: for prompt token i, one request of the tokens before it with
``logit_bias`` forcing token i (llama.cpp reports the logprob of the raw logits, before the bias: the bias only
makes it the sampled token) and ``logprobs: 1`` for the greedy token. Generation requests pass through unchanged.

Bounded: 6 documents per task, zero shots, 8 new tokens, one request at a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import pytest

pytestmark = pytest.mark.integration

LOOPBACK = "127.0.0.1"
MC, GEN = "capitals_mc", "sums_gen"
CAPITALS = [("France", ["Paris", "Berlin", "Madrid", "Rome"], 0), ("Germany", ["Vienna", "Berlin", "Oslo", "Rome"], 1),
            ("Italy", ["Madrid", "Lisbon", "Rome", "Paris"], 2), ("Spain", ["Madrid", "Paris", "Athens", "Bern"], 0),
            ("Japan", ["Seoul", "Beijing", "Bangkok", "Tokyo"], 3), ("Egypt", ["Cairo", "Tunis", "Rabat", "Dakar"], 0)]
SUMS = [(2, 3), (1, 1), (4, 5), (10, 10), (7, 2), (3, 3)]
CHANGED = 2  # run B rewords this document of each task


class LogprobProxy:
    """lm-eval's ``local-completions`` wire format on top of a real llama.cpp server (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        import httpx

        self.upstream = upstream.rstrip("/")
        self._client = httpx.Client(timeout=600.0)
        self._cache: dict[tuple[int, ...], tuple[float, dict[str, float]]] = {}
        self.echo_requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                return

            def _reply(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/tokenizer_info":
                    props = proxy._client.get(proxy.upstream + "/props").json()
                    self._reply(200, {k: props.get(k) for k in ("eos_token", "bos_token", "chat_template")})
                    return
                resp = proxy._client.get(proxy.upstream + self.path)
                self._reply(resp.status_code, resp.json())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.path == "/tokenize":
                    self._reply(200, {"tokens": proxy.tokenize(body["prompt"], bool(body.get("add_special_tokens")))})
                elif self.path == "/detokenize":
                    out = proxy._client.post(proxy.upstream + "/detokenize", json={"tokens": body["tokens"]}).json()
                    self._reply(200, {"prompt": out["content"]})
                elif self.path.endswith("/completions") and body.get("echo"):
                    self._reply(200, proxy.echo(body))
                else:
                    resp = proxy._client.post(proxy.upstream + self.path, json=body)
                    self._reply(resp.status_code, resp.json())

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._client.close()

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        out = self._client.post(self.upstream + "/tokenize", json={"content": text, "add_special": add_special})
        return [int(t) for t in out.json()["tokens"]]

    def _next(self, prefix: list[int], forced: int | None) -> tuple[float, dict[str, float], int]:
        """(logprob of the sampled token, {greedy token: its logprob}, sampled id) after ``prefix``."""
        body: dict[str, Any] = {"prompt": prefix, "max_tokens": 1, "logprobs": 1, "temperature": 0}
        if forced is not None:
            body["logit_bias"] = [[forced, 100]]
        out = self._client.post(self.upstream + "/v1/completions", json=body).json()
        entry = out["choices"][0]["logprobs"]["content"][0]
        assert forced is None or entry["id"] == forced, (forced, entry)
        top = {str(t["token"]): float(t["logprob"]) for t in entry["top_logprobs"]}
        return float(entry["logprob"]), top, int(entry["id"])

    def echo(self, body: dict[str, Any]) -> dict[str, Any]:
        self.echo_requests += 1
        prompts = body["prompt"]
        if isinstance(prompts, str):
            prompts = [self.tokenize(prompts, False)]
        elif prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        choices = []
        for index, tokens in enumerate(prompts):
            logprobs: list[float | None] = [None]
            tops: list[dict[str, float] | None] = [None]
            for i in range(1, len(tokens)):
                key = tuple(tokens[: i + 1])
                if key not in self._cache:
                    lp, top, _ = self._next(tokens[:i], tokens[i])
                    self._cache[key] = (lp, top)
                lp, top = self._cache[key]
                logprobs.append(lp)
                tops.append(top)
            lp, top, _ = self._next(tokens, None)
            logprobs.append(lp)
            tops.append(top)
            choices.append({"index": index, "text": "", "logprobs": {"token_logprobs": logprobs, "top_logprobs": tops}})
        return {"object": "text_completion", "model": body.get("model"), "choices": choices}


@pytest.fixture(scope="module")
def q8_server(gguf_arms: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Arm B: a second llama.cpp server on the Q8_0 GGUF (127.0.0.1, one slot)."""
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (pip install 'quantrack[cpu]')")
    from quantrack.arms import make_arm
    from quantrack.engines.lifecycle import server_for_arm

    log = tmp_path_factory.mktemp("llamacpp-q8") / "server.log"
    srv = server_for_arm("llamacpp", str(gguf_arms["Q8_0"]), make_arm("q8_0", weights="q8_0"), host=LOOPBACK,
                         context_len=2048, parallel=1, log_path=log, startup_timeout=120)
    srv.start()
    try:
        yield str(srv.base_url)
    finally:
        srv.stop()


def _write_tasks(workdir: Path, *, reworded: bool) -> Path:
    """Task YAMLs + their local data (``dataset_path: json``: nothing fetched); returns the include dir."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    caps = [{"country": c + (" (the country)" if reworded and i == CHANGED else ""), "choices": ch, "answer": a}
            for i, (c, ch, a) in enumerate(CAPITALS)]
    sums = [{"question": f"What is {a} plus {b}?" + (" Answer with a number." if reworded and i == CHANGED else ""),
             "answer": str(a + b)} for i, (a, b) in enumerate(SUMS)]
    (data / "capitals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in caps), encoding="utf-8")
    (data / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums), encoding="utf-8")
    tasks = workdir / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    common = "dataset_path: json\ndataset_name: null\ntest_split: test\n"
    (tasks / f"{MC}.yaml").write_text(
        f"task: {MC}\n{common}"
        "dataset_kwargs:\n  data_files:\n    test: data/capitals.jsonl\n  cache_dir: hf-datasets\n"
        "output_type: multiple_choice\n"
        "doc_to_text: \"Question: What is the capital of {{country}}?\\nAnswer:\"\n"
        "doc_to_choice: choices\ndoc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n", encoding="utf-8")
    (tasks / f"{GEN}.yaml").write_text(
        f"task: {GEN}\n{common}"
        "dataset_kwargs:\n  data_files:\n    test: data/sums.jsonl\n  cache_dir: hf-datasets\n"
        "output_type: generate_until\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_target: answer\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  do_sample: false\n  temperature: 0.0\n  max_gen_toks: 8\n"
        "filter_list:\n"
        "  - name: first-number\n    filter:\n      - function: regex\n        regex_pattern: \"(-?[0-9]+)\"\n"
        "      - function: take_first\n"
        "  - name: whole\n    filter:\n      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "    ignore_case: true\n    ignore_punctuation: true\n", encoding="utf-8")
    return tasks


def _run_lm_eval(server: str, workdir: Path, *, reworded: bool) -> Path:
    """One real lm-eval run of both tasks; returns its output dir."""
    include = _write_tasks(workdir, reworded=reworded)
    with LogprobProxy(server) as proxy:
        import httpx

        model = httpx.get(f"{proxy.url}/v1/models", timeout=60).json()["data"][0]["id"]
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(workdir / "hf"),
               "TOKENIZERS_PARALLELISM": "false"}
        model_args = (f"base_url={proxy.url}/v1/completions,model={model},tokenizer_backend=remote,"
                      "tokenized_requests=True,num_concurrent=1,max_retries=1,max_gen_toks=8,timeout=600")
        cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
               "--tasks", f"{MC},{GEN}", "--include_path", str(include), "--output_path", "out", "--log_samples"]
        done = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert proxy.echo_requests > 0  # the multiple-choice task asked for prompt logprobs
    return workdir / "out"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from quantrack.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_two_lm_eval_runs_of_two_tasks_pair(llamacpp_server: str, q8_server: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lm_eval")
    out_a = _run_lm_eval(llamacpp_server, tmp_path / "a", reworded=False)
    out_b = _run_lm_eval(q8_server, tmp_path / "b", reworded=True)

    def one(out: Path, pattern: str) -> Path:
        found = sorted(out.rglob(pattern))
        assert len(found) == 1, found
        return found[0]

    n_mc, n_gen = len(CAPITALS), len(SUMS)
    for out in (out_a, out_b):
        mc = [json.loads(x) for x in one(out, f"samples_{MC}_*.jsonl").read_text().splitlines() if x.strip()]
        gen = [json.loads(x) for x in one(out, f"samples_{GEN}_*.jsonl").read_text().splitlines() if x.strip()]
        assert sorted(s["doc_id"] for s in mc) == list(range(n_mc))
        assert all(s["metrics"] == ["acc", "acc_norm"] and s["filter"] == "none" for s in mc)
        assert sorted(s["filter"] for s in gen) == ["first-number"] * n_gen + ["whole"] * n_gen

    # eval import of the results file: the task, the metric chosen by the rule, checked against the results' mean
    results_a = one(out_a, "results_*.json")
    code, stdout, err = _cli(["eval", "import", str(results_a), "--task-name", MC, "--json"], capsys)
    assert code == 0, err
    res = json.loads(stdout)
    lm_mean = json.loads(results_a.read_text())["results"][MC]["acc,none"]
    assert res["task"] == MC and res["settings"]["lm_eval_metric"] == "acc" and res["n"] == n_mc
    assert res["accuracy"] == pytest.approx(lm_mean, abs=1e-12)
    code, stdout, err = _cli(["eval", "import", str(results_a), "--task-name", GEN], capsys)
    assert code == 2 and "several filters (first-number, whole); pass --filter" in err, err

    # the multiple-choice task, acc and acc_norm: 6 docs, the reworded one dropped, 5 paired
    for metric in ("acc", "acc_norm"):
        code, stdout, err = _cli(["eval", "compare", str(one(out_a, f"samples_{MC}_*.jsonl")),
                                  str(one(out_b, f"samples_{MC}_*.jsonl")), "--metric", metric, "--format", "json"],
                                 capsys)
        assert code == 0, err
        rep = json.loads(stdout)
        assert rep["task"] == MC and rep["metric"] == metric and rep["paired"] is True
        assert rep["comparison"]["n"] == n_mc - 1
        assert rep["excluded"]["prompt_hash_differs"] == 1 and rep["excluded"]["doc_or_target_hash_differs"] == 0
        assert rep["comparison"]["mcnemar_p"] is not None and rep["comparison"]["delta_ci_low"] is not None

    # the generative task, exact_match under the first-number filter; the table names task and metric
    code, stdout, err = _cli(["eval", "compare", str(one(out_a, f"samples_{GEN}_*.jsonl")),
                              str(one(out_b, f"samples_{GEN}_*.jsonl")), "--filter", "first-number"], capsys)
    assert code == 0, err
    assert f"Paired on {n_gen - 1} questions" in stdout and f"{GEN} exact_match" in stdout
    assert "dropped: 1 samples whose prompt_hash differs" in stdout and "McNemar p =" in stdout
    _keep(out_a, out_b, stdout)


def _keep(out_a: Path, out_b: Path, table: str) -> None:
    """With QUANTRACK_KEEP_LMEVAL_OUTPUT=DIR, copy both runs' lm-eval outputs and the compare table there."""
    keep = os.environ.get("QUANTRACK_KEEP_LMEVAL_OUTPUT")
    if not keep:
        return
    for name, out in (("a", out_a), ("b", out_b)):
        for src in out.rglob("*.json*"):
            dest = Path(keep) / name / src.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    (Path(keep) / "compare.txt").write_text(table, encoding="utf-8")
