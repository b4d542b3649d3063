"""Models by Hugging Face Hub id: ``ORG/NAME[@REVISION]`` -> ModelShape with the checkpoint's exact bytes.

Owns the Hub look-up (through ``huggingface_hub``: ``hf_hub_download`` for ``config.json``,
``get_safetensors_metadata`` for the tensor headers, never the weights) and its cache. The environment is read
at each call, so a test or a shell can point it elsewhere:

* ``HF_ENDPOINT``: the Hub to ask (default https://huggingface.co);
* ``HF_TOKEN``: sent to the Hub for gated/private repos; never logged, printed or written by quantrack;
* ``HF_HUB_OFFLINE``: no network; the config comes from the Hugging Face cache and the headers from ours;
* ``HF_HUB_CACHE`` / ``HF_HOME``: where ``config.json`` is cached (huggingface_hub's own cache layout);
* ``QUANTRACK_CACHE``: where the header summary is cached, one JSON file per repository commit.

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
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


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
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"model {repo}: config.json is not readable JSON ({exc})") from None
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
    try:
        return str(hf_hub_download(repo, filename, revision=revision, endpoint=_endpoint(), token=_token(),
                                   cache_dir=_hf_cache(), local_files_only=offline))
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
        raise BadInput(f"model {repo}{at}: cannot reach {_endpoint()} and {filename} is not cached") from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 404:
            raise BadInput(f"model {repo}{at}: the repository has no {filename}") from None
        raise BadInput(f"model {repo}{at}: the Hub answered HTTP {status} for {filename}") from None
    except OSError as exc:
        raise BadInput(f"model {repo}{at}: cannot read {filename} from {_endpoint()} ({type(exc).__name__})") from None


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
        meta = api.get_safetensors_metadata(repo, revision=commit)
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
    tensors: dict[str, tuple[str, list[int]]] = {}
    for file_meta in meta.files_metadata.values():
        for name, info in file_meta.tensors.items():
            tensors[name] = (str(info.dtype), [int(d) for d in info.shape])
    _write_header_cache(cache, repo, commit, tensors)
    return tensors


def _read_header_cache(path: Path) -> dict[str, tuple[str, list[int]]] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("version") != HEADER_CACHE_VERSION:
        return None
    return {k: (str(v[0]), [int(d) for d in v[1]]) for k, v in data.get("tensors", {}).items()}


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
