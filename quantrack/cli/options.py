"""Option groups shared by several commands (one definition, one help text)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

_MODEL_OPTIONS = (
    click.option("--model", help="Catalog model name (see `quantrack catalog models`) or a Hugging Face Hub id "
                                 "ORG/NAME[@REVISION] (config.json + safetensors headers, cached; HF_TOKEN, "
                                 "HF_HUB_OFFLINE, HF_ENDPOINT honoured)."),
    click.option("--config", type=click.Path(dir_okay=False), help="A Hugging Face config.json."),
    click.option("--gguf", type=click.Path(dir_okay=False), help="A GGUF file (metadata only is read)."),
    click.option("--params", help="Total parameter count, e.g. 8.03e9."),
    click.option("--layers", help="Number of layers."),
    click.option("--kv-heads", help="KV heads."),
    click.option("--head-dim", help="Head dimension."),
)


def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ways to name a model for capacity arithmetic: catalog or Hub id, config.json, GGUF, or explicit shapes.

    A command resolves ``--model`` with ``quantrack.hub.resolve_model`` (catalog name -> catalog shape, no network;
    ORG/NAME[@REV] -> the Hub checkpoint).
    """
    for opt in reversed(_MODEL_OPTIONS):
        f = opt(f)
    return f
