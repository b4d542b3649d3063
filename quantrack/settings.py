"""One definition per setting: its type, range, default and help text, for the study file and the command line.

A setting is a field of a frozen dataclass (``quantrack.study``: ``LatencySpec.input_tokens``,
``EngineSpec.port`` ...) declared with :func:`setting`; the field's type hint gives the type, the
metadata gives the range and the help. The same definition

- validates a TOML table (:func:`build`): unknown keys with a did-you-mean, every value's type and
  range, errors naming the table and key (``[sweep] input_tokens: expected an integer ≥ 1, got "x"``);
- validates a command-line value (:func:`convert` / :func:`parse_text`, used by the click options
  that ``quantrack.cli.options.setting_option`` builds from the field), with the flag's name in the
  message (``--port: expected an integer in 0..65535, got 70000``).

Why dataclasses and not pydantic: the study objects are frozen dataclasses that the runner, preflight
and the fleet code copy with ``dataclasses.replace`` (a pydantic ``BaseModel`` does not support it), TOML
values arrive already typed (so pydantic's coercions would have to be switched off field by field
with strict mode), the messages must be quantrack's one-line form rather than pydantic's
multi-line report, and start-up stays light (``bench/study_load.py``, docs/benchmarks.md: importing
``pydantic.BaseModel`` took 98 ms (min of 15) against 27 ms for ``quantrack.settings`` with the package, on the
loaded 2-core dev machine). What the
module does is small: map a type hint to a check, and a range to a sentence.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantrack.errors import BadInput, did_you_mean

_META = "quantrack.setting"


@dataclass(frozen=True)
class Check:
    """The rule a setting's values obey (the type comes from the field's hint)."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: Sequence[str] | None = None
    nonempty: bool = False  # strings: not empty or blank
    flag: str | None = None  # the command-line spelling, when it is not --<field-name>
    why: str | None = None  # where a bound comes from, said with it (issue #43: a bound states its reason)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, ge: float | None = None,
            gt: float | None = None, le: float | None = None, choices: Iterable[str] | None = None,
            nonempty: bool = False, flag: str | None = None, factory: Any = None, why: str | None = None) -> Any:
    """A dataclass field with its rule: ``port: int = setting(0, "0 = a free port", ge=0, le=65535)``."""
    # a read-only Sequence is kept as given (a live view such as the engine registry's kinds); anything else is
    # copied into a tuple
    kept = None if choices is None else choices if isinstance(choices, Sequence) and not isinstance(
        choices, (list, str)) else tuple(choices)
    check = Check(help=help, ge=ge, gt=gt, le=le, choices=kept, nonempty=nonempty, flag=flag, why=why)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_META: check})
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata={_META: check})
    return dataclasses.field(default=default, metadata={_META: check})


_T = typing.TypeVar("_T")


@typing.dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, setting))
def settings(cls: type[_T]) -> type[_T]:
    """``@settings class LatencySpec: ...``: a frozen dataclass whose ``setting(...)`` fields type checkers see."""
    return dataclass(frozen=True)(cls)


@dataclass(frozen=True)
class Kind:
    """What a type hint accepts: ``base`` in int | float | bool | str | list | table | dict."""

    base: str
    optional: bool = False
    item: str | None = None  # list items: int | str | float


_SCALARS: dict[Any, str] = {int: "int", float: "float", bool: "bool", str: "str"}


