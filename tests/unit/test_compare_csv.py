"""`compare --format csv` on the committed stores: pandas reads every figure column as a number, and every number
equals the figure the Markdown table shows for the same arm.

The stores are the ones the docs quote (docs/gpu/*-store*.tar.gz, docs/cpu-qwen-store.tar.gz): SQLite MLflow
stores measured on an H200 and on a CPU, extracted to a temp folder (as in tests/unit/test_verify.py).
"""

from __future__ import annotations

import io
import math
import re
import sqlite3
import tarfile
from pathlib import Path
from typing import Any

import pytest

from quantrack.cli import main
from quantrack.report.compare import FILL, build_table, compare_by_gpu, render_many
from quantrack.report.compare_csv import CSV_COLUMNS, FLAGS, NUMERIC

pd = pytest.importorskip("pandas")

REPO = Path(__file__).resolve().parents[2]
STORES = sorted((REPO / "docs" / "gpu").glob("*store*.tar.gz")) + [REPO / "docs" / "cpu-qwen-store.tar.gz"]
SKIP_EXPERIMENTS = ("Default", "quantrack-node-facts")


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """(tracking URI, experiment) for every study experiment of every committed store."""
    root = tmp_path_factory.mktemp("committed-stores")
    out = []
    for tar in STORES:
        dest = root / tar.name.removesuffix(".tar.gz")
        with tarfile.open(tar) as tf:
            tf.extractall(dest, filter="data")
        (db,) = sorted(dest.rglob("mlflow.db"))
        with sqlite3.connect(db) as con:
            names = [r[0] for r in con.execute("select name from experiments order by name")]
        out += [(f"sqlite:///{db}", n) for n in names if n not in SKIP_EXPERIMENTS]
    return out


def _md_rows(md: str) -> list[dict[str, str]]:
    """The rows of every pipe table in ``md`` as {header: cell}."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _number(cell: str) -> float | None:
    """The first number of a reader's cell ('4.82 ms ⚠', '"920,192"', '+0.5 pts', '-0.01%'); None for FILL IN / —."""
    m = re.search(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", cell)
    if cell.startswith((FILL, "—", "n/a")) or m is None:
        return None
    return float(m.group(0).replace(",", ""))


def _close(shown: float | None, value: Any, decimals: int) -> bool:
    """The CSV's full-precision value rounds to the figure shown (empty cell <-> FILL IN)."""
    if shown is None:
        return value is None or (isinstance(value, float) and math.isnan(value))
    return value is not None and not math.isnan(value) and abs(float(value) - shown) <= 0.5 * 10 ** -decimals + 1e-9


def _check_against_md(csv_row: dict[str, Any], md: dict[str, str]) -> int:
    """Assert every CSV figure equals the Markdown cell it comes from; returns how many figures were compared."""
    base = csv_row["is_baseline"]
    figures = [("weights_gib", "Weights (GiB)", 2, 1), ("capacity_tok", "Capacity (tok)", 0, 1),
               ("predicted_tok", "Predicted (tok)", 0, 1), ("capacity_error_pct", "Cap. error", 2, 1),
               ("kv_mib", "KV (MiB)", 2, 1), ("tpot_ms", "Batch-1 TPOT", 2, 1)]
    if not base:
        figures += [("top1_agree", "Top-1 agree", 1, 100), ("kl_mean", "KL", 4, 1)]
        delta_header = next(h for h in md if h.startswith("Δ vs "))
        figures.append(("delta_pp", delta_header, 1, 1))
    cost_header = next(h for h in md if h.startswith("$ / 1M"))
    figures.append(("usd_per_1m_out_tok", cost_header, 3, 1))
    n = 0
    for key, header, decimals, scale in figures:
        v = csv_row[key]
        value = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) * scale
        shown = _number(md[header])
        if key == "usd_per_1m_out_tok" and shown is not None and shown >= 10:
            decimals = 2
        assert _close(shown, value, decimals), (csv_row["arm"], key, md[header], v)
        n += 1
    # the flag that was a ⚠ in the cell is its own column
    assert ("⚠" in md["Batch-1 TPOT"]) == (csv_row["tpot_contended"] is True), csv_row["arm"]
    # the accuracy column is named after the task (GSM8K, or a task file's / humaneval's name)
    gsm = md["GSM8K"] if "GSM8K" in md else md[str(csv_row["accuracy_task"])]
    m = re.fullmatch(r"([\d.]+)% \[([\d.]+), ([\d.]+)\](?: n=(\d+))?", gsm)
    if m:
        for key, shown in zip(("gsm8k_acc", "gsm8k_lo", "gsm8k_hi"), m.groups()[:3], strict=True):
            assert _close(float(shown), csv_row[key] * 100, 1), (csv_row["arm"], key, gsm)
        if m.group(4):
            assert csv_row["gsm8k_n"] == int(m.group(4))
        n += 3
    else:
        assert gsm == FILL and math.isnan(csv_row["gsm8k_acc"]), (csv_row["arm"], gsm)
    p = re.match(r"McNemar p=([\d.e+-]+) \(n=(\d+)\)( \*)?", md["Paired test"])
    if p:
        assert f"{csv_row['paired_p']:.3g}" == p.group(1) and csv_row["paired_n"] == int(p.group(2))
        assert bool(csv_row["paired_significant"]) == bool(p.group(3))
        n += 2
    else:
        assert math.isnan(csv_row["paired_p"]), (csv_row["arm"], md["Paired test"])
    return n


