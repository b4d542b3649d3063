"""Read an experiment's runs without importing mlflow: the fast read path behind ``tracking.load_runs``.

``import mlflow`` (~1.1 s), opening its SQLAlchemy store (~0.45 s) and building ORM objects for every
param/tag/metric row (~1.4 s for 1,000 runs) dominate a fresh ``quantrack compare``. This module returns
the same ``RunRow`` objects as ``mlflow.search_runs`` would, from:

* ``sqlite:///PATH``: the store's tables through the stdlib ``sqlite3`` module, opened read-only
  (``file:...?mode=ro``), in one read transaction. Guarded: the database's ``alembic_version`` must be a
  revision whose tables are known (``KNOWN_REVISIONS``) and the columns read must exist; otherwise the
  caller falls back to the mlflow client.
* ``http(s)://HOST``: MLflow's public REST API (the one its UI uses) with httpx:
  ``GET /api/2.0/mlflow/experiments/get-by-name`` and paginated ``POST /api/2.0/mlflow/runs/search``.

What mlflow does, and what is reproduced here (mlflow 3.17.2):

* the experiment is looked up by name in any lifecycle stage
  (``SqlAlchemyStore.get_experiment_by_name``); an unknown name lists the active experiments ordered by
  ``creation_time DESC, experiment_id ASC``, at most 1,000 (``search_experiments`` defaults);
* runs: active only (``ViewType.ACTIVE_ONLY``), filtered on the role tag with ``=`` (case-sensitive in
  SQLite), ordered ``start_time IS NULL, start_time DESC, run_uuid ASC`` (``_get_orderby_clauses``:
  the NULLs-last case, the requested order, the run-id tie-break);
* metrics are the ``latest_metrics`` rows, NaN where ``is_nan`` (``SqlLatestMetric.to_mlflow_entity``);
  a run without a name takes its ``mlflow.runName`` tag (``SqlRun.to_mlflow_entity``);
* over REST, absent proto fields read as their proto2 defaults ("" and 0), as ``RunInfo.from_proto`` /
  ``RunTag.from_proto`` read them; an end time of 0 means none.

``read_runs`` returns ``None`` whenever it cannot promise that (unknown schema, workspaces enabled, an
auth plugin, a locked or missing database, an unexpected answer): ``load_runs`` then uses mlflow.
``QUANTRACK_STORE_READER=mlflow`` forces the mlflow client.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from quantrack.run.schema import Tag
from quantrack.store.records import RunRow, TrackingError
from quantrack.store.uri import is_remote

# alembic revisions of mlflow's SQL schema whose experiments/runs/params/tags/latest_metrics tables this
# module reads correctly (checked against mlflow 3.17.2's dbmodels/models.py and its migration head).
KNOWN_REVISIONS = frozenset({"dc11669786a5"})
_COLUMNS = {
    "experiments": {"experiment_id", "name", "lifecycle_stage", "creation_time"},
    "runs": {"run_uuid", "name", "experiment_id", "status", "start_time", "end_time", "lifecycle_stage",
             "artifact_uri"},
    "params": {"key", "value", "run_uuid"},
    "tags": {"key", "value", "run_uuid"},
    "latest_metrics": {"key", "value", "is_nan", "run_uuid"},
}
RUNS_PER_PAGE = 10000  # mlflow.search_runs' page size (NUM_RUNS_PER_PAGE_PANDAS)
EXPERIMENT_LIST_MAX = 1000  # MlflowClient.search_experiments' default max_results
ORDER_BY = "attributes.start_time DESC"
UnknownExperiment = Callable[[list[str]], Exception]


class _Unsupported(Exception):
    """This store cannot be read directly: use the mlflow client."""


def reader_choice() -> str:
    return os.environ.get("QUANTRACK_STORE_READER", "auto").strip().lower() or "auto"


def read_runs(uri: str, experiment: str, role: str | None, unknown_experiment: UnknownExperiment,
              transport: Any = None) -> list[RunRow] | None:
    """The experiment's runs (role-tagged if ``role``), newest first; ``None`` = use the mlflow client.

    ``unknown_experiment(names)`` builds the error raised when the experiment does not exist
    (``names``: the store's active experiments, in mlflow's order).
    """
    if _env_true("MLFLOW_ENABLE_WORKSPACES") or os.environ.get("MLFLOW_WORKSPACE"):
        return None  # workspace-scoped lookups: mlflow's rules
    try:
        if uri.startswith("sqlite:///"):
            return _read_sqlite(uri, experiment, role, unknown_experiment)
        if is_remote(uri):
            return _read_rest(uri, experiment, role, unknown_experiment, transport)
    except _Unsupported:
        return None
    return None


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _metric_value(value: Any, is_nan: Any) -> float:
    return math.nan if is_nan else float(value)


# --- sqlite -----------------------------------------------------------------------------------------------

def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI as SQLAlchemy reads it; None for memory or URI options."""
    rest = uri[len("sqlite:///"):]
    if not rest or "?" in rest or rest == ":memory:":
        return None
    return Path(rest)


