"""The H200 Qwen2.5-Coder-1.5B studies (not run yet): they load, resolve qwen2.5-coder-1.5b:hf-bf16 to the cached
export, and launch every arm with the flags it stands for (engine-facts.md, launch flags): FP8 weights
``--quantization fp8``, FP8 KV ``--kv-cache-dtype fp8`` (vLLM) / ``fp8_e4m3`` (SGLang), the forced-Marlin environment
variable, and on vLLM ``--kv-cache-memory-bytes`` (shared H200: its memory profiling fails when the engine beside it
starts or stops). The run itself needs the node; these are what the CPU can establish before renting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.engines import get_adapter
from quantrack.engines.lifecycle import launch_spec_for_study
from quantrack.hardware.preflight import peek_model_refs
from quantrack.models.ref import known_models
from quantrack.study import load_study

ROOT = Path(__file__).resolve().parents[2]
ARMS = ["bf16", "fp8", "fp8-kv", "kv-fp8", "fp8-marlin"]
KV = {"vllm": "fp8", "sglang": "fp8_e4m3"}
MARLIN = {"vllm": "VLLM_TEST_FORCE_FP8_MARLIN", "sglang": "SGLANG_FORCE_FP8_MARLIN"}


def _has(argv: list[str], pair: list[str]) -> bool:
    return any(argv[i:i + 2] == pair for i in range(len(argv) - 1))


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding the checkpoint and a finished hf-bf16 export (its marker), as the node has after hfmodel."""
    entry = known_models()["qwen2.5-coder-1.5b"]
    (tmp_path / entry.file).write_bytes(b"GGUF")
    hf = entry.path_for("HF-BF16", tmp_path)
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    (hf / "quantrack-export.json").write_text("{}")
    monkeypatch.setenv("QUANTRACK_CACHE", str(tmp_path))
    return hf


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_arm_launches_with_its_flags_on_the_exported_checkpoint(engine: str, cache: Path) -> None:
    raw = load_study(ROOT / "examples" / "gpu" / f"h200-qwen2.5-coder-1.5b-{engine}.toml")
    assert raw.model.path == "qwen2.5-coder-1.5b:hf-bf16" and raw.engine.kind == engine
    assert [a.name for a in raw.arms] == ARMS and raw.baseline.name == "bf16"
    ev = raw.eval
    assert (ev.task, ev.num_questions, ev.num_shots, ev.seed) == ("gsm8k", 1319, 5, 42)
    assert ev.kl_tokens == 4000 and list(ev.kl_arms) == ARMS[1:]
    assert raw.sweep.concurrency and raw.latency.iterations > 0
    study, missing = peek_model_refs(raw)
    assert missing == () and study.model.path == str(cache)
    adapter = get_adapter(engine)
    for arm in study.arms:
        spec = launch_spec_for_study(study, arm, port=12345)
        argv, env = adapter.launch_argv(spec), adapter.launch_env(spec)
        assert str(cache) in argv, argv
        fp8_weights = arm.name in ("fp8", "fp8-kv", "fp8-marlin")
        assert _has(argv, ["--quantization", "fp8"]) == fp8_weights, (arm.name, argv)
        assert _has(argv, ["--kv-cache-dtype", KV[engine]]) == (arm.name in ("fp8-kv", "kv-fp8")), (arm.name, argv)
        assert (env.get(MARLIN[engine]) == "1") == (arm.name == "fp8-marlin"), arm.name
        if engine == "vllm":
            assert _has(argv, ["--kv-cache-memory-bytes", "4294967296"]), argv


def test_unprovisioned_export_is_left_for_run_to_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTRACK_CACHE", str(tmp_path))
    _, missing = peek_model_refs(load_study(ROOT / "examples" / "gpu" / "h200-qwen2.5-coder-1.5b-vllm.toml"))
    assert missing == ("qwen2.5-coder-1.5b:hf-bf16", "qwen2.5-coder-1.5b:Q4_K_M")
    assert list(tmp_path.iterdir()) == []  # nothing downloaded or written by a look


def test_the_node_scripts_name_the_studies_and_say_whether_they_have_run() -> None:
    for name in ("lm-eval-bf16.sh", "qwen-export-check.sh"):
        text = (ROOT / "scripts" / "gpu" / name).read_text()
        assert "NOT RUN YET" in text, name
    lm = (ROOT / "scripts" / "gpu" / "lm-eval-bf16.sh").read_text()
    assert "local-completions" in lm and "--arm bf16" in lm
    # both studies ran on a lent H200 (each header points at the results)
    for engine in ("vllm", "sglang"):
        text = (ROOT / "examples" / "gpu" / f"h200-qwen2.5-coder-1.5b-{engine}.toml").read_text()
        assert "Run on a lent H200 on 2026-12-02" in text and "docs/gpu/h200-qwen2.5-coder-1.5b.md" in text, engine
        assert "NOT RUN YET" not in text, engine
    assert (ROOT / "docs" / "gpu" / "h200-qwen2.5-coder-1.5b.md").is_file()
