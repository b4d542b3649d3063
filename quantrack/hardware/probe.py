"""FP8 kernel probe: time bf16 GEMMs against FP8 (``torch._scaled_mm``) at a model's linear shapes on this node.

The seeds' sharpest warning is that FP8 latency depends on a capability gate inside the engine, not on the flag
being accepted. This probe asks the node itself: does an FP8 GEMM run here, and is it faster than bf16 at the
shapes that matter? It times the four linear layers of one transformer block (q/k/v fused, o, gate/up fused,
down) at several batch sizes with CUDA events, rotating through enough weight copies that the L2 cache cannot
serve the weight read, and a large device-to-device copy for the achievable bandwidth.

What is timed is the GEMM alone (activations are pre-quantized once per batch size): the engine's per-token
activation quantization is not included, so this is an upper bound on the FP8 GEMM speedup an engine can get.
Pure helpers (shapes, copies, summary, verdict) run anywhere; ``run_probe`` needs torch with CUDA.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from quantrack.errors import BadInput, EnvironmentMissing
from quantrack.hardware.catalog import ModelShape

# A verdict of "native" needs the FP8 stack to beat bf16 by at least this factor at some batch size.
NATIVE_MIN_SPEEDUP = 1.05
L2_FLUSH_BYTES = 256 * 2**20  # weights touched per timed pass >> the H200's 60 MB L2


@dataclass(frozen=True)
class LinearShape:
    layer: str
    k: int  # input features
    n: int  # output features


def linear_shapes(shape: ModelShape) -> list[LinearShape]:
    """The four GEMMs of one decoder block, as engines fuse them (qkv, o, gate_up, down)."""
    if not shape.hidden_size or not shape.intermediate_size or not shape.attention_heads:
        raise BadInput(f"model {shape.name!r} lacks hidden_size / intermediate_size / attention_heads in the catalog;"
                       " the probe needs them")
    q = shape.attention_heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    return [
        LinearShape("qkv", shape.hidden_size, q + 2 * kv),
        LinearShape("o", q, shape.hidden_size),
        LinearShape("gate_up", shape.hidden_size, 2 * shape.intermediate_size),
        LinearShape("down", shape.intermediate_size, shape.hidden_size),
    ]


def weight_copies(k: int, n: int, bytes_per_elem: float, flush_bytes: int = L2_FLUSH_BYTES) -> int:
    """How many copies of a K x N weight to rotate through so one pass touches >= flush_bytes (at least 2)."""
    per = k * n * bytes_per_elem
    return max(2, math.ceil(flush_bytes / per))


def gemm_bytes(m: int, k: int, n: int, w_bytes: float, a_bytes: float, out_bytes: float = 2.0) -> float:
    """Bytes a GEMM must move at least once: weights + activations in + output out."""
    return k * n * w_bytes + m * k * a_bytes + m * n * out_bytes


def parse_batches(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--batch must be comma-separated positive integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise BadInput(f"--batch must be comma-separated positive integers, got {text!r}")
    return vals


@dataclass
class LayerTiming:
    batch: int
    layer: str
    k: int
    n: int
    bf16_ms: float
    fp8_tensor_ms: float | None  # per-tensor scales
    fp8_channel_ms: float | None  # per-token x per-channel (row-wise) scales
    bf16_gbps: float
    fp8_gbps: float | None


@dataclass
class BatchSummary:
    batch: int
    bf16_layer_ms: float
    fp8_layer_ms: float | None
    bf16_stack_ms: float
    fp8_stack_ms: float | None
    speedup: float | None
    bf16_gbps: float
    fp8_gbps: float | None
    bf16_bw_fraction: float | None  # of the measured copy bandwidth
    fp8_bw_fraction: float | None


@dataclass
class ProbeResult:
    model: str
    layers: int
    device: dict[str, Any]
    copy_tbps: float | None
    timings: list[LayerTiming] = field(default_factory=list)
    batches: list[BatchSummary] = field(default_factory=list)
    verdict: str = "none"  # "native" | "none"
    evidence: list[str] = field(default_factory=list)
    method: str = ""

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def summarize(timings: list[LayerTiming], layers: int, copy_tbps: float | None) -> list[BatchSummary]:
    """Per batch size: one layer (sum of its GEMMs), the whole stack (x layers), speedup, GB/s vs copy."""
    out: list[BatchSummary] = []
    for m in sorted({t.batch for t in timings}):
        rows = [t for t in timings if t.batch == m]
        bf = sum(t.bf16_ms for t in rows)
        fp8_each = [_best_fp8(t) for t in rows]
        fp = None if any(v is None for v in fp8_each) else sum(v for v in fp8_each if v is not None)
        bf_bytes = sum(gemm_bytes(m, t.k, t.n, 2, 2) for t in rows)
        fp_bytes = sum(gemm_bytes(m, t.k, t.n, 1, 1) for t in rows)
        bf_gbps = bf_bytes / (bf * 1e-3) / 1e9
        fp_gbps = None if fp is None else fp_bytes / (fp * 1e-3) / 1e9
        copy_gbps = copy_tbps * 1e3 if copy_tbps else None
        out.append(BatchSummary(
            batch=m, bf16_layer_ms=bf, fp8_layer_ms=fp, bf16_stack_ms=bf * layers,
            fp8_stack_ms=None if fp is None else fp * layers, speedup=None if fp is None else bf / fp,
            bf16_gbps=bf_gbps, fp8_gbps=fp_gbps,
            bf16_bw_fraction=(bf_gbps / copy_gbps) if copy_gbps else None,
            fp8_bw_fraction=(fp_gbps / copy_gbps) if (copy_gbps and fp_gbps) else None,
        ))
    return out


def _best_fp8(t: LayerTiming) -> float | None:
    vals = [v for v in (t.fp8_tensor_ms, t.fp8_channel_ms) if v is not None]
    return min(vals) if vals else None


def verdict(batches: list[BatchSummary], fp8_error: str | None) -> tuple[str, list[str]]:
    """'native' when an FP8 GEMM ran and the stack beat bf16 by NATIVE_MIN_SPEEDUP somewhere; else 'none'."""
    if fp8_error:
        return "none", [f"FP8 GEMM unavailable: {fp8_error}"]
    sp = [(b.batch, b.speedup) for b in batches if b.speedup is not None]
    if not sp:
        return "none", ["no FP8 timing was obtained"]
    ev = [f"batch {m}: FP8/bf16 stack speedup {s:.2f}x" for m, s in sp]
    if max(s for _, s in sp) >= NATIVE_MIN_SPEEDUP:
        return "native", ev
    return "none", ev + [f"FP8 ran but was never >= {NATIVE_MIN_SPEEDUP}x faster than bf16 (no faster path)"]


def _bf16_gemm(a: Any, w: list[Any], j: int) -> Any:
    return a @ w[j].t()


def _fp8_gemm(torch: Any, a8: Any, w: list[Any], scale_a: Any, scale_b: Any, j: int) -> Any:
    return torch._scaled_mm(a8, w[j].t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def _copy(dst: Any, src: Any, j: int) -> Any:
    return dst.copy_(src)


def run_probe(shape: ModelShape, batches: list[int], *, repeats: int = 20, warmup: int = 5,
              copy_gib: float = 2.0, graphs: bool = True,
              progress: Callable[[str], None] | None = None) -> ProbeResult:
    """Time bf16 vs FP8 GEMMs on CUDA device 0. Raises EnvironmentMissing without torch+CUDA."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        raise EnvironmentMissing("the probe needs PyTorch with CUDA: pip install 'quantrack[probe]'") from None
    if not torch.cuda.is_available():
        raise EnvironmentMissing("no CUDA device visible to PyTorch: the probe needs an NVIDIA GPU")
    say = progress or (lambda s: None)
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    device = {
        "name": props.name, "compute_capability": f"{props.major}.{props.minor}",
        "memory_bytes": int(props.total_memory), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "multiprocessors": props.multi_processor_count,
    }
    shapes = linear_shapes(shape)
    fp8_dtype = getattr(torch, "float8_e4m3fn", None)
    fp8_error: str | None = None if fp8_dtype is not None else "torch has no float8_e4m3fn"

    def time_fn(fn: Callable[[int], Any], copies: int, use_graph: bool = True) -> float:
        def body() -> None:
            for j in range(copies):
                fn(j)

        run = body
        if graphs and use_graph:
            # Replay one CUDA graph of the whole rotation: at batch 1 a GEMM takes ~20 us on the GPU, about what
            # Python needs to launch it, so eager timing would measure the launcher, not the kernel.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(max(1, warmup)):
                    body()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
            run = graph.replay
        for _ in range(warmup):
            run()
        torch.cuda.synchronize()
        samples = []
        for r in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / copies)
        return statistics.median(samples)

    timings: list[LayerTiming] = []
    for ls in shapes:
        nb = weight_copies(ls.k, ls.n, 2)
        w_bf = [torch.randn(ls.n, ls.k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(nb)]
        nf = weight_copies(ls.k, ls.n, 1)
        w_fp8 = None
        if fp8_error is None:
            try:
                w_fp8 = [(torch.randn(ls.n, ls.k, device=dev, dtype=torch.bfloat16) * 0.02).to(fp8_dtype)
                         for _ in range(nf)]
            except Exception as exc:  # noqa: BLE001  # pragma: no cover - depends on the GPU
                fp8_error = f"{type(exc).__name__}: {exc}"
        for m in batches:
            say(f"probe: {ls.layer} K={ls.k} N={ls.n} batch {m}")
            a = torch.randn(m, ls.k, device=dev, dtype=torch.bfloat16)
            bf_ms = time_fn(partial(_bf16_gemm, a, w_bf), nb)
            ft_ms = fc_ms = None
            if fp8_error is None and w_fp8 is not None:
                a8 = a.to(fp8_dtype)
                one = torch.ones((), device=dev, dtype=torch.float32)
                sa, sb = torch.ones(m, 1, device=dev), torch.ones(1, ls.n, device=dev)
                try:
                    ft_ms = time_fn(partial(_fp8_gemm, torch, a8, w_fp8, one, one), nf)
                except Exception as exc:  # noqa: BLE001  # pragma: no cover - depends on the GPU
                    fp8_error = f"torch._scaled_mm per-tensor: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                try:
                    fc_ms = time_fn(partial(_fp8_gemm, torch, a8, w_fp8, sa, sb), nf)
                except Exception:  # noqa: BLE001  # pragma: no cover - row-wise scaling is SM89+/SM90 only
                    fc_ms = None
            timings.append(LayerTiming(
                batch=m, layer=ls.layer, k=ls.k, n=ls.n, bf16_ms=bf_ms, fp8_tensor_ms=ft_ms, fp8_channel_ms=fc_ms,
                bf16_gbps=gemm_bytes(m, ls.k, ls.n, 2, 2) / (bf_ms * 1e-3) / 1e9,
                fp8_gbps=None if (ft_ms is None and fc_ms is None) else
                gemm_bytes(m, ls.k, ls.n, 1, 1) / (min(v for v in (ft_ms, fc_ms) if v) * 1e-3) / 1e9,
            ))
        del w_bf, w_fp8
        torch.cuda.empty_cache()

    say("probe: device-to-device copy")
    n_elem = int(copy_gib * 2**30) // 2
    src = torch.empty(n_elem, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    # one 2 GiB copy: launch overhead is negligible, and a captured copy becomes a slower memcpy graph node
    copy_ms = time_fn(partial(_copy, dst, src), 1, use_graph=False)
    copy_tbps = (2 * n_elem * 2) / (copy_ms * 1e-3) / 1e12  # bytes read + written
    del src, dst
    torch.cuda.empty_cache()

    batches_sum = summarize(timings, shape.layers, copy_tbps)
    v, ev = verdict(batches_sum, fp8_error)
    return ProbeResult(
        model=shape.name, layers=shape.layers, device=device, copy_tbps=copy_tbps, timings=timings,
        batches=batches_sum, verdict=v, evidence=ev,
        method=(f"CUDA events, {warmup} warmup + median of {repeats} repeats, each rotating through weight copies "
                f">= {L2_FLUSH_BYTES // 2**20} MiB so L2 cannot serve the weights; bf16 torch.matmul vs "
                "torch._scaled_mm e4m3 (per-tensor and row-wise scales, best of the two), GEMM only "
                f"(activation quantization not timed); copy {copy_gib} GiB d2d, bytes read+written; "
                + ("each GEMM pass replayed as one CUDA graph (no Python launch overhead; the copy is eager); " if graphs else
                   "eager launches (Python launch overhead included); ")
                + f"Measured {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}."),
    )
