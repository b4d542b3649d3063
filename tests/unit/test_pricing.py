"""Price table loading, lookup through the GPU catalog, and the derived cost per token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantrack.errors import BadInput, NotFound
from quantrack.hardware.pricing import (
    NOT_PRICED,
    cost_cell,
    cost_column,
    cost_per_million_tokens,
    load_prices,
    price_for,
)

TABLE = """
[[price]]
gpu = "H100-SXM"
aliases = ["H100"]
usd_per_hour = 3.60
date = "2026-01-01"
source = "test table"

[[price]]
gpu = "L4"
usd_per_hour = 0.72
date = "2026-01-01"
source = "test table"
"""


@pytest.fixture
def prices(tmp_path: Path):
    f = tmp_path / "prices.toml"
    f.write_text(TABLE)
    return load_prices(f)


def test_shipped_table_every_entry_dated_and_sourced() -> None:
    table = load_prices()
    assert len(table.prices) >= 5
    for p in table.prices:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.date), p
        assert "@" in p.source and ":" in p.source, p  # repo@sha:path
        assert p.usd_per_hour > 0


def test_shipped_table_prices_the_catalog_h100() -> None:
    # the GPU catalog's canonical name resolves, through its aliases if need be
    from quantrack.hardware.catalog import get_gpu

    p = price_for(get_gpu("H100").name, load_prices())
    assert p.provider and p.instance


def test_cost_is_price_over_throughput(prices) -> None:
    # $3.60/h at 1000 tok/s: 3.6 / 3.6e6 tok = $1e-6 per token = $1.00 per 1M tokens
    assert cost_per_million_tokens("H100", 1000.0, prices) == pytest.approx(1.0)
    assert cost_per_million_tokens("h100-sxm", 500.0, prices) == pytest.approx(2.0)
    assert cost_per_million_tokens("H100", 1000.0, prices, gpu_count=2) == pytest.approx(2.0)
    assert cost_per_million_tokens("L4", 100.0, prices) == pytest.approx(0.72 / 0.36)


@pytest.mark.parametrize("tps", [None, 0, -5.0, float("nan")])
def test_nothing_priced_without_measured_throughput(prices, tps) -> None:
    with pytest.raises(BadInput, match="no measured output throughput"):
        cost_per_million_tokens("H100", tps, prices)


def test_unknown_gpu_names_priced_ones(prices) -> None:
    with pytest.raises(NotFound) as exc:
        price_for("L40", prices)
    msg = str(exc.value)
    assert msg.startswith("no price for GPU 'L40'")
    assert "priced: H100-SXM, L4" in msg and "--prices FILE" in msg


def test_cost_cell_and_column(prices) -> None:
    assert cost_column(16) == "$ / 1M out tok (derived, @c16)"
    assert cost_cell("H100", {1: 40.0, 16: 1000.0}, 16, prices) == "1.000"
    assert cost_cell("H100", {1: 40.0}, 1, prices) == "25.00"
    assert cost_cell("H100", {1: 40.0}, 16, prices) == NOT_PRICED  # level not measured: no interpolation
    assert cost_cell(None, {16: 1000.0}, 16, prices) == NOT_PRICED
    assert cost_cell("B300", {16: 1000.0}, 16, prices) == NOT_PRICED


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[price]]\ngpu = "X"\nusd_per_hour = 1.0\ndate = "2026-01-01"\n', "missing 'source'"),
        ('[[price]]\ngpu = "X"\nusd_per_hour = -1\ndate = "d"\nsource = "s"\n', "usd_per_hour must be a positive"),
        ('[[price]]\ngpu = "X"\nusd_per_hour = 1\ndate = "d"\nsource = "s"\ncost = 2\n', "unknown key 'cost'"),
        ("name = 'x'\n", "needs at least one [[price]] table"),
        ("[[price]\n", "is not valid TOML"),
        (('[[price]]\ngpu = "X"\nusd_per_hour = 1\ndate = "d"\nsource = "s"\n'
         '[[price]]\ngpu = "x"\nusd_per_hour = 2\ndate = "d"\nsource = "s"\n'), "already priced by 'X'"),
    ],
)
def test_bad_price_files_are_one_line_errors(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(body)
    with pytest.raises(BadInput) as exc:
        load_prices(f)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_missing_prices_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"prices file '.*nope\.toml': file not found"):
        load_prices(tmp_path / "nope.toml")
