"""Measurement hygiene: what was happening on the host and the GPU while a figure was measured.

A latency or throughput figure taken while other work competes for the same cores is not a property of
the arm. quantrack cannot make a busy machine quiet, but it can say that it was busy, by how much, and
flag every figure taken so (``contended``). What is sampled, once a second, during a step:

* **CPU used by other processes** (cores): all busy CPU time on the host (``/proc/stat``) minus the time
  of the engine's process tree and of quantrack's own process, per second of wall time. This is the
  contention figure: it is zero on a quiet machine whatever the engine itself uses.
* the 1-minute **load average** against the number of cores (context for the reader; it lags by design
  and counts the engine's own threads, so it is reported, not used for the verdict alone);
* **steal** time (a virtual machine whose host gives its cores to others);
* on NVIDIA GPUs: SM clock, clock-throttle reasons other than idle, and processes on the device that
  are not the engine's (NVML, only where a driver is present).

Thresholds (``Limits``) are stated in the record; a figure is flagged when any is crossed. Every value
here is *measured*; the flag is *derived* from them with the stated limits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Limits:
    """A figure is taken under contention when, averaged over the step, any of these is exceeded."""

    others_cpu_cores: float = 0.5  # CPU (cores) used by processes other than the engine and quantrack
    steal_pct: float = 5.0  # % of CPU time stolen by the hypervisor
    load_per_core: float = 2.0  # 1-min load average / cores, peak over the step (engine threads included)


@dataclass(frozen=True)
class CpuTimes:
    """One reading of /proc/stat's aggregate line and of the watched processes (seconds of CPU)."""

    wall: float
    busy: float  # user + nice + system + irq + softirq (+ steal, counted separately)
    steal: float
    total: float
    watched: float  # CPU seconds of the engine tree + quantrack itself
    load1: float


@dataclass
class Hygiene:
    """The summary of one step's samples."""

    step: str
    cores: int
    samples: int = 0
    seconds: float = 0.0
    others_cpu_cores: float | None = None
    engine_cpu_cores: float | None = None
    steal_pct: float | None = None
    load1_max: float | None = None
    gpu_sm_clock_mhz_min: float | None = None
    gpu_throttle: list[str] = field(default_factory=list)
    gpu_other_processes: int | None = None
    limits: Limits = field(default_factory=Limits)
    errors: list[str] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """Why the step's figures are untrustworthy; empty when none of the limits was crossed."""
        out = []
        lim = self.limits
        if self.others_cpu_cores is not None and self.others_cpu_cores > lim.others_cpu_cores:
            out.append(f"other processes used {self.others_cpu_cores:.1f} of {self.cores} cores")
        if self.load1_max is not None and self.load1_max / max(self.cores, 1) > lim.load_per_core:
            out.append(f"host load {self.load1_max:.1f} on {self.cores} cores")
        if self.steal_pct is not None and self.steal_pct > lim.steal_pct:
            out.append(f"CPU steal {self.steal_pct:.0f}%")
        if self.gpu_throttle:
            out.append("GPU clocks throttled: " + ", ".join(self.gpu_throttle))
        if self.gpu_other_processes:
            out.append(f"{self.gpu_other_processes} other process(es) on the GPU")
        return out

    @property
    def contended(self) -> bool | None:
        """True/False once sampled; None when nothing could be sampled (unknown, never 'clean')."""
        if self.samples < 2 and self.others_cpu_cores is None:
            return None
        return bool(self.reasons)

    def flag(self) -> str:
        """One short phrase for a table cell: '' (clean), '⚠ <first reason>', or '? not sampled'."""
        if self.contended is None:
            return "? contention not sampled"
        return f"⚠ {self.reasons[0]}" if self.reasons else ""

    def metrics(self) -> dict[str, float]:
        """MLflow metrics, prefixed with the step (``latency_host_others_cpu_cores``, …)."""
        out: dict[str, float] = {}
        for key in ("others_cpu_cores", "engine_cpu_cores", "steal_pct", "load1_max", "gpu_sm_clock_mhz_min"):
            v = getattr(self, key)
            if v is not None:
                out[f"{self.step}_host_{key}"] = round(float(v), 4)
        if self.gpu_other_processes is not None:
            out[f"{self.step}_gpu_other_processes"] = float(self.gpu_other_processes)
        out[f"{self.step}_host_samples"] = float(self.samples)
        return out

    def tags(self) -> dict[str, str]:
        c = self.contended
        state = "unknown" if c is None else ("yes" if c else "no")
        return {f"quantrack.{self.step}_contention": state,
                f"quantrack.{self.step}_contention_reasons": "; ".join(self.reasons) if c else
                ("; ".join(self.errors) or "not sampled") if c is None else ""}

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "cores": self.cores, "samples": self.samples, "seconds": round(self.seconds, 3),
                "others_cpu_cores": self.others_cpu_cores, "engine_cpu_cores": self.engine_cpu_cores,
                "steal_pct": self.steal_pct, "load1_max": self.load1_max,
                "gpu_sm_clock_mhz_min": self.gpu_sm_clock_mhz_min, "gpu_throttle": self.gpu_throttle,
                "gpu_other_processes": self.gpu_other_processes, "contended": self.contended,
                "reasons": self.reasons, "limits": vars(self.limits), "errors": self.errors}


