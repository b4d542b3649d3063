"""Render rows (list of dicts) as a table, JSON, CSV or Markdown: one helper every command uses.

``tabulate`` is imported lazily so that importing this module costs nothing at start-up.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from quantrack.errors import BadInput

FORMATS = ("table", "json", "csv", "md")


def _cell(value: Any) -> Any:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value)
    return value


def render(rows: list[dict[str, Any]], fmt: str = "table", columns: list[str] | None = None,
           title: str | None = None, headers: dict[str, str] | None = None) -> str:
    """Render ``rows``. ``columns`` picks and orders keys (default: keys of the first row, then new ones).

    json: the rows themselves (all keys, stable order) - the title is not included, so the output parses.
    csv: header = column keys. table/md: ``headers`` maps keys to display names; title printed above.
    """
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({c: r.get(c) for c in cols})
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate  # type: ignore[import-untyped]  # lazy

    names = [(headers or {}).get(c, c) for c in cols]
    body = [[_cell(r.get(c)) for c in cols] for r in rows]
    table = tabulate(body, headers=names, tablefmt="github" if fmt == "md" else "simple",
                     disable_numparse=True)
    if title:
        return (f"**{title}**\n\n{table}" if fmt == "md" else f"{title}\n{table}")
    return table
