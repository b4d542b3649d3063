"""`quantrack eval` CLI: one-line errors, exit codes, compare/import rendering, errors recorded.

The stub server below answers /v1/completions with a real llama.cpp response body
(../shared/data/llamacpp-cpu/resp-Q4_0-kvf16.json) and HTTP 500 for chosen questions; it listens on
127.0.0.1 only and serves a handful of requests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from quantrack.accuracy.gsm8k import load_data, prompt_sha256

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"
SECRET = "sk-test-not-a-real-key-7f3a"
Invoke = Callable[..., tuple[int, str, str]]
Server = tuple[str, list[dict], set[int]]


@pytest.fixture
def invoke(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
           ) -> Callable[..., tuple[int, str, str]]:
    """Run the real entry point (quantrack.cli.main): (exit code, stdout, last stderr line)."""
    from quantrack.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        lines = [x for x in err.replace("\r", "\n").splitlines() if x.strip()]
        return code, out, lines[-1] if lines else ""

    return run


@pytest.fixture
def stub_server(shared_data: Path) -> Iterator[tuple[str, list[dict], set[int]]]:
    body = (shared_data / "llamacpp-cpu" / "resp-Q4_0-kvf16.json").read_bytes()
    data = load_data(5)
    from quantrack.accuracy.gsm8k import build_fewshot, build_prompt

    few = build_fewshot(data.shots)
    by_prompt = {build_prompt(few, data.test[i]["question"]): i for i in range(10)}
    seen: list[dict] = []
    failing: set[int] = set()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, payload: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._send(200, json.dumps({"object": "list", "data": [{"id": "sm-Q4_0.gguf"}]}).encode())

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            req["_auth"] = self.headers.get("Authorization")
            seen.append(req)
            if by_prompt.get(req["prompt"]) in failing:
                self._send(500, b'{"error": {"message": "slot unavailable"}}')
            else:
                self._send(200, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen, failing
    finally:
        server.shutdown()
        server.server_close()


def test_eval_without_base_url_is_one_line_error(invoke: Invoke) -> None:
    code, _, err = invoke("eval")
    assert code == 2
    assert err == "quantrack: error: --base-url is required (or use a sub-command: compare, import, kl)"


def test_unknown_task(invoke: Invoke) -> None:
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--task", "gsm8", "--output", "/dev/null")
    assert code == 2 and err == ("quantrack: error: --task: expected one of gsm8k, gsm8k-train, gsm8k-all, humaneval or a task file "
                         "PATH.jsonl, got \"gsm8\" (did you mean 'gsm8k'?)")


def test_too_many_questions(invoke: Invoke, tmp_path: Path) -> None:
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--num-questions", "2000",
                          "--output", str(tmp_path / "r.jsonl"))
    assert code == 2 and err == "quantrack: error: --num-questions 2000: must be 1..1319 (the gsm8k pool)"


def test_unreachable_server_is_engine_error(invoke: Invoke, tmp_path: Path) -> None:
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--num-questions", "2",
                          "--output", str(tmp_path / "r.jsonl"))
    assert code == 1 and err == "quantrack: error: cannot reach the server at http://127.0.0.1:9: connection refused"


def test_existing_output_needs_resume(invoke: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text("")
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--output", str(out))
    assert code == 2
    assert err == f"quantrack: error: --output {out} exists: pass --resume to continue it, or choose another --output"


def test_server_errors_recorded_counted_and_exit_1(invoke: Invoke, stub_server: Server,
                                                   tmp_path: Path) -> None:
    url, seen, failing = stub_server
    failing.add(1)
    out = tmp_path / "r.jsonl"
    code, stdout, err = invoke("eval", "--base-url", url, "--num-questions", "3", "--max-tokens", "32",
                               "--concurrency", "2", "--output", str(out), env={"OPENAI_API_KEY": SECRET})
    assert code == 1
    assert err.startswith("quantrack: error: 1 of 3 questions got a server error; records kept in ")
    recs = {json.loads(x)["id"]: json.loads(x) for x in out.read_text().splitlines()}
    assert sorted(recs) == [0, 1, 2]
    assert recs[1]["error"].startswith("ValueError: HTTP 500") and recs[1]["correct"] is None
    # the real llama.cpp body: " 15\nCatch 20: ..." -> vLLM extraction takes the last integer, 20
    assert recs[0]["extracted"] == 20 and recs[0]["correct"] is False and recs[0]["completion_tokens"] == 32
    assert "answered 2" in stdout and "errors          1 of 3" in stdout
    # the request is vLLM's: completions payload, stop strings, seed, temperature; model from /v1/models
    assert seen[0]["stop"] == ["Question", "Assistant:", "<|separator|>"] and seen[0]["seed"] == 42
    assert seen[0]["model"] == "sm-Q4_0.gguf" and seen[0]["_auth"] == f"Bearer {SECRET}"
    # the key is sent, never saved or printed
    for path in (out, out.with_name(out.name + ".meta.json")):
        assert SECRET not in path.read_text()
    assert SECRET not in stdout and SECRET not in err

    # --resume retries only the errored question
    failing.clear()
    seen.clear()
    code, stdout, _ = invoke("eval", "--base-url", url, "--num-questions", "3", "--max-tokens", "32",
                             "--output", str(out), "--resume")
    assert code == 0 and len(seen) == 1
    data = load_data(5)
    from quantrack.accuracy.gsm8k import build_fewshot, build_prompt

    assert prompt_sha256(seen[0]["prompt"]) == prompt_sha256(build_prompt(build_fewshot(data.shots),
                                                                          data.test[1]["question"]))
    assert "answered 3" in stdout and "errors          0 of 3" in stdout


def test_allow_errors_exits_0(invoke: Invoke, stub_server: Server, tmp_path: Path) -> None:
    url, _, failing = stub_server
    failing.add(0)
    code, stdout, _ = invoke("eval", "--base-url", url, "--num-questions", "2", "--output", str(tmp_path / "r.jsonl"),
                             "--allow-errors", "--json")
    assert code == 0
    data = json.loads(stdout)
    assert (data["n"], data["errors"], data["source"]) == (1, 1, "measured")


def test_resume_with_other_settings_is_refused(invoke: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text((DATA / "smol-q41-max64.jsonl").read_text())
    out.with_name(out.name + ".meta.json").write_text((DATA / "smol-q41-max64.jsonl.meta.json").read_text())
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--num-questions", "8", "--output", str(out),
                          "--resume", "--max-tokens", "256")
    assert code == 2
    assert err == (f"quantrack: error: --resume: {out} was written with max_tokens=64, this run has "
                   "max_tokens=256; use the same settings or a new --output")


def test_resume_of_finished_file_asks_nothing(invoke: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text((DATA / "smol-q41-max64.jsonl").read_text())
    out.with_name(out.name + ".meta.json").write_text((DATA / "smol-q41-max64.jsonl.meta.json").read_text())
    # nothing is left to ask, so the (absent) server is never contacted
    code, stdout, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--num-questions", "8", "--output",
                               str(out), "--resume", "--max-tokens", "64")
    assert code == 0, err
    assert "accuracy        0.00%   (correct 0 / answered 8)" in stdout
    assert "95% CI (Wilson) [0.00%, 32.44%]" in stdout


def test_compare_real_runs_table(invoke: Invoke) -> None:
    code, stdout, _ = invoke("eval", "compare", str(DATA / "smol-q41-max64.jsonl"), str(DATA / "smol-q41-max24.jsonl"))
    assert code == 0
    assert "Paired on 8 questions both runs answered" in stdout
    assert "Delta +0.00 pts is within noise: the 95% CI [" in stdout
    assert "McNemar exact p = 1 on 0 discordant of 8 paired questions" in stdout


def test_compare_json_with_lm_eval_import(invoke: Invoke, tmp_path: Path) -> None:
    lm = next((DATA / "lm-eval").glob("results_*.json"))
    code, stdout, _ = invoke("eval", "compare", str(DATA / "smol-q41-lmeval.jsonl"), str(lm), "--format", "json")
    assert code == 0
    rep = json.loads(stdout)
    c = rep["comparison"]
    assert rep["paired"] and (c["n"], c["base_correct"], c["arm_correct"], c["arm_only"]) == (6, 0, 3, 3)
    assert c["mcnemar_p"] == pytest.approx(0.25)  # 2 * 0.5**3
    assert rep["comparison"]["within_noise"] is True


def test_compare_accuracy_only_says_paired_impossible(invoke: Invoke) -> None:
    code, stdout, _ = invoke("eval", "compare", str(DATA / "vllm-save-results.json"), str(DATA / "smol-q41-max64.jsonl"))
    assert code == 0
    assert stdout.strip().endswith(
        "a paired test is impossible: base has no per-question records (accuracy-only import).")
    assert "50.04%" in stdout and "0.00%" in stdout


def test_compare_different_styles_refused(invoke: Invoke) -> None:
    code, _, err = invoke("eval", "compare", str(DATA / "smol-q41-max64.jsonl"), str(DATA / "smol-q41-lmeval.jsonl"))
    assert code == 2
    assert err == ("quantrack: error: base was scored with style 'vllm', arm with 'lm-eval': compare runs "
                   "scored the same way")


def test_import_sglang_prints_fill_in_free_summary(invoke: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "imp.json"
    code, stdout, _ = invoke("eval", "import", str(DATA / "sglang-run-eval-gsm8k.json"), "--out", str(out))
    assert code == 0
    assert "accuracy        50.04%" in stdout
    assert "95% CI          unknown (the source gives no question count; pass --num-questions)" in stdout
    assert "none (accuracy only: a paired comparison is impossible)" in stdout
    assert json.loads(out.read_text())["source"] == "imported:sglang"


def test_import_missing_file(invoke: Invoke) -> None:
    code, _, err = invoke("eval", "import", "/nonexistent/x.json")
    assert code == 2 and err == "quantrack: error: file not found: /nonexistent/x.json"


def test_lm_eval_style_sends_lm_evals_request_and_keeps_exemplar_ids(invoke: Invoke, stub_server: Server,
                                                                      tmp_path: Path) -> None:
    from quantrack.accuracy.gsm8k import build_fewshot, build_prompt, fewshot_ids

    url, seen, _ = stub_server
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("eval", "--base-url", url, "--num-questions", "2", "--style", "lm-eval", "--output", str(out),
                          "--concurrency", "1")
    assert code == 0, err
    data = load_data(5)
    ids = fewshot_ids("lm-eval", num_questions=2, num_shots=5, pool_size=7473)
    want = [build_prompt(build_fewshot([data.train[j] for j in ids[i]]), data.test[i]["question"]) for i in range(2)]
    assert [r["prompt"] for r in seen] == want  # concurrency 1: asked in test order
    assert seen[0]["stop"] == ["Question:", "</s>", "<|im_end|>"] and seen[0]["seed"] == 1234
    recs = {json.loads(x)["id"]: json.loads(x) for x in out.read_text().splitlines()}
    assert [recs[i]["fewshot_ids"] for i in range(2)] == ids
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert (meta["fewshot_sampler"], meta["fewshot_seed"], meta["seed"]) == ("lm-eval", 1234, 1234)


def test_fewshot_sampler_first_n_with_lm_eval_style(invoke: Invoke, stub_server: Server, tmp_path: Path) -> None:
    url, seen, _ = stub_server
    out = tmp_path / "r.jsonl"
    code, _, err = invoke("eval", "--base-url", url, "--num-questions", "1", "--style", "lm-eval",
                          "--fewshot-sampler", "first_n", "--output", str(out))
    assert code == 0, err
    from quantrack.accuracy.gsm8k import build_fewshot, build_prompt

    data = load_data(5)
    assert seen[0]["prompt"] == build_prompt(build_fewshot(data.shots), data.test[0]["question"])
    assert json.loads(out.read_text())["fewshot_ids"] == [0, 1, 2, 3, 4]


def test_fewshot_seed_with_first_n_is_refused(invoke: Invoke, tmp_path: Path) -> None:
    code, _, err = invoke("eval", "--base-url", "http://127.0.0.1:9", "--fewshot-seed", "7",
                          "--output", str(tmp_path / "r.jsonl"))
    assert code == 2
    assert err == "quantrack: error: --fewshot-seed applies to --fewshot-sampler lm-eval only (first_n draws nothing)"
    assert not (tmp_path / "r.jsonl").exists()


def test_import_task_name_option(invoke: Invoke, tmp_path: Path) -> None:
    code, stdout, _ = invoke("eval", "import", str(next((DATA / "lm-eval").glob("results_*.json"))),
                             "--task-name", "gsm8k")
    assert code == 0 and "GSM8K (lm-eval scoring, strict-match, imported:lm-eval)" in stdout
    assert "flexible-extract 50.00%" in stdout
    code, _, err = invoke("eval", "import", str(next((DATA / "lm-eval").glob("results_*.json"))),
                          "--task-name", "gsm8k_cot")
    assert code == 2 and err.startswith("quantrack: error: --task-name 'gsm8k_cot': not in results_")
