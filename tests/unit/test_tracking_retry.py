"""upload's log_batch survives MLflow's own retry of a request the server had already committed (seen in the
32-node PostgreSQL load test at load ~11: 'duplicate key value violates unique constraint "tag_pk"'), and only
then: a duplicate whose values are not in the run is still an error. The client here is a stand-in for the
error path alone; the real path is tests/integration/test_fleet_load_postgres.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from mlflow.entities import Metric, Param, RunTag

from quantrack.store.tracking import _log_batch

DUP = "RestException: BAD_REQUEST: (psycopg2.errors.UniqueViolation) duplicate key value violates unique " \
      'constraint "tag_pk"'


class _Client:
    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored

    def log_batch(self, run_id: str, params: list[Any], metrics: list[Any], tags: list[Any]) -> None:
        raise RuntimeError(DUP)  # the retry of a committed request

    def get_run(self, run_id: str) -> Any:
        return SimpleNamespace(data=SimpleNamespace(**self.stored))


def test_duplicate_after_a_committed_request_counts_as_logged() -> None:
    c = _Client({"params": {"a": "1"}, "tags": {"t": "x"}, "metrics": {"m": 2.0}})
    _log_batch(c, "r", params=[Param("a", "1")], tags=[RunTag("t", "x")], metrics=[Metric("m", 2.0, 0, 0)])


def test_duplicate_with_other_values_or_missing_keys_is_raised() -> None:
    with pytest.raises(RuntimeError, match="duplicate key"):
        _log_batch(_Client({"params": {"a": "2"}, "tags": {}, "metrics": {}}), "r", params=[Param("a", "1")])
    with pytest.raises(RuntimeError, match="duplicate key"):
        _log_batch(_Client({"params": {}, "tags": {}, "metrics": {}}), "r", metrics=[Metric("m", 2.0, 0, 0)])


def test_other_errors_pass_through() -> None:
    class _Broken(_Client):
        def log_batch(self, run_id: str, params: list[Any], metrics: list[Any], tags: list[Any]) -> None:
            raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError, match="connection reset"):
        _log_batch(_Broken({}), "r", tags=[RunTag("t", "x")])
