"""A local Hugging Face Hub on 127.0.0.1 for the client's protocol and error paths (``HF_ENDPOINT``).

It answers what ``huggingface_hub`` asks of the real Hub when it reads a model without its weights:
``HEAD``/``GET /{org}/{name}/resolve/{revision}/{file}`` with ``X-Repo-Commit`` and ``ETag``, byte ranges for
safetensors headers, and the Hub's error headers (``X-Error-Code: RepoNotFound | GatedRepo | EntryNotFound |
RevisionNotFound``). The configs it serves are real (tests/data/hub/README.md); the safetensors files are either
real small files written with the ``safetensors`` package, or shape-only headers (:func:`shape_only_header`)
whose data region is never read: a range past the header answers zeros.

Requests are counted per path (``server.hits``) so a test can check that a cached read sends nothing.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "hf_fixtureTOKENvalue0123456789"  # accepted for gated repos; must never appear in output


@dataclass
class SparseFile:
    """A file of ``size`` bytes of which only the first ``len(head)`` exist (a safetensors header)."""

    head: bytes
    size: int


@dataclass
class Repo:
    files: dict[str, bytes | SparseFile]
    commit: str = "0" * 40
    gated: bool = False
    revisions: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit


def shape_only_header(tensors: dict[str, tuple[str, list[int]]]) -> SparseFile:
    """A safetensors file whose header lists ``tensors`` (name -> (dtype, shape)) with consistent offsets."""
    from quantrack.models.hfconfig import SAFETENSORS_DTYPE_BYTES

    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        nbytes = int(n * SAFETENSORS_DTYPE_BYTES[dtype])
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps(meta, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    head = struct.pack("<Q", len(header)) + header
    return SparseFile(head=head, size=len(head) + offset)


def sharded(tensors: dict[str, tuple[str, list[int]]], shards: int) -> dict[str, bytes | SparseFile]:
    """``model-0000k-of-0000n.safetensors`` shape-only shards plus ``model.safetensors.index.json``."""
    names = list(tensors)
    per = -(-len(names) // shards)
    files: dict[str, bytes | SparseFile] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for k in range(shards):
        part = names[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        sparse = shape_only_header({n: tensors[n] for n in part})
        files[fname] = sparse
        total += sparse.size - len(sparse.head)
        weight_map.update({n: fname for n in part})
    files["model.safetensors.index.json"] = json.dumps({"metadata": {"total_size": total},
                                                        "weight_map": weight_map}).encode()
    return files


class HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos: dict[str, Repo]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos = repos
        self.hits: Counter[str] = Counter()
        self.auth_seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _error(self, status: int, code: str, head: bool) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(0 if head else len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        self.server.hits[path] += 1
        parts = path.strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(404, "EntryNotFound", head)
        repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return self._error(401, "RepoNotFound", head)
        auth = self.headers.get("Authorization", "")
        if auth:
            self.server.auth_seen.append(auth)
        if repo.gated and auth != f"Bearer {TOKEN}":
            return self._error(403, "GatedRepo", head)
        known = {repo.commit, *repo.revisions.values()}
        commit = repo.revisions.get(revision, revision if revision in known else None)
        if revision == "main":
            commit = repo.commit
        if commit is None:
            return self._error(404, "RevisionNotFound", head)
        content = repo.files.get(filename)
        if content is None:
            return self._error(404, "EntryNotFound", head)
        data, size = (content.head, content.size) if isinstance(content, SparseFile) else (content, len(content))
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range") or self.headers.get("range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end, status = int(a), min(int(b) if b else size - 1, size - 1), 206
        chunk = data[start:end + 1]
        chunk += b"\0" * (end + 1 - start - len(chunk))
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", '"' + hashlib.sha1(filename.encode() + commit.encode()).hexdigest() + '"')
        self.send_header("Content-Length", str(size if head else len(chunk)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not head:
            self.wfile.write(chunk)


def start(repos: dict[str, Repo]) -> HubServer:
    server = HubServer(repos)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
