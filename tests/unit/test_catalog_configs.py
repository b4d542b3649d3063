"""Every catalog entry added from a published config re-derives from that config (rules/models.toml).

Dense entries: ``shape_from_config`` on the copied config gives the entry's shapes and parameter count.
MoE / MLA / hybrid entries: the same, with the parameter count of the checkpoint's published tensor layout
(tests/hub_models.py), checked again against the model cards' rounded counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import hub_models as hm
import pytest

from quantrack.hardware.capacity import kv_bytes_per_token
from quantrack.hardware.catalog import get_model
from quantrack.models.hfconfig import checkpoint_weights, shape_from_config

DATA = Path(__file__).resolve().parents[1] / "data"
LLM_PROF = json.loads((DATA / "hub" / "llm-prof-configs.json").read_text())
FIELDS = ("layers", "kv_heads", "head_dim", "hidden_size", "vocab_size", "attention_heads", "intermediate_size",
          "tied_embeddings", "max_context", "v_head_dim", "attention", "sliding_window", "sliding_layers",
          "num_experts", "experts_per_token", "moe_intermediate_size")


@pytest.mark.parametrize(("name", "hf_id", "card_billions"), [
    ("Llama-3.2-3B", "meta-llama/Llama-3.2-3B", "3.21"), ("Qwen2.5-3B", "Qwen/Qwen2.5-3B", "3.09"),
    ("Qwen2.5-14B", "Qwen/Qwen2.5-14B", "14.8"), ("Qwen2.5-32B", "Qwen/Qwen2.5-32B", "32.8"),
    ("Qwen3-4B", "Qwen/Qwen3-4B", "4.02"), ("Qwen3-14B", "Qwen/Qwen3-14B", "14.8"),
    ("Qwen3-8B", "Qwen/Qwen3-8B", "8.19"), ("Qwen3-32B", "Qwen/Qwen3-32B", "32.8"), ("Qwen2.5-7B", "Qwen/Qwen2.5-7B", "7.62"),
])
def test_dense_entries_match_their_config(name: str, hf_id: str, card_billions: str) -> None:
    entry = get_model(name)
    derived = shape_from_config(LLM_PROF[hf_id], name=hf_id)
    assert entry.hf_id == hf_id and entry.source
    assert {f: getattr(entry, f) for f in FIELDS} == {f: getattr(derived, f) for f in FIELDS}
    assert int(entry.params_exact or entry.params) == int(derived.params)
    assert f"{derived.params / 1e9:.3g}" == card_billions  # the Hub model page's count (3 significant digits)


@pytest.mark.parametrize(("name", "config", "build", "card"), [
    ("Qwen3-30B-A3B", "qwen3-30b-a3b", hm.qwen3_moe, 30.5),  # "30.5B in total"
    ("DeepSeek-V3", "deepseek-v3", hm.deepseek_v3, 671),  # "671B total parameters"
    ("gpt-oss-120b", "gpt-oss-120b", hm.gpt_oss, 116.83),  # "116.83B"
    ("Mixtral-8x7B", "mixtral-8x7b", hm.mixtral, 46.7),  # Mistral AI: "46.7B total parameters"
    ("Qwen3-235B-A22B", "qwen3-235b-a22b", hm.qwen3_moe, 235),  # model card: "235B in total"
])
def test_layout_entries_match_their_config_and_checkpoint(name: str, config: str, build: object,
                                                          card: float) -> None:
    cfg = hm.config(config)
    ckpt = checkpoint_weights(build(cfg), cfg)  # type: ignore[operator]
    derived = shape_from_config(cfg, name=name, checkpoint=ckpt)
    entry = get_model(name)
    assert {f: getattr(entry, f) for f in FIELDS} == {f: getattr(derived, f) for f in FIELDS}
    assert entry.params == derived.params == ckpt.logical_params
    digits = len(str(card).split(".")[1]) if "." in str(card) else 0
    assert round(entry.params / 1e9, digits) == card


def test_gpt_oss_20b_entry() -> None:
    cfg = json.loads((DATA / "configs" / "gpt-oss-20b.json").read_text())
    ckpt = checkpoint_weights(hm.gpt_oss(cfg), cfg)
    assert get_model("gpt-oss-20b").params == ckpt.logical_params
    assert round(ckpt.logical_params / 1e9, 2) == 20.91 and round(ckpt.total_bytes / 1024**3, 1) == 12.8  # card


def test_mla_and_hybrid_kv_bytes_from_the_catalog() -> None:
    # DeepSeek-V2 paper §2.1.4: (d_c + d_h^R) x l elements per token; the latent is on every TP rank
    assert kv_bytes_per_token(get_model("DeepSeek-R1"), "bf16", tp=8) == (512 + 64) * 61 * 2
    assert kv_bytes_per_token(get_model("gpt-oss-120b"), "fp8") == 36 * 8 * 64 * 2
