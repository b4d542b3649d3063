"""Models by Hugging Face Hub id: ``ORG/NAME[@REVISION]`` -> ModelShape with the checkpoint's exact bytes.

Owns the Hub look-up (through ``huggingface_hub``: ``hf_hub_download`` for ``config.json``,
``get_safetensors_metadata`` for the tensor headers, never the weights) and its cache. The environment is read
at each call, so a test or a shell can point it elsewhere:

* ``HF_ENDPOINT``: the Hub to ask (default https://huggingface.co);
* ``HF_TOKEN``: sent to the Hub for gated/private repos; never logged, printed or written by quantrack;
* ``HF_HUB_OFFLINE``: no network; the config comes from the Hugging Face cache and the headers from ours;
* ``HF_HUB_CACHE`` / ``HF_HOME``: where ``config.json`` is cached (huggingface_hub's own cache layout);
* ``QUANTRACK_CACHE``: where the header summary is cached, one JSON file per repository commit;
* ``QUANTRACK_HUB_TIMEOUT``: seconds one look-up may take in all (default 30; ``plan --hub-timeout``). An
  unreachable, hung or misconfigured Hub, or a corrupt cache, is one line (exit 2) within it, whatever
  ``huggingface_hub`` version is installed (its retries and its own errors are not shown).

:func:`resolve_model` is the one entry point for a ``--model`` value or a study's ``[model] name``: a catalog
name gives the catalog shape (no network), an ``ORG/NAME`` gives the Hub checkpoint. Every failure is one
``BadInput`` line (exit 2) that names the repository and what to do.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.hardware.catalog import ModelShape

DEFAULT_ENDPOINT = "https://huggingface.co"
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<rev>[A-Za-z0-9_./-]+))?$")
_TRUE = {"1", "true", "yes", "on"}
HEADER_CACHE_VERSION = 1


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """``("ORG/NAME", "REVISION" or None)`` for a Hub id, None for anything else (a catalog name, a file)."""
    value = text.strip()
    if value.endswith((".json", ".gguf")) or value.startswith((".", "/", "~")):
        return None
    m = _HUB_ID.match(value)
    if not m:
        return None
    return m.group("repo"), m.group("rev")


def is_hub_id(text: str | None) -> bool:
    return bool(text) and parse_hub_id(str(text)) is not None


def resolve_model(name: str) -> ModelShape:
    """The ModelShape for a ``--model`` value: ``ORG/NAME[@REV]`` from the Hub, anything else from the catalog."""
    from quantrack.hardware import catalog

    if parse_hub_id(name) is None:
        return catalog.get_model(name)
    return load_hub_model(name)


def _endpoint() -> str:
    """``HF_ENDPOINT`` (default the Hub), checked: a value that is not an http(s) URL is one line, exit 2."""
    raw = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(raw)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        if ok:
            _ = parts.port  # an impossible port raises ValueError
    except ValueError:
        ok = False
    if not ok:
        raise BadInput(f"HF_ENDPOINT {raw[:100]!r} is not a URL: use https://huggingface.co (the default) or "
                       "http(s)://host[:port] of a Hub mirror")
    return raw


DEFAULT_HUB_TIMEOUT_S = 30.0


def hub_timeout_s() -> float:
    """Seconds a whole Hub look-up may take: ``$QUANTRACK_HUB_TIMEOUT`` (``plan --hub-timeout`` sets it)."""
    raw = os.environ.get("QUANTRACK_HUB_TIMEOUT")
    if not raw:
        return DEFAULT_HUB_TIMEOUT_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v < 86400):
        raise BadInput(f"QUANTRACK_HUB_TIMEOUT {raw[:40]!r}: a number of seconds > 0")
    return v


def _bounded(what: str, fn: Any) -> Any:
    """``fn()`` in a daemon thread, given ``hub_timeout_s()`` in all; huggingface_hub's retry lines are kept off
    the console (its logger raised to ERROR) and an exception it raises that the callers do not map is one line.
    A hung Hub (the TCP connection accepted, nothing answered) ends at the deadline, not after its retries."""
    import logging
    import threading

    timeout = hub_timeout_s()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        t = threading.Thread(target=work, name="quantrack-hub", daemon=True)
        t.start()
        t.join(timeout)
    finally:
        log.setLevel(level)
    if t.is_alive():
        raise BadInput(f"{what}: {_endpoint()} did not answer within {timeout:g} s (QUANTRACK_HUB_TIMEOUT / "
                       "--hub-timeout); offline, set HF_HUB_OFFLINE=1 to read the Hugging Face cache")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _unreachable() -> str | None:
    """Why the endpoint cannot be reached (one short probe, bounded by the Hub timeout), or None if it answers."""
    import httpx

    t = min(5.0, hub_timeout_s())
    try:
        httpx.head(_endpoint(), timeout=httpx.Timeout(t, connect=t))
    except httpx.TimeoutException:
        return f"no answer within {t:g} s; --hub-timeout / QUANTRACK_HUB_TIMEOUT sets the wait"
    except httpx.HTTPError as exc:
        cause = exc.__cause__ or exc.__context__
        text = str(cause or exc) or type(exc).__name__
        return " ".join(text.split())[:120]
    return None


def _unmapped(what: str, exc: BaseException) -> BadInput:
    """An error huggingface_hub raised that is not one of its documented ones (a closed client, a corrupt cache
    entry, a network error by another name): one line naming the endpoint."""
    reach = _unreachable()
    if reach:
        return BadInput(f"{what}: cannot reach {_endpoint()} ({reach}) and it is not in the Hugging Face cache; "
                        "connect, or set HF_ENDPOINT to a mirror")
    first = (str(exc).splitlines() or [""])[0][:200]
    return BadInput(f"{what}: the Hub look-up at {_endpoint()} failed ({type(exc).__name__}: {first}); offline, set "
                    "HF_HUB_OFFLINE=1 to read the Hugging Face cache")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _hf_cache() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # huggingface_hub's default (~/.cache/huggingface/hub)


def header_cache_path(repo: str, commit: str) -> Path:
    from quantrack.models.gguf import default_cache_dir

    return default_cache_dir() / "hub-headers" / repo.replace("/", "--") / f"{commit}.json"


def load_hub_model(ref: str) -> ModelShape:
    """Read ``config.json`` and the safetensors headers of a Hub checkpoint (cached) into a ModelShape."""
    from quantrack.models.hfconfig import checkpoint_weights, shape_from_config

    parsed = parse_hub_id(ref)
    if parsed is None:
        raise BadInput(f"--model {ref!r} is not a Hub id (ORG/NAME or ORG/NAME@REVISION)")
    repo, revision = parsed
    config, commit = fetch_config(repo, revision)
    tensors = fetch_tensor_headers(repo, commit)
    where = f"{repo}@{commit[:12]}" if commit else repo
    ckpt = checkpoint_weights(tensors, config, source=f"safetensors headers of {where} ({len(tensors)} tensors)")
    shape = shape_from_config(config, name=repo, origin=f"{where} config.json", checkpoint=ckpt)
    return replace(shape, name=repo, hf_id=repo, revision=commit)


def fetch_config(repo: str, revision: str | None) -> tuple[dict[str, Any], str]:
    """(config dict, commit sha) through hf_hub_download (the Hugging Face cache; offline: the cache only)."""
    path = _download(repo, "config.json", revision)
    commit = Path(path).parent.name  # hf cache layout: .../snapshots/<commit>/config.json
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8 (a corrupt cache entry)
        raise BadInput(f"model {repo}: config.json at {path} is not readable JSON ({type(exc).__name__}); delete it "
                       "to fetch it again") from None
    if not isinstance(data, dict):
        raise BadInput(f"model {repo}: config.json is not a JSON object")
    return data, commit


def _download(repo: str, filename: str, revision: str | None) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = _offline()
    at = f"@{revision}" if revision else ""
    endpoint = _endpoint()
    timeout = hub_timeout_s()
    if not offline and (reach := _unreachable()):  # one short probe first: never huggingface_hub's retry loop
        try:
            return str(_bounded(f"model {repo}{at}", lambda: hf_hub_download(
                repo, filename, revision=revision, endpoint=endpoint, cache_dir=_hf_cache(), local_files_only=True)))
        except Exception:  # noqa: BLE001 - not cached (or unreadable): the unreachable Hub is the answer
            raise BadInput(f"model {repo}{at}: cannot reach {endpoint} ({reach}) and {filename} is not in the "
                           "Hugging Face cache; connect, or set HF_ENDPOINT to a mirror") from None
    try:
        return str(_bounded(f"model {repo}{at}", lambda: hf_hub_download(
            repo, filename, revision=revision, endpoint=endpoint, token=_token(), cache_dir=_hf_cache(),
            local_files_only=offline, etag_timeout=min(10.0, timeout))))
    except BadInput:
        raise
    except GatedRepoError:
        raise BadInput(_gated(repo)) from None
    except RepositoryNotFoundError:
        raise BadInput(f"model {repo}: no such repository on {_endpoint()} (a private one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise BadInput(f"model {repo}{at}: no revision {revision!r} in that repository") from None
    except LocalEntryNotFoundError:
        if offline:
            raise BadInput(f"model {repo}{at}: HF_HUB_OFFLINE is set and {filename} is not in the Hugging Face "
                           "cache; run once online (or unset HF_HUB_OFFLINE)") from None
        reach = _unreachable() or "no answer"
        raise BadInput(f"model {repo}{at}: cannot reach {_endpoint()} ({reach}) and {filename} is not in the Hugging "
                       "Face cache; connect, or set HF_ENDPOINT to a mirror") from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 404:
            raise BadInput(f"model {repo}{at}: the repository has no {filename}") from None
        raise BadInput(f"model {repo}{at}: the Hub answered HTTP {status} for {filename}") from None
    except OSError as exc:
        raise BadInput(f"model {repo}{at}: cannot read {filename} from {_endpoint()} ({type(exc).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - whatever this huggingface_hub version raises: one line, exit 2
        raise _unmapped(f"model {repo}{at}", exc) from None


def _gated(repo: str) -> str:
    if _token():
        return f"model {repo}: gated repository and HF_TOKEN does not grant access (accept its licence on the Hub)"
    return f"model {repo}: gated repository; accept its licence on the Hub and set HF_TOKEN"


def fetch_tensor_headers(repo: str, commit: str) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) of every tensor, from our cache or get_safetensors_metadata (headers only)."""
    cache = header_cache_path(repo, commit)
    cached = _read_header_cache(cache)
    if cached is not None:
        return cached
    if _offline():
        raise BadInput(f"model {repo}@{commit[:12]}: HF_HUB_OFFLINE is set and its safetensors headers are not in "
                       f"the quantrack cache ({cache.parent}); run once online")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        NotASafetensorsRepoError,
        RepositoryNotFoundError,
        SafetensorsParsingError,
    )
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    api = HfApi(endpoint=_endpoint(), token=_token())
    try:
        meta = _bounded(f"model {repo}", lambda: api.get_safetensors_metadata(repo, revision=commit))
    except BadInput:
        raise
    except GatedRepoError:
        raise BadInput(_gated(repo)) from None
    except RepositoryNotFoundError:
        raise BadInput(f"model {repo}: no such repository on {_endpoint()} (a private one needs HF_TOKEN)") from None
    except NotASafetensorsRepoError:
        raise BadInput(f"model {repo}: no safetensors weights (model.safetensors or its index), so its parameter "
                       "bytes are unknown; give --config with the shapes instead") from None
    except SafetensorsParsingError:
        raise BadInput(f"model {repo}: a safetensors header could not be parsed") from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        raise BadInput(f"model {repo}: the Hub answered HTTP {status} for a safetensors header") from None
    except OSError as exc:
        raise BadInput(f"model {repo}: cannot read safetensors headers from {_endpoint()} "
                       f"({type(exc).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - whatever this huggingface_hub version raises: one line, exit 2
        raise _unmapped(f"model {repo}", exc) from None
    tensors: dict[str, tuple[str, list[int]]] = {}
    for file_meta in meta.files_metadata.values():
        for name, info in file_meta.tensors.items():
            tensors[name] = (str(info.dtype), [int(d) for d in info.shape])
    _write_header_cache(cache, repo, commit, tensors)
    return tensors


def _read_header_cache(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    try:  # a corrupt entry (not UTF-8, not JSON, wrong shapes) is a cache miss, never a crash
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != HEADER_CACHE_VERSION:
            return None
        return {str(k): (str(v[0]), [int(d) for d in v[1]]) for k, v in data.get("tensors", {}).items()}
    except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError):
        return None


def _write_header_cache(path: Path, repo: str, commit: str, tensors: dict[str, tuple[str, list[int]]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": HEADER_CACHE_VERSION, "repo": repo, "commit": commit,
                                   "tensors": {k: [d, s] for k, (d, s) in tensors.items()}}), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a cache we cannot write costs a re-read next time, nothing else


__all__ = ["fetch_config", "fetch_tensor_headers", "header_cache_path", "is_hub_id", "load_hub_model",
           "parse_hub_id", "resolve_model"]
