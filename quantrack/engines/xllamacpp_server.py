"""Child-process entry point: llama.cpp's own C++ HTTP server from the ``xllamacpp`` wheel.

Used when no ``llama-server`` binary is on PATH (CI, this machine). It accepts llama-server's flag
spellings, so the adapter builds one option list for both::

    python -m quantrack.engines.xllamacpp_server -m FILE --host 127.0.0.1 --port N -c 2048 -np 1 \\
        --cache-type-k q8_0 --cache-type-v q8_0 -fa on --metrics

llama.cpp logs to this process's stderr (verbosity 4 by default so the model-loading lines, print_info /
load_tensors / llama_kv_cache, are printed: engine-facts §1.5); ManagedServer sends stderr and stdout
to one log file. A ready line goes to stdout once the server listens; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

from quantrack.arms import GGUF_KV_TYPES as KV_TYPES  # the one table of GGUF types

READY_PREFIX = "quantrack-xllamacpp: listening on "
# The wheel's own version: its llama.cpp BUILD_INFO says build_number 0 / commit "unknown" (xllamacpp
# 2026.10.11549), so the server's build_info line ("b0-unknown") cannot identify the engine; this line can.
VERSION_PREFIX = "quantrack-xllamacpp: xllamacpp "


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m quantrack.engines.xllamacpp_server",
                                description="llama.cpp server (xllamacpp) with llama-server's flag spellings")
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-c", "--ctx-size", type=int, default=0, help="context size (0 = from the model)")
    p.add_argument("-np", "--parallel", type=int, default=1, help="number of slots")
    p.add_argument("-ctk", "--cache-type-k", default="f16", choices=KV_TYPES)
    p.add_argument("-ctv", "--cache-type-v", default="f16", choices=KV_TYPES)
    p.add_argument("-fa", "--flash-attn", default="auto", choices=("on", "off", "auto"))
    p.add_argument("--metrics", action="store_true", help="enable the /metrics endpoint")
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="CPU threads (default: $LLAMA_ARG_THREADS as llama-server reads it, else llama.cpp's: the cores)")
    p.add_argument("--poll", type=int, default=None, choices=range(101), metavar="0..100",
                   help="llama.cpp's polling level while waiting for work (0 = no busy-wait; llama.cpp's default 50)")
    p.add_argument("-lv", "--verbosity", type=int, default=4)
    return p


def build_params(args: argparse.Namespace) -> Any:
    import xllamacpp as xl  # type: ignore[import-untyped]

    params = xl.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.verbosity = args.verbosity
    params.endpoint_metrics = bool(args.metrics)
    params.cache_type_k = getattr(xl.ggml_type, f"GGML_TYPE_{args.cache_type_k.upper()}")
    params.cache_type_v = getattr(xl.ggml_type, f"GGML_TYPE_{args.cache_type_v.upper()}")
    fa = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}[args.flash_attn]
    params.flash_attn_type = getattr(xl.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{fa}")
    if args.alias:
        params.model_alias = {args.alias}  # a set of names in this binding
    if args.threads:
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    if args.poll is not None:
        params.cpuparams.poll = args.poll
        params.cpuparams_batch.poll = args.poll
    return params


def version_line() -> str:
    """``quantrack-xllamacpp: xllamacpp 2026.10.11549 (llama.cpp build 0, commit unknown)``."""
    import xllamacpp as xl  # type: ignore[import-untyped]

    bi = getattr(xl, "BUILD_INFO", {}) or {}
    return (f"{VERSION_PREFIX}{getattr(xl, '__version__', 'unknown')} (llama.cpp build {bi.get('build_number', '?')}, "
            f"commit {bi.get('commit', '?')})")


THREADS_ENV = "LLAMA_ARG_THREADS"  # llama-server's own variable for -t (llama.cpp common/arg.cpp: .set_env)


def threads_from_env(args: argparse.Namespace) -> str | None:
    """-t given wins; else $LLAMA_ARG_THREADS, as llama-server reads it. Returns the line to log, if any."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if args.threads is not None or not raw:
        return None
    try:
        args.threads = int(raw)
    except ValueError:
        args.threads = 0
    if args.threads < 1:
        print(f"quantrack-xllamacpp: error: {THREADS_ENV}={raw!r}: threads must be an integer of at least 1",
              file=sys.stderr, flush=True)
        raise SystemExit(2)
    return f"quantrack-xllamacpp: threads {args.threads} (from ${THREADS_ENV})"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads_note = threads_from_env(args)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        import xllamacpp as xl  # type: ignore[import-untyped]
    except ImportError:
        print("quantrack-xllamacpp: error: the xllamacpp package is not installed "
              "(pip install 'quantrack[cpu]')", file=sys.stderr, flush=True)
        return 3
    print(version_line(), file=sys.stderr, flush=True)
    if threads_note:
        print(threads_note, file=sys.stderr, flush=True)
    try:
        params = build_params(args)
        server = xl.Server(params)  # loads the model and starts listening (background threads)
    except (RuntimeError, ValueError, OSError) as exc:  # xllamacpp: RuntimeError("Failed to init server ...")
        time.sleep(0.5)  # llama.cpp logs from a worker thread: let its last lines land first, ours last
        print(f"quantrack-xllamacpp: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"{READY_PREFIX}{server.listening_address}", flush=True)
    while not stop.wait(0.5):
        pass
    print("quantrack-xllamacpp: stopping", flush=True)
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
