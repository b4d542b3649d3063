"""Read this node's NVIDIA GPUs through NVML (pynvml, imported only inside ``read_gpus``).

Owns the one place quantrack talks to the driver, and the mapping from an NVML device name
(``NVIDIA H100 80GB HBM3``) to the GPU catalog. Without a driver (CI, laptops) ``read_gpus``
raises EnvironmentMissing with one line; ``--gpu NAME`` checks a catalog GPU instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from quantrack.errors import EnvironmentMissing
from quantrack.hardware.catalog import GPU, gpus
from quantrack.hardware.rulebook import NodeFacts, arch_from_cc

NO_DRIVER = "no NVIDIA driver found (NVML could not be loaded); use --gpu NAME to check a GPU from the catalog"


@dataclass(frozen=True)
class NodeGPU:
    """One visible device as NVML reports it, with its catalog entry (or one built from NVML facts)."""

    index: int
    name: str  # NVML's name, e.g. "NVIDIA H100 80GB HBM3"
    uuid: str | None
    compute_capability: tuple[int, int]
    memory_bytes: int
    driver_version: str
    cuda_driver_version: str  # the highest CUDA the driver supports, e.g. "12.8" (not the engine's build)
    mig: bool | None  # current MIG mode; None when the device has no MIG support
    gpu: GPU  # catalog entry, or a GPU built from the NVML facts (source says which)

    @property
    def cc_int(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def in_catalog(self) -> bool:
        return not self.gpu.source.startswith("NVML")

    def to_facts(self) -> NodeFacts:
        return NodeFacts(name=self.gpu.name, vendor="nvidia", arch=self.gpu.arch or arch_from_cc(self.cc_int),
                         cc=self.cc_int, memory_gib=self.memory_bytes / 2**30, mig=self.mig,
                         cuda_driver=self.cuda_driver_version)


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


def match_catalog(nvml_name: str, memory_bytes: int, cc: tuple[int, int], candidates: tuple[GPU, ...] | None = None) -> GPU:
    """The catalog GPU for an NVML name: exact alias first, then the longest catalog name/alias
    contained in the NVML name with the same compute capability; else a GPU built from NVML facts."""
    pool = gpus() if candidates is None else candidates
    key = _norm(nvml_name)
    stripped = _norm(re.sub(r"(?i)^nvidia\s+", "", nvml_name))
    best: tuple[int, GPU] | None = None
    for g in pool:
        names = [_norm(n) for n in (g.name, *g.aliases)]
        if key in names or stripped in names:
            return g
        if g.compute_capability is not None and g.compute_capability != cc:
            continue
        for n in names:
            if n and re.search(rf"(^| ){re.escape(n)}( |$)", stripped) and (best is None or len(n) > best[0]):
                best = (len(n), g)
    if best is not None:
        return best[1]
    return GPU(name=re.sub(r"(?i)^nvidia\s+", "", nvml_name).strip() or nvml_name, vendor="nvidia",
               memory_gib=round(memory_bytes / 2**30, 1), arch=arch_from_cc(cc[0] * 10 + cc[1]),
               compute_capability=cc, source=f"NVML (not in the catalog): {nvml_name!r}")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cuda_version(v: int) -> str:
    """NVML's integer CUDA version (12080) as '12.8'."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def read_gpus() -> list[NodeGPU]:
    """Every visible NVIDIA GPU on this node. Raises EnvironmentMissing without a driver."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        raise EnvironmentMissing(NO_DRIVER) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        raise EnvironmentMissing(NO_DRIVER) from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _cuda_version(int(pynvml.nvmlSystemGetCudaDriverVersion_v2()))
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            cc = tuple(int(x) for x in pynvml.nvmlDeviceGetCudaComputeCapability(h))
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            try:
                uuid: str | None = _text(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError:
                uuid = None
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig: bool | None = current == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig = None  # NotSupported: no MIG on this device
            cc2 = (cc[0], cc[1])
            out.append(NodeGPU(index=i, name=name, uuid=uuid, compute_capability=cc2, memory_bytes=mem,
                               driver_version=driver, cuda_driver_version=cuda, mig=mig,
                               gpu=match_catalog(name, mem, cc2)))
        return out
    except pynvml.NVMLError as exc:
        raise EnvironmentMissing(f"NVML error while reading GPUs: {exc}") from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
