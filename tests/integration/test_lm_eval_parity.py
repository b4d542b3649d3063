"""lm-evaluation-harness itself against quantrack: same prompts, responses, extractions and scores.

lm-eval (the ``lm-eval[api]`` pin of the ``dev`` extra) runs its **stock** ``gsm8k`` task — its own
``lm_eval/tasks/gsm8k/gsm8k.yaml``, pulled in with ``include:`` — with only the dataset pointed at the GSM8K
files quantrack ships (``dataset_path: json`` + ``data_files``, tests/lm_eval_task.py; no network to the HF
hub), against a real llama.cpp server started like tests/integration/conftest.py's (SmolLM2-135M GGUF,
127.0.0.1; one 4096-token slot) through a recording proxy on 127.0.0.1. Then ``quantrack eval --style lm-eval`` asks the same questions through the same proxy.

The proxy adds ``"cache_prompt": false`` to every completion request of both clients alike: llama.cpp would
otherwise reuse a slot's cached prefix from whatever request came before (lm-eval sends longest-first,
quantrack in test order), and a prompt evaluated in other batch shapes can change a greedy token. With it,
each request is computed from scratch and the two runs see the same server.

5 questions, 32 new tokens, one request at a time, one server slot: small enough for a loaded 2-core machine.
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

from tests.lm_eval_task import TASK, write_task

pytestmark = pytest.mark.integration

N = 5
MAX_TOKENS = 32
LOOPBACK = "127.0.0.1"
SERVED = "SmolLM2-135M-Instruct-Q4_1"  # --alias: the model name both tools send (no file path in their output)


class RecordingProxy:
    """Forwards /v1/* to the real server and keeps every (path, request body, response body)."""

    def __init__(self, upstream: str) -> None:
        import httpx

        self.upstream = upstream.rstrip("/")
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=900.0)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                return

            def _forward(self, method: str) -> None:
                body = None
                if method == "POST":
                    raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    body = json.loads(raw)
                    if self.path.endswith("/completions"):
                        body["cache_prompt"] = False  # see the module docstring
                resp = proxy._client.request(method, proxy.upstream + self.path, json=body)
                with proxy._lock:
                    proxy.log.append({"path": self.path, "request": body, "status": resp.status_code,
                                      "response": resp.json() if resp.status_code == 200 else resp.text})
                self.send_response(resp.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

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

    def completions(self) -> list[dict[str, Any]]:
        with self._lock:
            entries = [e for e in self.log if e["path"].endswith("/completions")]
        self.log.clear()
        return entries


@pytest.fixture(scope="module")
def llamacpp_managed(smollm2_q4_1: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """conftest's llama.cpp server (real SmolLM2 Q4_1 GGUF, 127.0.0.1), with one 4096-token slot: lm-eval's
    drawn exemplars make prompts of up to ~1,100 tokens, more than conftest's 2 slots x 1,024 hold."""
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (pip install 'quantrack[cpu]')")
    from quantrack.arms import make_arm
    from quantrack.engines.lifecycle import server_for_arm

    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    srv = server_for_arm("llamacpp", str(smollm2_q4_1), make_arm("q4_1", weights="q4_1"), host=LOOPBACK,
                         context_len=4096, parallel=1, served_name=SERVED, log_path=log, startup_timeout=300)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def proxy(llamacpp_server: str) -> Iterator[RecordingProxy]:
    with RecordingProxy(llamacpp_server) as p:
        yield p


def _text(entry: dict[str, Any]) -> str:
    return str(entry["response"]["choices"][0]["text"])


def _prompt(entry: dict[str, Any]) -> str:
    prompt = entry["request"]["prompt"]
    if isinstance(prompt, list):  # lm-eval batches: a list of one prompt (batch_size 1)
        assert len(prompt) == 1
        prompt = prompt[0]
    return str(prompt)


def test_lm_eval_stock_gsm8k_and_quantrack_agree(proxy: RecordingProxy, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lm_eval")
    import httpx

    from quantrack.accuracy.gsm8k import fewshot_ids, prompt_sha256
    from quantrack.accuracy.importers import import_result
    from quantrack.accuracy.records import load_records

    model = httpx.get(f"{proxy.url}/v1/models", timeout=60).json()["data"][0]["id"]
    proxy.completions()
    assert model == SERVED
    include = write_task(tmp_path)
    task = TASK
    out = tmp_path / "lm-eval-out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "TOKENIZERS_PARALLELISM": "false"}
    model_args = (f"base_url={proxy.url}/v1/completions,model={model},tokenizer_backend=None,"
                  f"tokenized_requests=False,num_concurrent=1,max_retries=1,max_gen_toks={MAX_TOKENS},timeout=900")
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
           "--tasks", task, "--include_path", str(include), "--limit", str(N), "--output_path", "lm-eval-out",
           "--log_samples"]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, (done.stderr[-3000:], [(e["status"], str(e["response"])[:300]) for e in proxy.log])
    lm_requests = proxy.completions()
    assert len(lm_requests) == N and all(e["status"] == 200 for e in lm_requests)

    results_path = next(out.rglob("results_*.json"))
    samples_path = next(out.rglob(f"samples_{task}_*.jsonl"))
    samples = [json.loads(x) for x in samples_path.read_text().splitlines() if x.strip()]
    by_filter = {f: {s["doc_id"]: s for s in samples if s["filter"] == f} for f in ("strict-match", "flexible-extract")}
    assert sorted(by_filter["strict-match"]) == sorted(by_filter["flexible-extract"]) == list(range(N))

    records = tmp_path / "quantrack.jsonl"
    capsys.readouterr()
    main_ok(["eval", "--engine", "llamacpp", "--base-url", proxy.url, "--style", "lm-eval", "--num-questions",
             str(N), "--max-tokens", str(MAX_TOKENS), "--concurrency", "1", "--output", str(records), "--json"])
    ours = json.loads(capsys.readouterr().out)
    q_requests = proxy.completions()
    _keep(results_path, samples_path, records, lm_requests, q_requests)
    assert len(q_requests) == N and all(e["status"] == 200 for e in q_requests)
    recs = load_records(records)

    # identical requests: the prompt strings, and every generation setting
    lm_by_prompt = {_prompt(e): e for e in lm_requests}
    q_by_prompt = {_prompt(e): e for e in q_requests}
    assert set(lm_by_prompt) == set(q_by_prompt) and len(q_by_prompt) == N
    for prompt, lm_e in lm_by_prompt.items():
        lm_req, q_req = lm_e["request"], q_by_prompt[prompt]["request"]
        for key in ("model", "max_tokens", "stop", "temperature", "seed"):
            assert lm_req[key] == q_req[key], key
    assert q_requests[0]["request"]["stop"] == ["Question:", "</s>", "<|im_end|>"]
    assert q_requests[0]["request"]["seed"] == 1234 and q_requests[0]["request"]["max_tokens"] == MAX_TOKENS

    shots = fewshot_ids("lm-eval", num_questions=N, num_shots=5, pool_size=7473)
    for doc in range(N):
        strict, flex, rec = by_filter["strict-match"][doc], by_filter["flexible-extract"][doc], recs[doc]
        prompt = strict["arguments"]["gen_args_0"]["arg_0"]
        # the same prompt, hashed the same way, with the exemplars the record names
        assert strict["prompt_hash"] == rec.prompt_sha256 == prompt_sha256(prompt)
        assert rec.fewshot_ids == shots[doc] and prompt in q_by_prompt
        # the same response, from the server and in both tools' files
        assert _text(lm_by_prompt[prompt]) == _text(q_by_prompt[prompt]) == strict["resps"][0][0] == rec.response
        # the same extraction and verdict under both filters
        assert strict["filtered_resps"][0] == (rec.extracted if rec.extracted is not None else "[invalid]")
        assert flex["filtered_resps"][0] == (rec.extra["extracted_flexible"]
                                             if rec.extra["extracted_flexible"] is not None else "[invalid]")
        assert bool(strict["exact_match"]) is rec.correct
        assert bool(flex["exact_match"]) is rec.extra["correct_flexible"]

    results = json.loads(results_path.read_text())["results"][task]
    assert ours["accuracy"] == pytest.approx(results["exact_match,strict-match"], abs=1e-12)
    assert ours["extra"]["accuracy_flexible"] == pytest.approx(results["exact_match,flexible-extract"], abs=1e-12)

    # the lm-eval output imports (a GSM8K-family task, both filters) and pairs with zero discordant questions
    res, imported = import_result(results_path)
    assert imported is not None and res.task == task and sorted(imported) == list(range(N))
    assert all("correct_flexible" in r.extra for r in imported.values())
    imp = tmp_path / "imported.json"
    main_ok(["eval", "import", str(results_path), "--out", str(imp)])
    capsys.readouterr()
    main_ok(["eval", "compare", str(records), str(imp), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert report["paired"] is True and report["comparison"]["n"] == N
    assert report["comparison"]["base_only"] == report["comparison"]["arm_only"] == 0


def _keep(results_path: Path, samples_path: Path, records: Path, lm_requests: list[dict[str, Any]],
          q_requests: list[dict[str, Any]]) -> None:
    """With QUANTRACK_KEEP_LMEVAL_OUTPUT=DIR, copy both tools' outputs there (how
    tests/data/eval/lm-eval-0.4.13-smollm2/ was captured, see its README)."""
    keep = os.environ.get("QUANTRACK_KEEP_LMEVAL_OUTPUT")
    if not keep:
        return
    dest = Path(keep)
    dest.mkdir(parents=True, exist_ok=True)
    for src in (results_path, samples_path, records, records.with_name(records.name + ".meta.json")):
        (dest / src.name).write_bytes(src.read_bytes())
    (dest / "proxy-log.json").write_text(json.dumps({"lm-eval": lm_requests, "quantrack": q_requests},
                                                    indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main_ok(argv: list[str]) -> None:
    from quantrack.cli import main

    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None), argv
