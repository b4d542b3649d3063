"""quantrack.hardware.units: memory strings -> bytes (bare = GiB, GB decimal, lone G rejected)."""

from __future__ import annotations

import pytest

from quantrack.errors import BadInput
from quantrack.hardware.units import fmt_bytes, fmt_int, is_decimal, parse_memory, unit_of


@pytest.mark.parametrize(("text", "expected"), [
    ("24", 24 * 2**30),
    ("24GiB", 24 * 2**30),
    ("24 gib", 24 * 2**30),
    ("16GB", 16 * 10**9),
    ("512MiB", 512 * 2**20),
    ("1.5GiB", 1.5 * 2**30),
    ("80e9B", 80 * 10**9),
    (24, 24 * 2**30),
])
def test_parse_memory(text: str, expected: float) -> None:
    assert parse_memory(text) == int(expected)


@pytest.mark.parametrize(("text", "message"), [
    ("0", "memory size must be greater than zero, got '0'"),
    ("-4GiB", "bad memory size '-4GiB': expected a number with an optional unit (24, 24GiB, 16GB, 512MiB)"),
    ("80G", "ambiguous memory size '80G': write GiB (binary) or GB (decimal)"),
    ("12 parsecs", "bad memory size '12 parsecs': unknown unit 'parsecs'; use GiB, MiB, GB, MB (bare number = GiB)"),
    ("", "bad memory size '': expected a number with an optional unit (24, 24GiB, 16GB, 512MiB)"),
])
def test_parse_memory_rejects(text: str, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        parse_memory(text)
    assert str(exc.value) == message


def test_units_and_formatting() -> None:
    assert unit_of("16GB") == "GB" and is_decimal("GB")
    assert unit_of("24") == "GiB" and not is_decimal(unit_of("24"))
    assert fmt_bytes(16_060_000_000) == "14.96 GiB"
    assert fmt_bytes(15_231_233_024, "GB") == "15.23 GB"
    assert fmt_int(920192) == "920,192"
