"""Option groups shared by several commands (one definition, one help text)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

_MODEL_OPTIONS = (
    click.option("--model", metavar="NAME|ORG/NAME", help="Catalog model name (see `quantrack catalog models`) or a Hugging Face Hub id "
                                 "ORG/NAME[@REVISION] (config.json + safetensors headers, cached; HF_TOKEN, "
                                 "HF_HUB_OFFLINE, HF_ENDPOINT honoured)."),
    click.option("--config", type=click.Path(dir_okay=False), help="A Hugging Face config.json."),
    click.option("--gguf", type=click.Path(dir_okay=False), help="A GGUF file (metadata only is read)."),
    click.option("--params", metavar="COUNT", help="Total parameter count, e.g. 8.03e9. [number > 0]"),
    click.option("--layers", metavar="INTEGER", help="Number of layers. [integer ≥ 1]"),
    click.option("--kv-heads", metavar="INTEGER", help="KV heads. [integer ≥ 1]"),
    click.option("--head-dim", metavar="INTEGER", help="Head dimension. [integer ≥ 1]"),
)


def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ways to name a model for capacity arithmetic: catalog or Hub id, config.json, GGUF, or explicit shapes.

    A command resolves ``--model`` with ``quantrack.models.hub.resolve_model`` (catalog name -> catalog shape, no network;
    ORG/NAME[@REV] -> the Hub checkpoint).
    """
    for opt in reversed(_MODEL_OPTIONS):
        f = opt(f)
    return f


# --- options built from the settings schema (quantrack.settings): one definition for the flag and the study key


class SettingType(click.ParamType):
    """A click type that parses and checks a value with the setting's own rule (quantrack.settings), so the
    flag accepts exactly what the study key does, and a bad value is quantrack's one-line error."""

    def __init__(self, cls: type, field: str, flag: str) -> None:
        from quantrack.settings import fields_of

        self.cls, self.field, self.flag = cls, field, flag
        kind, check, _ = fields_of(cls)[field]
        self.choices = check.choices
        base = kind.item or kind.base
        self.name = "|".join(check.choices) if check.choices else {"int": "integer", "float": "float"}.get(base, "text")
        if kind.base == "list":
            self.name = f"{self.name}[,{self.name}...]"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:  # type: ignore[override]
        return f"[{self.name}]" if self.choices else self.name.upper()

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from quantrack.settings import convert, parse_text

        if isinstance(value, str):
            return parse_text(self.cls, self.field, value, self.flag)
        if isinstance(value, list):
            value = tuple(value)
        return convert(self.cls, self.field, value, self.flag)


_UNSET: Any = object()


def setting_option(cls: type, field: str, *aliases: str, name: str | None = None, default: Any = _UNSET,
                   help: str | None = None, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@setting_option(LatencySpec, "input_tokens", "--input-len")``: the option for a study setting, with
    the setting's type, range, default and help (``default``/``help`` override them for this command);
    ``aliases`` are other spellings of the same flag (the engines' benchmark flags)."""
    from quantrack.settings import fields_of, flag_of, help_text

    kind, _check, field_default = fields_of(cls)[field]
    flag = flag_of(cls, field)
    value = field_default if default is _UNSET else default
    if value is dataclasses.MISSING:
        value = None
    text = help_text(cls, field, help)
    decls = [flag, *aliases, name or field]  # the Python name: the field's, unless the command names it
    if kind.base == "bool":
        return click.option(*decls, is_flag=True, default=bool(value), help=text, **kwargs)
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value) if value else None
    return click.option(*decls, type=SettingType(cls, field, flag), default=value,
                        show_default=value is not None, help=text, **kwargs)