def _proc_stat() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds over all cores since boot, from /proc/stat's 'cpu' line."""
    with open("/proc/stat", encoding="ascii") as fh:
        parts = fh.readline().split()
    hz = os.sysconf("SC_CLK_TCK")
    vals = [int(x) for x in parts[1:]]
    user, nice, system, idle, iowait, irq, softirq = vals[:7]
    steal = vals[7] if len(vals) > 7 else 0
    busy = user + nice + system + irq + softirq
    total = busy + idle + iowait + steal
    return busy / hz, steal / hz, total / hz


def _tree_cpu(pids: tuple[int, ...], children: bool = True) -> float:
    """CPU seconds (user + system) of the processes, and of their descendants when ``children``."""
    import psutil  # type: ignore[import-untyped]

    seen: set[int] = set()
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)] if children else [root]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def read_cpu(engine_pid: int | None) -> CpuTimes:
    """One reading; 'watched' is quantrack's own process (not its children: other servers it started, such as a
    KL baseline, compete like any other process) plus the engine's whole process tree."""
    busy, steal, total = _proc_stat()
    watched = _tree_cpu((os.getpid(),), children=False) + (_tree_cpu((engine_pid,)) if engine_pid else 0.0)
    return CpuTimes(wall=time.monotonic(), busy=busy, steal=steal, total=total, watched=watched,
                    load1=os.getloadavg()[0])


def summarize_cpu(step: str, samples: list[CpuTimes], cores: int | None = None,
                  engine_cpu: tuple[float, float] | None = None, limits: Limits | None = None) -> Hygiene:
    """Pure: the step's hygiene from its first and last CPU readings (and every load average between).

    ``engine_cpu`` is (first, last) CPU seconds of the engine tree alone, when measured apart from the
    quantrack process."""
    n = cores or os.cpu_count() or 1
    h = Hygiene(step=step, cores=n, samples=len(samples), limits=limits or Limits())
    if len(samples) < 2:
        return h
    a, b = samples[0], samples[-1]
    wall = b.wall - a.wall
    h.seconds = wall
    if wall <= 0:
        return h
    busy = b.busy - a.busy
    watched = b.watched - a.watched
    h.others_cpu_cores = max(0.0, (busy - watched) / wall)
    tot = b.total - a.total
    h.steal_pct = 100.0 * (b.steal - a.steal) / tot if tot > 0 else 0.0
    h.load1_max = max(s.load1 for s in samples)
    if engine_cpu is not None:
        h.engine_cpu_cores = max(0.0, (engine_cpu[1] - engine_cpu[0]) / wall)
    return h


