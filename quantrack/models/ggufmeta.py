"""GGUF metadata -> ModelShape, read with the ``gguf`` package (GGUFReader; memory-mapped, weights untouched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.hardware.catalog import ModelShape


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except (ValueError, IndexError, TypeError, KeyError):  # a malformed field reads as absent
        return None


def load_gguf(path: str | Path) -> ModelShape:
    """block_count, head_count(_kv), key_length, embedding_length, vocab, file type, params from tensor shapes."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"--gguf {p}: no such file")
    from gguf import GGUFReader  # lazy: numpy + mmap
    from gguf.constants import LlamaFileType

    try:
        reader = GGUFReader(str(p), "r")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise BadInput(f"--gguf {p}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise BadInput(f"--gguf {p}: general.architecture missing")

    def key(k: str) -> Any:
        return _field(reader, f"{arch}.{k}")

    layers, hidden, heads = key("block_count"), key("embedding_length"), key("attention.head_count")
    missing = [n for n, v in (("block_count", layers), ("embedding_length", hidden),
                               ("attention.head_count", heads)) if not v]
    if missing:
        raise BadInput(f"--gguf {p}: missing {', '.join(arch + '.' + m for m in missing)}")
    if key("attention.kv_lora_rank") or key("ssm.state_size"):
        raise BadInput(f"--gguf {p}: not modelled: MLA or SSM layers ({arch})")
    kv_heads = key("attention.head_count_kv") or heads
    head_dim = key("attention.key_length") or int(hidden) // int(heads)
    v_dim = key("attention.value_length")
    vocab = key("vocab_size")
    if not vocab:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    names = {t.name for t in reader.tensors}
    params = sum(int(t.n_elements) for t in reader.tensors)
    ftype = _field(reader, "general.file_type")
    try:
        ftype_name = LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else None
    except ValueError:
        ftype_name = str(ftype)
    window = key("attention.sliding_window")
    return ModelShape(
        name=str(_field(reader, "general.name") or p.stem), params=float(params), layers=int(layers),
        kv_heads=int(kv_heads), head_dim=int(head_dim), hidden_size=int(hidden),
        vocab_size=int(vocab) if vocab else None, attention_heads=int(heads),
        intermediate_size=int(key("feed_forward_length")) if key("feed_forward_length") else None,
        tied_embeddings="output.weight" not in names, dtype="bf16",
        max_context=int(key("context_length")) if key("context_length") else None,
        source=f"{p.name} (GGUF metadata; params = sum of {len(reader.tensors)} tensor shapes)",
        unsupported=(f"sliding_window={window}",) if window else (),
        v_head_dim=int(v_dim) if v_dim and int(v_dim) != int(head_dim) else None,
        extra={"file_type": ftype_name, "architecture": arch, "tensor_count": len(reader.tensors)},
    )
