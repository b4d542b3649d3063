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


# --- issue #30: every spelling, searched everywhere ----------------------------------------------------------

SPELLED = {
    "hft": "hft-planted-" + "1" * 10,  # llama.cpp -hft VALUE
    "api_eq": "apikey-planted-" + "2" * 10,  # --api-key=VALUE
    "db_pass": "dbpass-planted-" + "3" * 10,  # [engine] env DB_PASS (a name that does not look secret to a regex)
    "pat": "pat-planted-" + "4" * 10,  # [engine] env GITHUB_PAT
    "hf_token": "hftoken-planted-" + "5" * 10,  # [[arms]] args --hf-token VALUE
    "cred": "cred-planted-" + "6" * 10,  # [[arms]] env MY_CRED
    "vllm_key": "vllmkey-planted-" + "7" * 10,  # vLLM --api-key VALUE
    "vllm_hf_eq": "vllmhf-planted-" + "8" * 10,  # vLLM --hf-token=VALUE
    "uri_at": "p@ss-planted-" + "9" * 10,  # a URI password holding '@'
}
SPELLING_STUDY = """
name = "spelled"
[model]
name = "SmolLM2-135M"
gguf = "{gguf}"
[engine]
kind = "llamacpp"
args = ["-hft", "{hft}", "--api-key={api_eq}"]
env = {{ DB_PASS = "{db_pass}", GITHUB_PAT = "{pat}", OMP_NUM_THREADS = "2" }}
[gpu]
name = "x86-cpu"
[[arms]]
name = "q8"
weights = "q8_0"
baseline = true
args = ["--hf-token", "{hf_token}"]
env = {{ MY_CRED = "{cred}" }}
"""
VLLM_STUDY = """
name = "spelled-vllm"
[model]
name = "Llama-3-8B"
path = "meta-llama/Meta-Llama-3-8B"
[engine]
kind = "vllm"
version = "0.11.0"
args = ["--api-key", "{vllm_key}", "--hf-token={vllm_hf_eq}"]
[gpu]
name = "H100"
[[arms]]
name = "bf16"
weights = "bf16"
baseline = true
"""


def _found(text: str) -> list[str]:
    return [k for k, v in SPELLED.items() if v in text or v.split("@")[-1] in text]


def test_every_spelling_of_a_secret_is_found_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Console (preflight's launch lines and env, run's warnings), the store (params, tags, launch/command.txt,
    launch/env.json, study/study.toml), the spool, the SkyPilot export and the notebook API's exceptions: none
    holds any planted value, whichever spelling carried it; and no help page prints [REDACTED]."""
    import socket

    from quantrack import api
    from quantrack.cli import COMMANDS, main
    from quantrack.redact import forget_secrets
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.record import record_for_arm, study_record
    from quantrack.store.tracking import Tracker, read_artifact_text, spool_record
    from quantrack.study import load_study

    forget_secrets()
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(tmp_path / "spool"))
    with socket.socket() as s0:  # the Hub id below is never fetched: its Hub is a closed local port
        s0.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s0.getsockname()[1]}")
    # (not HF_HUB_OFFLINE: huggingface_hub reads it once, at import, for the rest of the process)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    f = tmp_path / "spelled.toml"
    f.write_text(SPELLING_STUDY.format(gguf=gguf, **SPELLED), encoding="utf-8")
    fv = tmp_path / "spelled-vllm.toml"
    fv.write_text(VLLM_STUDY.format(**SPELLED), encoding="utf-8")

    def cli(*argv: str) -> str:
        try:
            main(list(argv))
        except SystemExit:
            pass
        cap = capsys.readouterr()
        return cap.out + cap.err

    console = cli("preflight", "--study", str(f)) + cli("preflight", "--study", str(fv))
    assert "launch:" in console and "DB_PASS=[REDACTED]" in console and "OMP_NUM_THREADS=2" in console
    sky = tmp_path / "sky"
    console += cli("export", "skypilot", str(fv), "--out", str(sky))
    exported = "".join(p.read_text(errors="replace") for p in sky.rglob("*") if p.is_file())
    assert exported, "the export wrote nothing"

    # the store and the spool: the records `run` logs for this study, with the launch command and env it used
    study = load_study(f)
    arm = study.arms[0]
    out = ArmOutcome(arm=arm, status="FINISHED")
    out.launch_argv = ["llama-server", "-m", str(gguf), *study.engine.args, *arm.engine_args]
    out.launch_env = {**dict(study.engine.env), **arm.env_dict}
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    tracker = Tracker(uri, "spelled")
    parent = tracker.log(study_record(study, "spelled", {}))
    rec = record_for_arm(study, out, experiment="spelled", parent_uuid=parent.uuid)
    logged = tracker.log(rec)
    stored = json.dumps([rec.redacted().params, rec.redacted().tags])
    for path in ("launch/command.txt", "launch/env.json"):
        text = read_artifact_text(logged.run_id or "", path, uri) or ""
        assert text, path
        stored += text
    study_toml = read_artifact_text(parent.run_id or "", "study/study.toml", uri) or ""
    assert "-hft" in study_toml and "DB_PASS" in study_toml  # the file is there, its values are not
    stored += study_toml
    env_json = json.loads(read_artifact_text(logged.run_id or "", "launch/env.json", uri) or "{}")
    assert env_json["DB_PASS"] == env_json["GITHUB_PAT"] == env_json["MY_CRED"] == "[REDACTED]"
    assert env_json["OMP_NUM_THREADS"] == "2"  # a known setting stays readable
    store_files = "".join(p.read_text(errors="replace") for p in (tmp_path / "store").rglob("*")
                          if p.is_file() and p.suffix != ".db")
    spool_record(rec, uri, "test")
    spool_record(study_record(study, "spelled", {}), uri, "test")
    spooled = "".join(p.read_text(errors="replace") for p in (tmp_path / "spool").rglob("*") if p.is_file())
    assert "record.json" in str(list((tmp_path / "spool").rglob("*")))

    # a URI password holding '@', through the notebook API: the exception carries none of it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Exception) as exc:
        api.compare("spelled", tracking_uri=f"http://user:{SPELLED['uri_at']}@127.0.0.1:{port}")
    api_text = str(exc.value) + repr(exc.value.args)
    with pytest.raises(Exception) as exc2:
        api.plan(f"org/model@{SPELLED['db_pass']}", gpu="H100")
    api_text += str(exc2.value)

    for where, text in (("console", console), ("store", stored + store_files), ("spool", spooled),
                        ("export", exported), ("API exceptions", api_text)):
        assert not _found(text), (where, _found(text))

    helps = "".join(cli(name, "--help") for name in COMMANDS) + cli("--help")
    assert "Usage:" in helps and "[REDACTED]" not in helps