def _gpu_reading(index: int, engine_pids: set[int]) -> tuple[float | None, list[str], int | None]:
    """(SM clock MHz, throttle reasons other than idle, processes on the device not in the engine tree)."""
    import pynvml  # type: ignore[import-untyped]

    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    clock = float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    mask = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    names = {
        "nvmlClocksThrottleReasonSwPowerCap": "power cap",
        "nvmlClocksThrottleReasonHwSlowdown": "hardware slowdown",
        "nvmlClocksThrottleReasonSwThermalSlowdown": "thermal (software)",
        "nvmlClocksThrottleReasonHwThermalSlowdown": "thermal (hardware)",
        "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "power brake",
    }
    reasons = [label for attr, label in names.items() if mask & int(getattr(pynvml, attr, 0) or 0)]
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        others: int | None = sum(1 for p in procs if p.pid not in engine_pids)
    except pynvml.NVMLError:
        others = None
    return clock, reasons, others


class Sampler:
    """Samples the host (and a GPU, if NVML works) once per ``interval`` seconds in a daemon thread."""

    def __init__(self, step: str, engine_pid: int | None = None, gpu_index: int | None = None,
                 interval: float = 1.0, limits: Limits | None = None) -> None:
        self.step = step
        self.engine_pid = engine_pid
        self.gpu_index = gpu_index
        self.interval = interval
        self.limits = limits or Limits()
        self._samples: list[CpuTimes] = []
        self._engine: list[float] = []
        self._gpu_clock: list[float] = []
        self._gpu_throttle: set[str] = set()
        self._gpu_others: list[int] = []
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = False
        self.result: Hygiene | None = None

    def _sample_once(self) -> None:
        try:
            self._samples.append(read_cpu(self.engine_pid))
            if self.engine_pid:
                self._engine.append(_tree_cpu((self.engine_pid,)))
        except (OSError, ValueError) as exc:
            self._errors.append(f"host: {exc}")
        if self._nvml and self.gpu_index is not None:
            import psutil
            import pynvml

            try:

                pids = {self.engine_pid} if self.engine_pid else set()
                if self.engine_pid:
                    try:
                        pids |= {c.pid for c in psutil.Process(self.engine_pid).children(recursive=True)}
                    except psutil.Error:
                        pass
                clock, reasons, others = _gpu_reading(self.gpu_index, pids)
                if clock is not None:
                    self._gpu_clock.append(clock)
                self._gpu_throttle.update(reasons)
                if others is not None:
                    self._gpu_others.append(others)
            except (pynvml.NVMLError, psutil.Error, OSError) as exc:  # a reading lost is recorded, not fatal
                self._errors.append(f"gpu: {exc}")
                self._nvml = False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample_once()

    def start(self) -> Sampler:
        if self.gpu_index is not None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = True
            except (ImportError, OSError) as exc:  # no pynvml: GPU facts stay unknown, said so
                self._errors.append(f"gpu: NVML unavailable ({type(exc).__name__})")
            except pynvml.NVMLError as exc:  # no driver
                self._errors.append(f"gpu: NVML unavailable ({exc})")
        self._sample_once()
        self._thread = threading.Thread(target=self._loop, name=f"hygiene-{self.step}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Hygiene:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample_once()
        eng = (self._engine[0], self._engine[-1]) if len(self._engine) >= 2 else None
        h = summarize_cpu(self.step, self._samples, cores=os.cpu_count(), engine_cpu=eng, limits=self.limits)
        if self._gpu_clock:
            h.gpu_sm_clock_mhz_min = min(self._gpu_clock)
        h.gpu_throttle = sorted(self._gpu_throttle)
        h.gpu_other_processes = max(self._gpu_others) if self._gpu_others else None
        h.errors = list(self._errors)
        if self._nvml:
            import pynvml

            with suppress(pynvml.NVMLError):  # shutting down fails only if NVML was never up
                pynvml.nvmlShutdown()
        return h


@contextmanager
def sampling(step: str, engine_pid: int | None = None, gpu_index: int | None = None,
             interval: float = 1.0) -> Iterator[Sampler]:
    """``with sampling("latency", pid) as s: …``; then ``s.result`` holds the step's Hygiene."""
    s = Sampler(step, engine_pid=engine_pid, gpu_index=gpu_index, interval=interval).start()
    try:
        yield s
    finally:
        s.result = s.stop()


def cv(values: list[float]) -> float | None:
    """Coefficient of variation (sample stdev / mean) of a step's per-request figures; None for < 2."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    if m == 0:
        return None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return var ** 0.5 / m
