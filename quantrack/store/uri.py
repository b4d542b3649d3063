"""Which store: the tracking URI (flag, environment, default), its scheme, and the bounded HTTP timeouts a
remote store is reached with."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

from quantrack.errors import BadInput
from quantrack.redact import redact_text, register_secret, uri_secrets

DEFAULT_URI = "sqlite:///mlruns/mlflow.db"


# --- URIs and stores ---------------------------------------------------------------------------------------

# the store schemes MLflow's tracking registry accepts (mlflow.tracking._tracking_service.utils), with the
# SQLAlchemy driver suffixes (postgresql+psycopg2://)
URI_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "file", "databricks", "databricks-uc", "uc")


def resolve_uri(uri: str | None = None, *, create: bool = True, what: str = "--tracking-uri") -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else the local SQLite store under ./mlruns.

    An unknown scheme is one line, exit 2; a password in the URI is remembered as a secret (never printed).
    ``create=False`` (the read-only commands): a ``sqlite:///`` store's folder is not created. ``what``: what
    the messages call the value (``[tracking] uri`` for a study file)."""
    chosen = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    register_secret(*uri_secrets(chosen))  # passwords, TOKEN@host, ?token= (issue #43)
    shown = redact_text(chosen)
    scheme = chosen.split("://", 1)[0].split("+", 1)[0].lower() if "://" in chosen else ""
    if chosen.split(":", 1)[0] in ("databricks", "databricks-uc", "uc") and "://" not in chosen:
        return chosen  # "databricks" / "databricks:profile": mlflow's own forms
    if "://" not in chosen and not chosen.startswith("file:"):
        raise BadInput(f"{what} {shown!r} is not a URI: use sqlite:///path/mlflow.db or "
                       "http://host:port (an mlflow server)")
    if chosen.startswith("file:"):
        scheme = "file"
    if scheme not in URI_SCHEMES:
        raise BadInput(f"{what} {shown!r}: unknown scheme {scheme!r}; schemes: {', '.join(URI_SCHEMES)}")
    if scheme in ("http", "https"):
        import httpx

        try:
            host = httpx.URL(chosen).host
        except (httpx.InvalidURL, ValueError, TypeError):
            host = ""
        if not host:
            raise BadInput(f"{what} {shown!r} has no host: use http://host:port")
    if chosen.startswith("sqlite:///") and create:
        db = Path(chosen[len("sqlite:///"):])
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"{what} {shown!r}: cannot create {db.parent}: {exc.strerror}") from None
    return chosen


DEFAULT_REQUEST_TIMEOUT_S = 60.0  # per HTTP request to a tracking server (mlflow's own default: 120 s)


def request_timeout_s() -> float:
    """Seconds one HTTP request to a tracking server may take: ``$MLFLOW_HTTP_REQUEST_TIMEOUT`` (mlflow's
    variable, which ``--timeout`` sets) else :data:`DEFAULT_REQUEST_TIMEOUT_S`."""
    raw = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT")
    if raw:
        with contextlib.suppress(ValueError):
            v = float(raw)
            if math.isfinite(v) and v > 0:
                return v
    return DEFAULT_REQUEST_TIMEOUT_S


def set_request_timeout(seconds: float | None, flag: str = "--timeout") -> None:
    """Bound every tracking-server request of this process (mlflow's client and quantrack's REST reader)."""
    if seconds is None:
        return
    from quantrack.measure.client import check_timeout

    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = _env_seconds(check_timeout(seconds, flag))


def _env_seconds(seconds: float) -> str:
    """mlflow parses MLFLOW_HTTP_REQUEST_TIMEOUT as an int: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def artifact_root_for(uri: str) -> str | None:
    """Artifact location for new experiments in a local SQLite store: <db dir>/artifacts."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent.resolve() / "artifacts").as_uri()
    return None


def server_reachable(uri: str, timeout: float = 3.0) -> bool:
    """A shared tracking server answers /health (mlflow server's liveness endpoint) within ``timeout``."""
    if not is_remote(uri):
        return True
    import httpx

    t = min(timeout, request_timeout_s())
    try:
        r = httpx.get(uri.rstrip("/") + "/health", timeout=httpx.Timeout(t, connect=t))
        return r.status_code == 200
    except (httpx.HTTPError, OSError, ValueError):
        return False


@contextlib.contextmanager
def quick_http() -> Iterator[None]:
    """Fewer MLflow HTTP retries than its default (7, exponential back-off: minutes) so an outage spools fast."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                                            "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    if saved["MLFLOW_HTTP_REQUEST_TIMEOUT"] is None:
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = _env_seconds(request_timeout_s())
    if saved["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] is None:
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "3"
    if saved["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] is None:
        os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    try:
        yield
    finally:
        restore_env(saved)


def restore_env(saved: dict[str, str | None]) -> None:
    """Put environment variables back as ``saved`` holds them (None: absent)."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# MLflow 3's UI opens an experiment without this tag in its GenAI view (traces, "Detect Issues"); quantrack's
# runs are measurements with params and metrics, which its model-training view shows (the runs list). The UI
# reads the tag ``mlflow.experimentKind`` (mlflow 3.17.2 server/js main bundle: values genai_development /
# custom_model_development) only where its workflow-type switch is off; in 3.17.2 the switch is on and the view
# comes from it (URL ``?workflowType=machine_learning`` or the browser's "mlflow.workflowType"): README says what
# to click. The tag is still set, for MLflow versions that read it.
