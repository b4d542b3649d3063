"""quantrack.hardware.nvml with a fake pynvml module (tests our mapping code, not a GPU)."""

from __future__ import annotations

import sys
import types

import pytest

from quantrack.arms import parse_arm_spec
from quantrack.errors import EnvironmentMissing
from quantrack.hardware.nvml import NO_DRIVER, match_catalog, read_gpus
from quantrack.hardware.rulebook import evaluate, overall


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


def fake_pynvml(devices: list[dict], init_error: type[Exception] | None = None) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVMLError_LibraryNotFound = FakeLibraryNotFound
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.shutdowns = 0

    def init() -> None:
        if init_error:
            raise init_error("NVML Shared Library Not Found")

    def shutdown() -> None:
        m.shutdowns += 1

    def mig(h: int) -> tuple[int, int]:
        if devices[h].get("mig") is None:
            raise FakeNVMLError("Not Supported")
        return (1 if devices[h]["mig"] else 0, 0)

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlSystemGetDriverVersion = lambda: "570.124.06"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12080
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: devices[h]["name"].encode()  # older pynvml returns bytes
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: devices[h]["cc"]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=devices[h]["mem"])
    m.nvmlDeviceGetMigMode = mig
    return m


def test_no_driver_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], init_error=FakeLibraryNotFound))
    with pytest.raises(EnvironmentMissing) as err:
        read_gpus()
    assert str(err.value) == NO_DRIVER
    assert str(err.value) == ("no NVIDIA driver found (NVML could not be loaded); use --gpu NAME to check a GPU "
                              "from the catalog")


def test_reads_devices_and_maps_to_catalog(monkeypatch):
    fake = fake_pynvml([
        {"name": "NVIDIA H100 80GB HBM3", "cc": (9, 0), "mem": 85520809984, "mig": True},
        {"name": "NVIDIA A100-SXM4-80GB", "cc": (8, 0), "mem": 85899345920, "mig": False},
        {"name": "Tesla T4", "cc": (7, 5), "mem": 16106127360, "mig": None},
    ])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = read_gpus()
    assert [g.gpu.name for g in found] == ["H100-SXM", "A100-80GB", "T4"]
    h100 = found[0]
    assert (h100.index, h100.uuid, h100.compute_capability, h100.cc_int) == (0, "GPU-0000", (9, 0), 90)
    assert h100.cuda_driver_version == "12.8" and h100.driver_version == "570.124.06"
    assert [g.mig for g in found] == [True, False, None]
    assert fake.shutdowns == 1
    facts = h100.to_facts()
    assert facts.cc == 90 and facts.mig is True and facts.memory_gib == pytest.approx(85520809984 / 2**30)
    # NVML's MIG mode reaches the rules
    assert "mig-fp8-not-native" in {v.rule_id for v in evaluate(h100, parse_arm_spec("fp8"), "vllm", cuda="12.4")}


def test_unknown_device_built_from_nvml_facts():
    g = match_catalog("NVIDIA Imaginary X9", 50 * 2**30, (8, 9))
    assert (g.name, g.arch, g.compute_capability, g.memory_gib) == ("Imaginary X9", "ada", (8, 9), 50.0)
    assert g.source.startswith("NVML (not in the catalog)")
    # a GPU built from NVML facts is still evaluated by capability
    assert overall(evaluate(g, parse_arm_spec("fp8"), "vllm", cuda="12.1")) == "reject"


def test_substring_match_requires_same_capability():
    assert match_catalog("NVIDIA L4", 23 * 2**30, (8, 9)).name == "L4"
    # a name that contains "L4" but reports another capability is not the L4
    assert match_catalog("NVIDIA L4X", 23 * 2**30, (9, 0)).source.startswith("NVML")
