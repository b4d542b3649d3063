"""Issue #39: the SHA-256 of every weight file an arm loaded, hashed once per file version (cached by size and
mtime), recorded on the run; `compare` does not pair arms of different source models unless told to."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

import quantrack.models.gguf as gguf_mod
from quantrack.models.weights import weights_provenance
from quantrack.report.compare import build_table
from quantrack.run.schema import Tag
from quantrack.store.records import RunRow

ROOT = Path(__file__).resolve().parents[2]


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = gguf_mod.sha256_file

    def counting(p: str | Path) -> str:
        calls.append(str(p))
        return real(p)

    monkeypatch.setattr(gguf_mod, "sha256_file", counting)
    return calls


def test_a_file_is_hashed_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + os.urandom(4096))
    cache = tmp_path / "cache.json"
    calls = _count_hashes(monkeypatch)
    w = weights_provenance(str(f), cache=cache)
    assert w.model_sha256 == hashlib.sha256(f.read_bytes()).hexdigest() == w.files[0]["sha256"]
    assert w.source_sha256 is None and w.source.startswith("unknown")  # a file does not say what it came from
    assert weights_provenance(str(f), cache=cache).model_sha256 == w.model_sha256
    assert len(calls) == 1  # the second arm reads the cache
    f.write_bytes(b"GGUF" + os.urandom(4096))  # a new version of the file: hashed again, never the stale digest
    w2 = weights_provenance(str(f), cache=cache)
    assert len(calls) == 2 and w2.model_sha256 == hashlib.sha256(f.read_bytes()).hexdigest() != w.model_sha256


def test_a_folder_is_its_manifest(tmp_path: Path) -> None:
    d = tmp_path / "export"
    (d / ".cache").mkdir(parents=True)
    (d / "model-00001-of-00002.safetensors").write_bytes(b"a" * 100)
    (d / "model-00002-of-00002.safetensors").write_bytes(b"b" * 100)
    (d / "config.json").write_text("{}")
    (d / ".cache" / "x.safetensors").write_bytes(b"hidden")
    w = weights_provenance(str(d), cache=tmp_path / "c.json")
    assert [r["path"] for r in w.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    manifest = "".join(f"{r['path']} {hashlib.sha256(p.read_bytes()).hexdigest()}\n"
                       for r, p in zip(w.files, sorted(d.glob("model-*")), strict=True))
    assert w.model_sha256 == hashlib.sha256(manifest.encode()).hexdigest()


def test_unknown_with_why_and_the_pinned_source_of_a_reference(tmp_path: Path) -> None:
    w = weights_provenance("Qwen/Qwen2.5-Coder-1.5B-Instruct", None)
    assert w.model_sha256 is None and "not a local file" in w.reason
    from quantrack.models.table import known_models

    w = weights_provenance(str(tmp_path / "nowhere.gguf"), "smollm2:Q8_0")
    assert w.model_sha256 is None and w.source_sha256 == known_models()["smollm2"].sha256
    assert "smollm2" in w.source


@pytest.fixture(scope="module")
def h200_runs(tmp_path_factory: pytest.TempPathFactory) -> list[RunRow]:
    from quantrack.store.tracking import load_runs

    d = tmp_path_factory.mktemp("h200")
    with tarfile.open(ROOT / "docs/gpu/h200-qwen2.5-coder-1.5b-store.tar.gz") as tf:
        tf.extractall(d, filter="data")
    return load_runs("h200-qwen2.5-coder-1.5b-vllm", f"sqlite:///{d}/qt-mlruns/mlflow.db")


def _with_source(runs: list[RunRow], sha: dict[str, str]) -> list[RunRow]:
    return [RunRow(**{**r.__dict__, "tags": {**r.tags, Tag.MODEL_SOURCE_SHA256: sha[r.arm]}}) if r.arm in sha else r
            for r in runs]


def test_compare_does_not_pair_different_source_models(h200_runs: list[RunRow]) -> None:
    exp = "h200-qwen2.5-coder-1.5b-vllm"
    same = {r["arm"]: r for r in build_table(exp, _with_source(h200_runs, {"bf16": "a" * 64, "fp8": "a" * 64})).rows}
    assert same["fp8"]["delta"] == "-0.5 pts" and same["fp8"]["paired_test"].startswith("McNemar p=0.618")
    runs = _with_source(h200_runs, {"bf16": "a" * 64, "fp8": "b" * 64})
    rows = {r["arm"]: r for r in build_table(exp, runs).rows}
    assert rows["fp8"]["delta"].startswith("n/a: different source models (aaaaaaaaaaaa vs bbbbbbbbbbbb)")
    assert rows["fp8"]["paired_test"] == rows["fp8"]["delta"] and "--allow-model-mismatch" in rows["fp8"]["delta"]
    assert rows["fp8-kv"]["delta"] == "-26.7 pts"  # no recorded source (older runs): paired as before
    told = {r["arm"]: r for r in build_table(exp, runs, allow_model_mismatch=True).rows}
    assert told["fp8"]["delta"] == "-0.5 pts"


def test_an_arm_serving_the_studys_reference_keeps_it_for_its_source_digest() -> None:
    """The H200 studies serve [model] path = "qwen2.5-coder-1.5b:hf-bf16" from arms without a model of their own:
    each such arm keeps that reference (so quantrack.model_source_sha256 is the pinned GGUF's); an arm with its own
    path keeps that path; a study whose [model] is a plain path gives no reference."""
    from quantrack.models.weights import weights_provenance
    from quantrack.run.orchestrate import arm_refs
    from quantrack.study import study_from_dict

    arms = [{"name": "bf16", "baseline": True}, {"name": "cal", "kv": "fp8", "model": "/ckpt/calibrated"}]
    study = study_from_dict({"name": "x", "model": {"path": "qwen2.5-coder-1.5b:hf-bf16"},
                             "engine": {"kind": "vllm"}, "arms": arms}, source="x.toml")
    refs = arm_refs(study)
    assert refs == {"bf16": "qwen2.5-coder-1.5b:hf-bf16", "cal": "/ckpt/calibrated"}
    w = weights_provenance(None, refs["bf16"])
    assert w.source_sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    plain = study_from_dict({"name": "x", "model": {"path": "/models/llama"}, "engine": {"kind": "vllm"},
                             "arms": arms[:1]}, source="x.toml")
    assert arm_refs(plain) == {}
