"""A small local SSE server for the client's timing and error paths (never evidence an engine works).

Chunks have the shape of real llama.cpp streams (tests/data/llamacpp-stream-completions.sse,
captured from xllamacpp 2026.10.11549). The fault is chosen by a path prefix, so one server
serves every case: ``http://127.0.0.1:PORT/<mode>`` is the base URL, ``/<mode>/v1/completions``
the endpoint. Modes: ok, short, long, cut, malformed, badjson, http500, http400, slow, nousage,
auth (401 that echoes the key), stamp (each chunk's text is the server's perf_counter at send, then ';').
A request that does not ask for a stream and names stop strings (GSM8K's) gets one JSON completion instead.
``POST /completion`` (the fake engine's one-token request of the decode-side KL: llama.cpp's, n_probs) is answered
with the real llama.cpp response stored in tests/data/kl/llamacpp-completion-nprobs.json, whatever the prefix.

Run as a script for benchmarks (a separate process, so it does not share the client's GIL):
``python tests/sse_fixture.py --interval-ms 2`` prints ``PORT <n>`` and serves until killed (``--port N`` to
choose the port, ``--log FILE`` to print a startup log first: the fake engine, tests/fake_engine.py).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SECRET = "sk-fixture-secret-123"
# a real llama.cpp /completion answer (n_probs 20, stop_type "limit"; provenance in the file's "captured")
NEXT_TOKEN_ANSWER = json.loads((Path(__file__).resolve().parent / "data" / "kl" / "llamacpp-completion-nprobs.json")
                               .read_text(encoding="utf-8"))["response"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FixtureServer

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        if self.path.endswith("/health"):
            self._json(200, {"status": "ok"})
        elif self.path.endswith("/v1/models"):
            self._json(200, {"object": "list", "data": [{"id": "fixture-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self) -> None:
        parts = self.path.strip("/").split("/")
        mode = parts[0] if parts and parts[0] not in ("v1", "tokenize") else "ok"
        body = self._body()
        if self.path.endswith("/tokenize"):
            # fixture tokenizer: one id per whitespace-separated word
            words = str(body.get("content", body.get("prompt", ""))).split()
            self._json(200, {"tokens": [hash(w) % 49152 for w in words]})
            return
        if self.path.endswith("/completion"):
            self.server.requests.append({"mode": "next-token", "body": body, "auth": self.headers.get("Authorization")})
            self._json(200, NEXT_TOKEN_ANSWER)
            return
        if not self.path.endswith("/v1/completions"):
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
            return
        self.server.requests.append({"mode": mode, "body": body, "auth": self.headers.get("Authorization")})
        if mode == "http500":
            self._json(500, {"error": {"code": 500, "message": "internal fixture error"}})
            return
        if mode == "http400":
            self._json(400, {"error": {"code": 400, "message": "the request exceeds the available context size"}})
            return
        if mode == "auth" and self.headers.get("Authorization") != "Bearer right-key":
            self._json(401, {"error": {"code": 401, "message": f"Invalid API Key {self.headers.get('Authorization')}"}})
            return
        if mode == "slow":
            time.sleep(self.server.slow_s)
        if body.get("stream") is False or "stream" not in body and body.get("stop") is not None:
            self._whole(body)  # a non-streamed completion (GSM8K's requests, which name stop strings)
            return
        self._stream(mode, body)

    def _whole(self, body: dict[str, Any]) -> None:
        """One JSON completion of ``max_tokens`` fixture words, as /v1/completions answers without streaming."""
        n = int(body.get("max_tokens", 16))
        prompt = body.get("prompt", "")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        time.sleep(self.server.interval_s * n)
        self._json(200, {"object": "text_completion", "model": "fixture-model",
                         "choices": [{"text": "".join(f" w{k}" for k in range(n)), "index": 0, "logprobs": None,
                                      "finish_reason": "length"}],
                         "usage": {"completion_tokens": n, "prompt_tokens": n_prompt, "total_tokens": n + n_prompt}})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, mode: str, body: dict[str, Any]) -> None:
        max_tokens = int(body.get("max_tokens", 16))
        n = {"short": max_tokens // 2, "long": max_tokens + 3}.get(mode, max_tokens)
        prompt = body.get("prompt", "")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        interval = self.server.interval_s
        t0 = time.perf_counter()
        for k in range(n):
            wait = t0 + (k + 1) * interval - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            text = f"{time.perf_counter()!r};" if mode == "stamp" else f" w{k}"
            event = {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}], "object": "text_completion"}
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            if mode == "cut" and k == 2:
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if mode == "malformed" and k == 0:
                self._chunk(b"this is not an SSE line\n\n")
            if mode == "badjson" and k == 0:
                self._chunk(b"data: {not json\n\n")
        final: dict[str, Any] = {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}], "object": "text_completion"}
        if mode != "nousage":
            final["usage"] = {"completion_tokens": n, "prompt_tokens": n_prompt, "total_tokens": n + n_prompt}
        self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FixtureServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, interval_s: float = 0.002, slow_s: float = 2.0, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.interval_s = interval_s
        self.slow_s = slow_s
        self.requests: list[dict[str, Any]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | OSError):
            return  # the client hung up on purpose (cut, malformed, timeout tests)
        super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FixtureServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


if __name__ == "__main__":
    srv = FixtureServer(interval_s=float(_arg("--interval-ms", "2")) / 1000.0, port=int(_arg("--port", "0")))
    print(f"PORT {srv.server_address[1]}", flush=True)
    # --log FILE: then a startup log, as an engine prints one (the fake engine of tests/fake_engine.py)
    if "--log" in sys.argv:
        with open(_arg("--log", ""), encoding="utf-8") as fh:
            sys.stdout.write(fh.read())
        sys.stdout.flush()
    srv.serve_forever()
