"""Catalogs: every entry has a source; names, aliases (incl. NVML names) and did-you-mean resolve."""

from __future__ import annotations

import pytest

from quantrack.errors import NotFound
from quantrack.hardware.catalog import get_gpu, get_model, gpus, models

REQUIRED_GPUS = ["T4", "V100", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "RTX 3090", "RTX 4090", "RTX 5090",
                 "H100-SXM", "H100-PCIe", "H200", "B200", "MI250X", "MI300X", "x86-cpu"]
REQUIRED_MODELS = ["Llama-3-8B", "Llama-3-70B", "Llama-3.1-8B", "Llama-3.1-70B", "Qwen2.5-0.5B", "Qwen2.5-7B",
                   "Qwen2.5-72B", "Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B", "Mistral-7B-v0.1", "Mistral-7B-v0.3",
                   "SmolLM2-135M"]


def test_every_entry_has_a_source_and_required_entries_exist() -> None:
    assert {g.name for g in gpus()} >= set(REQUIRED_GPUS)
    assert {m.name for m in models()} >= set(REQUIRED_MODELS)
    assert all(g.source for g in gpus()) and all(m.source for m in models())
    spellings = [s.lower() for g in gpus() for s in (g.name, *g.aliases)]
    assert len(spellings) == len(set(spellings)), "a GPU alias is claimed twice"


@pytest.mark.parametrize(("name", "canonical"), [
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("Tesla T4", "T4"),
    ("h100", "H100-SXM"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("rtx_4090", "RTX 4090"), ("cpu", "x86-cpu"),
])
def test_gpu_aliases(name: str, canonical: str) -> None:
    assert get_gpu(name).name == canonical


def test_gpu_facts() -> None:
    h200 = get_gpu("H200")
    assert h200.nvml_total_mib == 143771 and h200.total_bytes == 143771 * 2**20
    assert h200.cc_int == 90 and h200.arch == "hopper"
    assert get_gpu("MI250X").gfx == "gfx90a" and get_gpu("MI300X").gfx == "gfx942"
    assert get_gpu("MI300X").compute_capability is None
    assert get_gpu("T4").cc_int == 75 and get_gpu("RTX 5090").cc_int == 120
    assert get_gpu("x86-cpu").vendor == "cpu"


def test_unknown_gpu_suggests_from_aliases() -> None:
    with pytest.raises(NotFound) as exc:
        get_gpu("A100-SXM4-80")
    assert str(exc.value) == "unknown GPU 'A100-SXM4-80' (did you mean 'A100-80GB'?); see `quantrack catalog gpus`"
    with pytest.raises(NotFound) as exc:
        get_gpu("zz9000")
    assert str(exc.value) == "unknown GPU 'zz9000'; see `quantrack catalog gpus`"


def test_models_and_seed_params() -> None:
    assert get_model("Llama-3-8B").params == 8.03e9
    assert get_model("meta-llama/Meta-Llama-3-8B").params_exact == 8_030_261_248
    assert get_model("Llama-3-70B").params == 70.6e9
    assert get_model("qwen2.5-7b-instruct").params == 7_615_616_512
    smol = get_model("SmolLM2-135M")
    assert (smol.layers, smol.kv_heads, smol.head_dim, smol.hidden_size, smol.vocab_size, smol.params) == (
        30, 3, 64, 576, 49152, 134_515_008)
    assert smol.tied_embeddings and smol.embedding_params == 49152 * 576
    assert get_model("Mistral-7B-v0.1").unsupported == ("sliding_window=4096",)
    with pytest.raises(NotFound) as exc:
        get_model("Lama-3-8B")
    assert str(exc.value) == "unknown model 'Lama-3-8B' (did you mean 'Llama-3-8B'?); see `quantrack catalog models`"
