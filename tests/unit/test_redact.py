"""Secrets never reach params, tags, launch commands or logged server logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_mapping,
    redact_text,
)
from quantrack.store.records import RunRecord
from quantrack.store.tracking import _materialize

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA"  # shaped like a Hugging Face token (not a real one)
KEY = "sk-test-" + "0123456789abcdef0123"


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "api_key", "--api-key", "Authorization",
                                  "MY_SERVICE_SECRET", "DB_PASSWORD", "HUGGING_FACE_HUB_TOKEN", "aws_secret_key"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["kv_cache_dtype", "max_tokens", "input_tokens", "kv_tokens_reported",
                                  "model", "engine", "gpu_util", "CUDA_VISIBLE_DEVICES", "tokenizer"])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_argv_both_spellings() -> None:
    argv = ["vllm", "serve", "m", "--api-key", KEY, "--port", "8000", f"--hf-token={HF}", "--quantization", "fp8"]
    out = redact_argv(argv)
    assert out == ["vllm", "serve", "m", "--api-key", REDACTED, "--port", "8000", f"--hf-token={REDACTED}",
                   "--quantization", "fp8"]
    assert KEY not in " ".join(out) and HF not in " ".join(out)


def test_argv_known_literal_value_anywhere() -> None:
    out = redact_argv(["python", "-c", "x", "--extra", "token-is-s3cr3tvalue"], secrets=["s3cr3tvalue"])
    assert "s3cr3tvalue" not in " ".join(out)


def test_env() -> None:
    env = redact_env({"HF_TOKEN": HF, "CUDA_VISIBLE_DEVICES": "0", "OPENAI_API_KEY": KEY})
    assert env == {"HF_TOKEN": REDACTED, "CUDA_VISIBLE_DEVICES": "0", "OPENAI_API_KEY": REDACTED}


def test_mapping_keys_and_values() -> None:
    out = redact_mapping({"api_key": KEY, "launch": f"vllm serve m --api-key {KEY}", "engine": "vllm", "tp": 1})
    assert out["api_key"] == REDACTED
    assert KEY not in out["launch"] and out["launch"].endswith(REDACTED)
    assert out["engine"] == "vllm" and out["tp"] == 1


def test_text_patterns() -> None:
    text = (f"Authorization: Bearer {KEY}\n"
            f"HF_TOKEN={HF} python -m x\n"
            # vLLM prints its non-default args as a dict repr (see vllm-0.25.0-*.log "non-default args: {...}")
            f"non-default args: {{'model': '/root/llama8b-rand', 'api_key': ['{KEY}'], 'quantization': 'fp8'}}\n"
            f"token {HF} leaked\n")
    out = redact_text(text)
    assert KEY not in out and HF not in out
    assert "'model': '/root/llama8b-rand'" in out and "'quantization': 'fp8'" in out
    assert out.count(REDACTED) == 4


def test_real_log_line_unchanged(shared_data: Path) -> None:
    """Redaction must not damage what the log parsers read: a real vLLM log without secrets is unchanged."""
    text = (shared_data / "vllm-h200" / "vllm-0.25.0-fp8.log").read_text(encoding="utf-8")
    assert redact_text(text) == text


def test_real_log_with_injected_key(shared_data: Path) -> None:
    lines = (shared_data / "vllm-h200" / "vllm-0.25.0-fp8.log").read_text(encoding="utf-8").splitlines()
    # the real non-default-args line, as vLLM prints it when --api-key is also passed
    idx = next(i for i, ln in enumerate(lines) if "non-default args:" in ln)
    lines[idx] = lines[idx].replace("{'model':", f"{{'api_key': ['{KEY}'], 'model':")
    out = redact_text("\n".join(lines), secrets=[KEY])
    assert KEY not in out
    assert "'quantization': 'fp8'" in out.splitlines()[idx]


def test_record_redacts_params_tags_and_artifacts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"starting with --api-key {KEY}\nHF_TOKEN={HF}\n", encoding="utf-8")
    rec = RunRecord(experiment="e", run_name="a", secrets=[KEY, HF])
    rec.param("launch_command", f"vllm serve m --api-key {KEY}")
    rec.param("HF_TOKEN", HF)
    rec.tag("note", f"used {HF}")
    rec.artifacts["launch/env.json"] = json.dumps({"HF_TOKEN": HF})
    rec.artifact_files["server/server.log"] = str(log)
    red = rec.redacted()
    dumped = json.dumps(red.to_json())
    assert KEY not in dumped and HF not in dumped
    out = tmp_path / "out"
    _materialize(red, out)
    for p in out.rglob("*"):
        if p.is_file():
            body = p.read_text(encoding="utf-8")
            assert KEY not in body and HF not in body, p
    assert (out / "server" / "server.log").read_text().startswith("starting with --api-key " + REDACTED)
