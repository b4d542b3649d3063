"""upload's writes survive MLflow's own retry of a request (issue #31: node 10 of 32 in the PostgreSQL load test
spooled on 'duplicate key value violates unique constraint "tag_pk"').

What happens on a loaded server: the client's request times out, MLflow re-sends it, and the first request has
either committed already or is still running beside the retry; the store's unique keys then refuse one of the two.
These tests inject exactly that retry into a real MLflow client on a real SQLite store (the first request lands
before, or while, the retry is refused) and check that the run ends up holding every param, metric and tag once,
that only what is missing is sent again, and that a real conflict (a param with another value) is still an error.
The 32-node run on PostgreSQL is tests/integration/test_fleet_load_postgres.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Metric, Param, RunTag

from quantrack.store.tracking import RunRecord, TrackingError, _client, _log_batch, experiment_id, upload

DUP = "RestException: BAD_REQUEST: (psycopg2.errors.UniqueViolation) duplicate key value violates unique " \
      'constraint "tag_pk"'


class _RetriedClient:
    """A real MlflowClient whose ``log_batch`` calls go through MLflow's retry as seen by the caller.

    ``mode`` says what the first request did before the retry was refused with the store's duplicate key:
    ``committed`` (it landed first), ``in_flight`` (it lands while quantrack waits: during the first sleep),
    ``partial`` (only its params and metrics landed; its tags never did)."""

    def __init__(self, real: Any, mode: str, retried_calls: int = 1) -> None:
        self.real, self.mode, self.left = real, mode, retried_calls
        self.sent: list[dict[str, list[Any]]] = []
        self.pending: dict[str, Any] | None = None

    def log_batch(self, run_id: str, params: list[Any], metrics: list[Any], tags: list[Any]) -> None:
        self.sent.append({"params": params, "metrics": metrics, "tags": tags})
        if self.left <= 0:
            self.real.log_batch(run_id, params=params, metrics=metrics, tags=tags)
            return
        self.left -= 1
        if self.mode == "committed":
            self.real.log_batch(run_id, params=params, metrics=metrics, tags=tags)
        elif self.mode == "partial":
            self.real.log_batch(run_id, params=params, metrics=metrics, tags=[])
        else:
            self.pending = {"run_id": run_id, "params": params, "metrics": metrics, "tags": tags}
        raise RuntimeError(DUP)

    def sleep(self, _s: float) -> None:  # the first request commits while quantrack waits
        if self.pending is not None:
            self.real.log_batch(**self.pending)
            self.pending = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    client = _client(f"sqlite:///{tmp_path_factory.mktemp('retry')}/mlflow.db")  # one store: creating one is slow
    return client, client.create_experiment("retry")


@pytest.fixture
def store(_shared: tuple[Any, str]) -> tuple[Any, str]:
    """A fresh run of the module's store."""
    client, exp = _shared
    return client, client.create_run(exp).info.run_id


BATCH = {"params": [Param("a", "1"), Param("b", "2")], "metrics": [Metric("m", 2.0, 0, 0)],
         "tags": [RunTag("t", "x"), RunTag("quantrack.complete", "true")]}


def _held(client: Any, run_id: str) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    d = client.get_run(run_id).data
    return d.params, d.metrics, {k: v for k, v in d.tags.items() if not k.startswith("mlflow.")}


@pytest.mark.parametrize("mode", ["committed", "in_flight", "partial"])
def test_a_retried_batch_ends_with_the_run_holding_it_once(store: tuple[Any, str], mode: str) -> None:
    real, run_id = store
    c = _RetriedClient(real, mode)
    _log_batch(c, run_id, **BATCH, sleep=c.sleep)
    assert _held(real, run_id) == ({"a": "1", "b": "2"}, {"m": 2.0}, {"t": "x", "quantrack.complete": "true"})
    assert len(real.get_metric_history(run_id, "m")) == 1
    if mode == "committed" or mode == "in_flight":
        assert len(c.sent) == 1  # the run held the batch: nothing sent again
    else:  # only what was missing went again
        assert c.sent[1] == {"params": [], "metrics": [], "tags": BATCH["tags"]}


def test_a_param_held_with_another_value_is_an_error(store: tuple[Any, str]) -> None:
    real, run_id = store
    real.log_batch(run_id, params=[Param("a", "0")])
    c = _RetriedClient(real, "in_flight")
    c.pending = None
    with pytest.raises(TrackingError, match="other values for param"):
        _log_batch(c, run_id, params=[Param("a", "1")], sleep=lambda _s: None)


def test_a_batch_that_never_lands_is_raised_after_bounded_rounds(store: tuple[Any, str]) -> None:
    real, run_id = store

    class _Never(_RetriedClient):
        def log_batch(self, run_id: str, params: list[Any], metrics: list[Any], tags: list[Any]) -> None:
            self.sent.append({"tags": tags})
            raise RuntimeError(DUP)

    c = _Never(real, "in_flight")
    waits: list[float] = []
    with pytest.raises(RuntimeError, match="duplicate key"):
        _log_batch(c, run_id, tags=[RunTag("t", "x")], sleep=waits.append)
    assert len(c.sent) == 6 and sum(waits) < 20


def test_other_errors_pass_through(store: tuple[Any, str]) -> None:
    class _Broken:
        def log_batch(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError, match="connection reset"):
        _log_batch(_Broken(), store[1], tags=[RunTag("t", "x")], sleep=lambda _s: None)


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_upload_with_every_write_retried_logs_one_whole_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole upload (params, metrics, tags, then the completeness tag) with every log_batch retried while
    the first request is in flight: one run, complete, every value once."""
    from quantrack.store import tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    real = _client(uri)
    exp = experiment_id(real, "retry", uri)
    assert exp is not None
    c = _RetriedClient(real, "in_flight", retried_calls=100)
    monkeypatch.setattr(tracking.time, "sleep", c.sleep)
    rec = RunRecord(experiment="retry", run_name="fp8", params={"weights": "fp8", "arm": "fp8"},
                    tags={"quantrack.role": "arm", "mlflow.runName": "fp8"}, status="FINISHED")
    rec.metric("tpot_ms_p50", 7.5)
    run_id = upload(c, exp, rec, None)
    run = real.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "fp8"
    assert run.data.params == {"weights": "fp8", "arm": "fp8"} and run.data.metrics == {"tpot_ms_p50": 7.5}
    assert run.data.tags["quantrack.complete"] == "true" and run.data.tags["quantrack.role"] == "arm"
    assert len(real.search_runs([exp])) == 1