def test_csv_loads_into_pandas_with_numeric_figure_columns(studies: list[tuple[str, str]]) -> None:
    assert len(studies) >= 6, studies
    compared = 0
    for uri, experiment in studies:
        tables = compare_by_gpu(experiment, uri=uri)
        text = render_many(tables, "csv")
        df = pd.read_csv(io.StringIO(text))
        assert list(df.columns) == [k for k, _, _ in CSV_COLUMNS], experiment
        assert len(df) == sum(len(t.rows) for t in tables)
        for col in NUMERIC:  # every figure column is a number column (empty = NaN), never text
            assert pd.api.types.is_numeric_dtype(df[col]), (experiment, col, df[col].dtype, df[col].tolist())
        for col in FLAGS:  # flags: True / False, empty where not recorded
            assert set(df[col].dropna().tolist()) <= {True, False}, (experiment, col, df[col].tolist())
        assert not any(s in text for s in ("⚠", FILL, " ms", " pts", "—")), experiment
        md_rows = [row for t in tables for row in _md_rows(render_many([t], "md"))]
        assert len(md_rows) == len(df)
        for csv_row, md in zip(df.to_dict("records"), md_rows, strict=True):
            assert csv_row["arm"] == md["Arm"]
            compared += _check_against_md(csv_row, md)
    assert compared > 100  # the stores hold figures, not only empty cells


def test_contended_figures_are_flagged_in_their_own_column() -> None:
    """A ⚠ in the reader's cell is `tpot_contended` / `latency_contended` here (runs of test_contention_carries)."""
    from tests.unit.test_contention_carries import RUNS

    df = pd.read_csv(io.StringIO(render_many([build_table("cpu", RUNS, "F16")], "csv"))).set_index("arm")
    assert df.loc["Q4_0", "tpot_ms"] == 5.0 and bool(df.loc["Q4_0", "tpot_contended"]) is True
    assert bool(df.loc["Q4_0", "sweep_contended"]) is True
    assert df.loc["Q8_0", "tpot_ms"] == 10.0 and bool(df.loc["Q8_0", "tpot_contended"]) is False
    assert pd.api.types.is_float_dtype(df["tpot_ms"])


def test_cli_csv_is_the_machine_view(studies: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    uri, experiment = studies[0]
    assert main(["compare", "--experiment", experiment, "--tracking-uri", uri, "--format", "csv"]) is None
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ",".join(k for k, _, _ in CSV_COLUMNS)
    assert out == render_many(compare_by_gpu(experiment, uri=uri), "csv")
