"""Client overhead per streamed token: quantrack's httpx client vs the `openai` client, side by side.

A local SSE server (tests/sse_fixture.py, its own process on 127.0.0.1) emits N chunks on a fixed
schedule (chunk k at k x interval) and writes its send time (time.perf_counter, CLOCK_MONOTONIC,
shared by processes on one Linux host) into each chunk. For each client, per run:

* delivery lag per chunk = time the chunk reaches the caller - time the server sent it
  (the client's overhead per token; the ideal is 0);
* overhead per chunk = client lag - lag of a bare-socket reader of the same stream (the ideal
  client: no HTTP or SSE parsing, just recv() and a clock), i.e. measured - ideal per chunk;
* CPU per chunk = thread CPU time the client spent during the request / N;
* e2e overhead per chunk = (last chunk at caller - request start - N x interval) / N.

Runs alternate between the two clients; the report gives the median over runs of each run's
median lag (and its p90), and of the e2e overhead. Usage:

    python bench/client_overhead.py [--chunks 200] [--interval-ms 1] [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_server(interval_ms: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "sse_fixture.py"), "--interval-ms", str(interval_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"fixture server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def run_quantrack(client: object, n: int, interval_s: float) -> tuple[list[float], float, float]:
    from quantrack.measure.client import HttpStreamClient, build_payload

    assert isinstance(client, HttpStreamClient)
    path, payload = build_payload("llamacpp", model="fixture", prompt="x", max_tokens=n)
    c0 = time.thread_time()
    s = client.stream(path, payload, keep_text=True)
    cpu = (time.thread_time() - c0) / n
    if not s.ok or s.text is None:
        raise SystemExit(f"quantrack client failed: {s.error}")
    stamps = [float(x) for x in s.text.split(";") if x]
    lags = [s.t_start + t - sent for t, sent in zip(s.chunk_times, stamps, strict=True)]
    return lags, (s.chunk_times[-1] - n * interval_s) / n, cpu


def run_socket(base: str, n: int, interval_s: float) -> tuple[list[float], float, float]:
    """The ideal client: a raw socket, a hand-written request, a clock on each recv()."""
    import re
    import socket

    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "x", "max_tokens": n, "stream": True}).encode()
    req = (
        f"POST /stamp/v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    pat = re.compile(rb'"text": "([0-9.]+);"')
    lags: list[float] = []
    buf = b""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    last = t0
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(req)
        while True:
            data = sock.recv(65536)
            now = time.perf_counter()
            if not data:
                break
            buf += data
            found = pat.findall(buf)
            if found:
                lags.extend(now - float(x) for x in found)
                last = now
                buf = buf[buf.rindex(b";") + 1 :]
            if b"[DONE]" in buf:
                break
    if len(lags) != n:
        raise SystemExit(f"socket reader saw {len(lags)} of {n} chunks")
    return lags, (last - t0 - n * interval_s) / n, (time.thread_time() - c0) / n


def run_openai(client: object, n: int, interval_s: float) -> tuple[list[float], float, float]:
    from openai import OpenAI

    assert isinstance(client, OpenAI)
    lags: list[float] = []
    c0 = time.thread_time()
    t0 = time.perf_counter()
    last = t0
    stream = client.completions.create(model="fixture", prompt="x", max_tokens=n, stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            lags.append(now - float(chunk.choices[0].text.rstrip(";")))
            last = now
    if len(lags) != n:
        raise SystemExit(f"openai client saw {len(lags)} of {n} chunks")
    return lags, (last - t0 - n * interval_s) / n, (time.thread_time() - c0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    import openai

    from quantrack.measure.client import HttpStreamClient

    proc, base = start_server(args.interval_ms)
    interval_s = args.interval_ms / 1000.0
    names = ("socket", "quantrack", "openai")
    results: dict[str, dict[str, list[float]]] = {k: {"lag": [], "lag_p90": [], "e2e": [], "cpu": [], "over": []} for k in names}
    try:
        ours = HttpStreamClient(base + "/stamp")
        theirs = openai.OpenAI(base_url=base + "/stamp/v1", api_key="none", max_retries=0)
        clients = (("socket", run_socket, base), ("quantrack", run_quantrack, ours), ("openai", run_openai, theirs))
        for _name, fn, cl in clients:
            fn(cl, 20, interval_s)  # warm the connection and imports
        for _ in range(args.runs):
            for name, fn, cl in clients:
                lags, e2e, cpu = fn(cl, args.chunks, interval_s)
                ordered = sorted(lags)
                results[name]["lag"].append(statistics.median(lags))
                results[name]["lag_p90"].append(ordered[int(0.9 * (len(ordered) - 1))])
                results[name]["e2e"].append(e2e)
                results[name]["cpu"].append(cpu)
            for name in names:  # this run's overhead over the bare socket
                results[name]["over"].append(results[name]["lag"][-1] - results["socket"]["lag"][-1])
        ours.close()
        theirs.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    us = 1e6
    report = {
        "chunks": args.chunks,
        "interval_ms": args.interval_ms,
        "runs": args.runs,
        "python": platform.python_version(),
        "openai_version": openai.__version__,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs",
        **{
            name: {
                "lag_median_us": statistics.median(r["lag"]) * us,
                "lag_p90_us": statistics.median(r["lag_p90"]) * us,
                "overhead_vs_socket_us": statistics.median(r["over"]) * us,
                "cpu_per_chunk_us": statistics.median(r["cpu"]) * us,
                "e2e_overhead_per_chunk_us": statistics.median(r["e2e"]) * us,
            }
            for name, r in results.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{args.runs} runs x {args.chunks} chunks at {args.interval_ms} ms; python {report['python']}, "
        f"openai {report['openai_version']}, {report['machine']}; medians over runs, microseconds"
    )
    print(f"{'client':<10} {'lag p50':>9} {'lag p90':>9} {'overhead vs socket':>19} {'CPU/chunk':>10} {'e2e overhead/chunk':>19}")
    for name in names:
        r = report[name]
        print(
            f"{name:<10} {r['lag_median_us']:>9.1f} {r['lag_p90_us']:>9.1f} {r['overhead_vs_socket_us']:>19.1f}"
            f" {r['cpu_per_chunk_us']:>10.1f} {r['e2e_overhead_per_chunk_us']:>19.1f}"
        )


if __name__ == "__main__":
    main()