def kind_of(hint: Any) -> Kind:
    """``int | None`` -> Kind("int", optional=True); ``tuple[str, ...]`` -> Kind("list", item="str");
    ``tuple[tuple[str, str], ...]`` -> Kind("table") (a TOML table of strings, kept sorted)."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"unsupported setting type {hint!r}")
        hint = args[0]
    origin = typing.get_origin(hint)
    if origin is tuple:
        inner = typing.get_args(hint)[0]
        if typing.get_origin(inner) is tuple:
            return Kind("table", optional)
        return Kind("list", optional, _SCALARS[inner])
    if origin is dict or hint is dict:
        return Kind("dict", optional)
    return Kind(_SCALARS[hint], optional)


def fields_of(cls: type) -> dict[str, tuple[Kind, Check, Any]]:
    """Every setting of a dataclass: name -> (kind, check, default or MISSING)."""
    cached = _CACHE.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Kind, Check, Any]] = {}
    for f in dataclasses.fields(cls):
        check = f.metadata.get(_META)
        if check is None:
            continue
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out[f.name] = (kind_of(hints[f.name]), check, default)
    _CACHE[cls] = out
    return out


_CACHE: dict[type, dict[str, tuple[Kind, Check, Any]]] = {}


def flag_of(cls: type, name: str) -> str:
    """The command-line spelling of a setting: its ``flag`` or ``--<name with dashes>``."""
    check = fields_of(cls)[name][1]
    return check.flag or "--" + name.replace("_", "-")


# --- sentences -------------------------------------------------------------------------------------------

_NOUN = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
_PLURAL = {"int": "integers", "float": "numbers", "str": "strings"}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def range_text(check: Check, base: str) -> str:
    """'≥ 1', 'in 0..65535', 'in (0, 1]', '> 0' or ''."""
    lo, lo_open = (check.gt, True) if check.gt is not None else (check.ge, False)
    hi = check.le
    if lo is not None and hi is not None:
        if base == "int" and not lo_open:
            return f"in {_num(lo)}..{_num(hi)}"
        return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}]"
    if lo is not None:
        return f"{'>' if lo_open else '≥'} {_num(lo)}"
    if hi is not None:
        return f"≤ {_num(hi)}"
    return ""


MAX_INT = 2**31 - 1  # the largest count any engine or HTTP client here takes (C int): 2^64 is refused, not wrapped


def describe(kind: Kind, check: Check) -> str:
    """What a value must be, as the error message says it: 'an integer ≥ 1', 'a list of strings' ..."""
    if kind.base == "table":
        return "a table of strings, like { NAME = \"value\" }"
    if kind.base == "dict":
        return "a table"
    if check.choices is not None:
        return "one of " + ", ".join(check.choices)
    rng = range_text(check, kind.item or kind.base)
    if rng and check.why:
        rng += f" ({check.why})"
    if kind.base == "list":
        assert kind.item is not None
        noun = "non-empty strings" if kind.item == "str" and check.nonempty else _PLURAL[kind.item]
        return f"a list of {noun}" + (f" {rng}" if rng else "")
    noun = _NOUN[kind.base]
    if kind.base == "float":
        noun = "a finite number"
    if kind.base == "str" and check.nonempty:
        noun = "a non-empty string"
    return noun + (f" {rng}" if rng else "")


def shown(value: Any) -> str:
    """A value as the user wrote it (TOML spelling): "x", 500, nan, [1, 2], true."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- checks ----------------------------------------------------------------------------------------------


def _scalar_ok(base: str, check: Check, v: Any) -> tuple[bool, Any]:
    if base == "bool":
        return isinstance(v, bool), v
    if base == "str":
        return isinstance(v, str) and not (check.nonempty and not v.strip()), v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False, v
    if base == "int":
        if not isinstance(v, int) or (check.le is None and abs(v) > MAX_INT):
            return False, v
    elif not math.isfinite(v):
        return False, v
    else:
        v = float(v)
    if check.ge is not None and v < check.ge:
        return False, v
    if check.gt is not None and v <= check.gt:
        return False, v
    if check.le is not None and v > check.le:
        return False, v
    return True, v


def check_value(kind: Kind, check: Check, value: Any, where: str) -> Any:
    """``value`` converted to what the field holds (lists -> tuples, tables -> sorted pairs), or a
    one-line BadInput: ``{where}: expected {what}, got {value}``."""
    if value is None and kind.optional:
        return None

    def bad() -> BadInput:
        values = value if isinstance(value, (list, tuple)) else [value]
        huge = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT]
        if huge and check.le is None:
            return BadInput(f"{where}: {huge[0]:,} is larger than any engine takes (at most {MAX_INT:,})")
        hint = ""
        if check.choices is not None and isinstance(value, str):
            hint = did_you_mean(value, check.choices)
        return BadInput(f"{where}: expected {describe(kind, check)}, got {shown(value)}{hint}")

    if kind.base == "table":
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise bad()
        return tuple(sorted(value.items()))
    if kind.base == "dict":
        if not isinstance(value, Mapping):
            raise bad()
        return dict(value)
    if kind.base == "list":
        assert kind.item is not None
        if not isinstance(value, (list, tuple)):
            raise bad()
        out = []
        for item in value:
            ok, conv = _scalar_ok(kind.item, check, item)
            if not ok or (check.choices is not None and conv not in check.choices):
                raise bad()
            out.append(conv)
        return tuple(out)
    ok, conv = _scalar_ok(kind.base, check, value)
    if not ok or (check.choices is not None and conv not in check.choices):
        raise bad()
    return conv


