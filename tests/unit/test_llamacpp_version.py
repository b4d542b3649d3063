"""llama.cpp's version from the xllamacpp wheel: its server says `build_info: b0-unknown` (no build number, no
commit), quantrack's wrapper prints the wheel's version first; the log parser takes that, and the live facts
(`/props`) say the version is unknown and why instead of reporting "b0-unknown" as one.
Data: a real start, tests/data/logs/README.md."""

from __future__ import annotations

import json
from pathlib import Path

from quantrack.engines import get_adapter
from quantrack.engines.llamacpp import parse_props

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
LOG = DATA / "xllamacpp-SmolLM2-Q8_0-np1.log"


def test_log_takes_the_wheel_version_over_b0_unknown() -> None:
    lines = LOG.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "quantrack-xllamacpp: xllamacpp 2026.10.11549 (llama.cpp build 0, commit unknown)"
    assert any(ln.endswith("build_info: b0-unknown") for ln in lines)
    r = get_adapter("llamacpp").parse_log_file(LOG)
    assert (r.engine, r.engine_version, r.quantization) == ("llamacpp", "xllamacpp 2026.10.11549", "Q8_0")


def test_log_without_the_wrapper_line_keeps_build_info() -> None:
    lines = LOG.read_text(encoding="utf-8").splitlines()[1:]  # a server not started through quantrack's wrapper
    assert get_adapter("llamacpp").parse_log(lines).engine_version == "b0-unknown"


def test_props_b0_unknown_is_not_a_version() -> None:
    facts = parse_props(json.loads((DATA / "xllamacpp-SmolLM2-Q8_0-np1.props.json").read_text(encoding="utf-8")))
    assert "engine_version" not in facts and facts["build_info"] == "b0-unknown"
    assert "built without its version" in facts["engine_version_unknown"]
    assert parse_props({"build_info": "b5201-85f36e5e"})["engine_version"] == "b5201-85f36e5e"  # a real build
