"""How fragile llama.cpp's batch-1 TPOT is under CPU contention, and which server settings make it less so.

Real llama.cpp servers (the xllamacpp wheel) on 127.0.0.1 with the SmolLM2-135M Q8_0 GGUF of the CPU study;
quantrack's own latency client (128 in / 32 out, 2 warmup + 10 measured, batch 1). Per configuration, the
median server TPOT (llama.cpp's own timings.predicted_per_token_ms, the client's beside it) and the
contention quantrack.measure.hygiene recorded, in these scenes:

* ``quiet``      nothing else running (beyond whatever the machine is doing: the hygiene line says what);
* ``2 burners``  two CPU-bound Python loops beside the server (what a busy shared 2-core machine looks like);
* ``beside KL``  a second llama.cpp server (the KL baseline of ``quantrack run``) answering requests at the same time.

Configurations: llama.cpp's defaults (threads = cores, poll 50) vs ``--poll 0`` vs ``--threads 1`` vs both.
Usage (results go to docs/benchmarks.md by hand, with the machine line and the hygiene figures):

    python bench/llamacpp_contention.py [--iterations 10] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CONFIGS: dict[str, tuple[str, ...]] = {
    "default (threads=cores, poll 50)": (),
    "--poll 0": ("--poll", "0"),
    "--threads 1": ("--threads", "1"),
    "--threads 1 --poll 0": ("--threads", "1", "--poll", "0"),
}


def _model() -> Path:
    from quantrack.models.ref import resolve

    return Path(resolve("smollm2:Q8_0").path)


def _server(model: Path, extra: tuple[str, ...], log: Path) -> Any:
    from quantrack.arms import make_arm
    from quantrack.engines.lifecycle import server_for_arm

    srv = server_for_arm("llamacpp", str(model), make_arm("q8_0", weights="q8_0"), host="127.0.0.1",
                         context_len=1024, parallel=1, extra_args=extra, log_path=log, startup_timeout=300)
    srv.start()
    return srv


def _latency(url: str, iterations: int) -> tuple[float, float]:
    from quantrack.measure.latency import measure_latency

    r = measure_latency(url, "llamacpp", input_tokens=128, output_tokens=32, warmup=2, iterations=iterations,
                        timeout=300)
    tpot = [s.tpot * 1e3 for s in r.samples if s.tpot is not None]
    srv = [s.server_tpot * 1e3 for s in r.samples if s.server_tpot is not None]
    return statistics.median(tpot), (statistics.median(srv) if srv else float("nan"))


def _busy_client(url: str, stop: threading.Event) -> None:
    import httpx

    with httpx.Client(timeout=300) as c:
        while not stop.is_set():
            try:
                c.post(f"{url}/completion", json={"prompt": "The history of the " * 20, "n_predict": 32,
                                                  "ignore_eos": True})
            except httpx.HTTPError:  # the side server is stopped at the end of the scene
                return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from quantrack.measure.hygiene import sampling

    model = _model()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"qt-contention-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for name, extra in CONFIGS.items():
        for scene in ("quiet", "2 burners", "beside KL"):
            srv = _server(model, extra, tmp / "server.log")
            side = burners = None
            stop = threading.Event()
            try:
                if scene == "2 burners":
                    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
                elif scene == "beside KL":
                    side = _server(model, extra, tmp / "side.log")
                    threading.Thread(target=_busy_client, args=(side.base_url, stop), daemon=True).start()
                time.sleep(1.0)
                with sampling("latency", engine_pid=srv.pid, interval=0.5) as s:
                    t0 = time.monotonic()
                    client, server = _latency(srv.base_url, args.iterations)
                    wall = time.monotonic() - t0
                h = s.result
                assert h is not None
                rows.append({"config": name, "scene": scene, "tpot_client_ms": round(client, 2),
                             "tpot_server_ms": round(server, 2), "wall_s": round(wall, 1),
                             "others_cpu_cores": None if h.others_cpu_cores is None else round(h.others_cpu_cores, 2),
                             "engine_cpu_cores": None if h.engine_cpu_cores is None else round(h.engine_cpu_cores, 2),
                             "load1_max": h.load1_max, "contended": h.contended})
                print(json.dumps(rows[-1]), flush=True)
            finally:
                stop.set()
                for b in burners or []:
                    b.kill()
                    b.wait()
                if side is not None:
                    side.stop()
                srv.stop()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