def convert(cls: type, name: str, value: Any, where: str | None = None) -> Any:
    """Check one value of setting ``cls.name`` (``where`` defaults to its command-line flag)."""
    kind, check, _ = fields_of(cls)[name]
    return check_value(kind, check, value, where or flag_of(cls, name))


def parse_text(cls: type, name: str, text: str, where: str | None = None) -> Any:
    """A command-line string for setting ``cls.name``, parsed by the field's type then checked.
    Lists are comma-separated (``1,4,16``)."""
    kind, check, _ = fields_of(cls)[name]
    flag = where or flag_of(cls, name)
    base = kind.item if kind.base == "list" else kind.base
    parts = [p.strip() for p in text.split(",")] if kind.base == "list" else [text.strip()]
    if kind.base == "list" and parts == [""]:
        raise BadInput(f"{flag}: expected {describe(kind, check)}, got an empty value")
    values: list[Any] = []
    for part in parts:
        try:
            if base == "int":
                values.append(int(part.replace("_", "")))
            elif base == "float":
                values.append(float(part))
            elif base == "bool":
                values.append({"true": True, "1": True, "yes": True, "false": False, "0": False,
                               "no": False}[part.lower()])
            else:
                values.append(text if kind.base != "list" else part)
        except (ValueError, KeyError):
            raise BadInput(f"{flag}: expected {describe(kind, check)}, got {shown(text)}") from None
    if kind.base in ("int", "float"):
        try:
            return check_value(kind, check, values[0], flag)
        except BadInput:  # say it as typed: "got -5", not the parsed "-5.0"
            raise BadInput(f"{flag}: expected {describe(kind, check)}, got {text.strip()}") from None
    return check_value(kind, check, values if kind.base == "list" else values[0], flag)


def build(cls: type, table: Any, where: str, *, skip: Iterable[str] = ()) -> Any:
    """The keyword arguments for ``cls`` from one TOML table: unknown keys refused with a did-you-mean,
    every value checked (cross-field rules are the caller's).
    ``where`` is the table as the user wrote it (``[sweep]``; ``""`` for the top level); keys in
    ``skip`` are left for the caller."""
    if not isinstance(table, Mapping):
        raise BadInput(f"{where or 'the study'}: expected a table, got {shown(table)}")
    known = fields_of(cls)
    prefix = f"{where} " if where else ""
    skipped = list(dict.fromkeys(skip))
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key in skipped:
            continue
        if key not in known:
            raise BadInput(f"{where + ': ' if where else ''}unknown key {key!r}"
                           f"{did_you_mean(key, [*known, *skipped])}; keys: {', '.join([*known, *skipped])}")
        kind, check, _ = known[key]
        kwargs[key] = check_value(kind, check, value, f"{prefix}{key}")
    return kwargs


def help_text(cls: type, name: str, text: str | None = None) -> str:
    """The field's help (or ``text``) followed by its range, for ``--help``: 'Requests per level. [integer ≥ 0]'."""
    kind, check, _ = fields_of(cls)[name]
    rng = range_text(check, kind.item or kind.base)
    if rng and check.why:
        rng += f" ({check.why})"
    what = {"int": "integer", "float": "number"}.get(kind.item or kind.base)
    tail = f" [{what} {rng}]" if rng and what else ""
    return ((check.help if text is None else text) + tail).strip()


def markdown_rows(cls: type, prefix: str = "", rename: Mapping[str, str] | None = None) -> list[str]:
    """One Markdown table row per setting of ``cls``: key, what it accepts, default, flag, help."""
    rows = []
    for name, (kind, check, default) in fields_of(cls).items():
        key = (rename or {}).get(name, prefix + name)
        if default is dataclasses.MISSING:
            shown_default = "required"
        elif default is None:
            shown_default = "none"
        elif kind.base == "table":
            shown_default = "{}"
        else:
            shown_default = shown(list(default) if isinstance(default, tuple) else default)
        flag = f"`{check.flag}`" if check.flag else ""
        rows.append(f"| `{key}` | {describe(kind, check)} | {shown_default} | {flag} | {check.help} |")
    return rows


__all__ = ["Check", "Kind", "build", "check_value", "convert", "describe", "fields_of", "flag_of", "help_text",
           "kind_of", "markdown_rows", "parse_text", "setting", "settings", "shown"]