def _connect_ro(db: Path) -> sqlite3.Connection:
    # read-only: never creates the file, never migrates it (mlflow would do both)
    ro = f"file:{quote(str(db.resolve()))}?mode=ro"
    conn = sqlite3.connect(ro, uri=True, timeout=5.0, isolation_level=None)
    return conn


def _check_schema(conn: sqlite3.Connection) -> None:
    try:
        revs = {r[0] for r in conn.execute("SELECT version_num FROM alembic_version")}
    except sqlite3.Error as exc:
        raise _Unsupported("no alembic_version") from exc
    if len(revs) != 1 or not revs <= KNOWN_REVISIONS:
        raise _Unsupported(f"schema revision {sorted(revs)}")
    for table, cols in _COLUMNS.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}  # table: a constant above
        if not cols <= have:
            raise _Unsupported(f"table {table} lacks {sorted(cols - have)}")


def _read_sqlite(uri: str, experiment: str, role: str | None,
                 unknown_experiment: UnknownExperiment) -> list[RunRow]:
    db = sqlite_path(uri)
    if db is None or not db.is_file():
        raise _Unsupported("no database file")  # mlflow creates it (and the Default experiment)
    try:
        conn = _connect_ro(db)
    except sqlite3.Error as exc:
        raise _Unsupported(str(exc)) from exc
    try:
        conn.execute("BEGIN")  # one snapshot for all the reads below
        _check_schema(conn)
        found = conn.execute("SELECT experiment_id FROM experiments WHERE name = ? "
                             "AND lifecycle_stage IN ('active', 'deleted')", (experiment,)).fetchall()
        if not found:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM experiments WHERE lifecycle_stage = 'active' "
                "ORDER BY creation_time DESC, experiment_id ASC LIMIT ?", (EXPERIMENT_LIST_MAX,))]
            raise unknown_experiment(names)
        if len(found) != 1:
            raise _Unsupported("experiment name not unique")  # workspaces: mlflow's rules
        exp_id = found[0][0]
        # the runs selected, as a subquery the three child-table reads join against
        sel = "FROM runs r"
        args: list[Any] = []
        if role:
            sel += " JOIN tags rt ON rt.run_uuid = r.run_uuid AND rt.key = ? AND rt.value = ?"
            args += [Tag.ROLE, role]
        sel += " WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'"
        args.append(exp_id)
        runs = conn.execute(
            "SELECT r.run_uuid, r.experiment_id, r.name, r.status, r.start_time, r.end_time, r.artifact_uri " + sel
            + " ORDER BY CASE WHEN r.start_time IS NULL THEN 1 ELSE 0 END, r.start_time DESC, r.run_uuid",
            args).fetchall()
        params: dict[str, dict[str, Any]] = {r[0]: {} for r in runs}
        tags: dict[str, dict[str, Any]] = {r[0]: {} for r in runs}
        metrics: dict[str, dict[str, float]] = {r[0]: {} for r in runs}
        ids = f"SELECT r.run_uuid {sel}"
        for rid, key, value in conn.execute(
                f"SELECT run_uuid, key, value FROM params WHERE run_uuid IN ({ids})", args):
            params[rid][key] = value
        for rid, key, value in conn.execute(
                f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({ids})", args):
            tags[rid][key] = value
        for rid, key, value, is_nan in conn.execute(
                f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({ids})", args):
            metrics[rid][key] = _metric_value(value, is_nan)
        conn.execute("COMMIT")
    except sqlite3.Error as exc:  # locked, corrupt, changed under us: mlflow decides
        raise _Unsupported(str(exc)) from exc
    finally:
        conn.close()
    out = []
    for rid, eid, name, status, start, end, art in runs:
        out.append(RunRow(
            run_id=rid, experiment_id=str(eid), run_name=name or tags[rid].get(Tag.MLFLOW_RUN_NAME) or "",
            status=status, start_time=int(start or 0), end_time=int(end) if end else None,
            params=params[rid], metrics=metrics[rid], tags=tags[rid], artifact_uri=art or None))
    return out


# --- REST (mlflow server) ---------------------------------------------------------------------------------

def _http_options() -> dict[str, Any]:
    """httpx options from MLflow's client environment variables (credentials are never printed)."""
    if os.environ.get("MLFLOW_TRACKING_AUTH") or os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        raise _Unsupported("auth plugin / client certificate: mlflow's request code")
    headers = {"User-Agent": "quantrack"}
    import httpx

    from quantrack.store.uri import request_timeout_s

    read = request_timeout_s()  # bounded: a server that accepts and never answers fails within it
    opts: dict[str, Any] = {"timeout": httpx.Timeout(read, connect=min(read, 10.0))}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user and password:
        opts["auth"] = (user, password)
    elif token:
        headers["Authorization"] = f"Bearer {token}"
    opts["headers"] = headers
    if _env_true("MLFLOW_TRACKING_INSECURE_TLS"):
        opts["verify"] = False
    elif os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"):
        opts["verify"] = os.environ["MLFLOW_TRACKING_SERVER_CERT_PATH"]
    return opts


def _read_rest(uri: str, experiment: str, role: str | None, unknown_experiment: UnknownExperiment,
               transport: Any = None) -> list[RunRow]:
    import httpx

    base = uri.rstrip("/") + "/api/2.0/mlflow"
    opts = _http_options()
    if transport is not None:
        opts["transport"] = transport

    def call(method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            r = client.request(method, base + path, **kw)
        except httpx.HTTPError:
            raise TrackingError(f"tracking server {uri} is unreachable") from None
        try:
            body = r.json()
        except ValueError:
            raise _Unsupported(f"{path}: not JSON (HTTP {r.status_code})") from None
        if not isinstance(body, dict):
            raise _Unsupported(f"{path}: unexpected answer")
        if r.status_code == 404 and body.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
            return {"_missing": True}
        if r.status_code in (401, 403):
            raise TrackingError(f"tracking server {uri} refused the read: HTTP {r.status_code} "
                                f"(set MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN)")
        if r.status_code != 200:
            raise _Unsupported(f"{path}: HTTP {r.status_code}")  # mlflow's retries and messages
        return body

    with httpx.Client(**opts) as client:
        got = call("GET", "/experiments/get-by-name", params={"experiment_name": experiment})
        if got.get("_missing"):
            listed = call("POST", "/experiments/search",
                          json={"max_results": EXPERIMENT_LIST_MAX, "view_type": "ACTIVE_ONLY"})
            raise unknown_experiment([e.get("name", "") for e in listed.get("experiments", [])])
        exp = got.get("experiment")
        if not isinstance(exp, dict) or "experiment_id" not in exp:
            raise _Unsupported("get-by-name: no experiment in the answer")
        query: dict[str, Any] = {"experiment_ids": [str(exp["experiment_id"])], "run_view_type": "ACTIVE_ONLY",
                                 "max_results": RUNS_PER_PAGE, "order_by": [ORDER_BY]}
        if role:
            query["filter"] = f"tags.`{Tag.ROLE}` = '{role}'"
        rows: list[RunRow] = []
        while True:
            page = call("POST", "/runs/search", json=query)
            rows.extend(_row_from_json(run) for run in page.get("runs", []))
            token = page.get("next_page_token")
            if not token:
                return rows
            query["page_token"] = token


def _kv(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {i.get("key", ""): i.get("value", "") for i in items}


def _row_from_json(run: dict[str, Any]) -> RunRow:
    info, data = run.get("info", {}), run.get("data", {})
    end = int(info.get("end_time") or 0)
    return RunRow(
        run_id=info.get("run_id", ""), experiment_id=str(info.get("experiment_id", "")),
        run_name=info.get("run_name") or "", status=info.get("status", "RUNNING"),
        start_time=int(info.get("start_time") or 0), end_time=end or None,
        params=_kv(data.get("params", [])), tags=_kv(data.get("tags", [])),
        metrics={m.get("key", ""): float(m.get("value", 0.0)) for m in data.get("metrics", [])},
        artifact_uri=info.get("artifact_uri") or None,
    )


__all__ = ["KNOWN_REVISIONS", "read_runs", "reader_choice", "sqlite_path"]
