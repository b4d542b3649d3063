"""Launch commands per engine and arm: exact argv lists (never a shell string)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from quantrack.arms import make_arm, parse_arm_spec
from quantrack.engines import ENGINE_KINDS, get_adapter
from quantrack.engines.base import LaunchSpec
from quantrack.engines.xllamacpp_server import build_parser
from quantrack.errors import BadInput, NotFound


def test_registry_and_unknown_kind() -> None:
    assert ENGINE_KINDS == ("vllm", "sglang", "llamacpp")
    assert get_adapter("llama.cpp").kind == "llamacpp"
    with pytest.raises(NotFound) as err:
        get_adapter("vlm")
    assert str(err.value) == "unknown engine 'vlm' (did you mean 'vllm'?); known: vllm, sglang, llamacpp"


def test_vllm_fp8_with_fp8_kv() -> None:
    spec = LaunchSpec(model="meta-llama/Llama-3.1-8B-Instruct", arm=parse_arm_spec("fp8-kv"), port=8001, util=0.9,
                      context_len=8192, tp=2)
    assert get_adapter("vllm").launch_argv(spec) == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port", "8001",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.9",
        "--max-model-len", "8192", "--tensor-parallel-size", "2",
    ]


def test_vllm_bf16_has_no_quant_flags_and_arm_env_goes_to_env() -> None:
    arm = make_arm("fp8marlin", weights="fp8", quantization="fp8", env={"VLLM_TEST_FORCE_FP8_MARLIN": "1"})
    a = get_adapter("vllm")
    spec = LaunchSpec(model="m", arm=arm)
    assert "--quantization" in a.launch_argv(spec)
    assert a.launch_env(spec) == {"VLLM_TEST_FORCE_FP8_MARLIN": "1"}
    assert a.launch_argv(LaunchSpec(model="m", arm=parse_arm_spec("bf16"))) == \
        ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "8000"]


def test_sglang_fp8_kv_spelling() -> None:
    spec = LaunchSpec(model="m", arm=parse_arm_spec("fp8-kv"), port=30000, util=0.85, context_len=4096, tp=2)
    assert get_adapter("sglang").launch_argv(spec) == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "m", "--host", "127.0.0.1", "--port", "30000",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.85",
        "--context-length", "4096", "--tp-size", "2",
    ]


def test_llamacpp_q8_kv_needs_flash_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    import quantrack.engines.llamacpp as lc

    monkeypatch.setattr(lc, "have_llama_server", lambda binary=None: False)
    spec = LaunchSpec(model="sm.gguf", arm=make_arm("q8kv", weights="q8_0", kv="q8_0"), port=8080,
                      context_len=2048, parallel=4)
    assert get_adapter("llamacpp").launch_argv(spec) == [
        sys.executable, "-m", "quantrack.engines.xllamacpp_server", "-m", "sm.gguf", "--host", "127.0.0.1",
        "--port", "8080", "-c", "2048", "-np", "4", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",
        "-fa", "on", "--metrics",
    ]
    monkeypatch.setattr(lc, "have_llama_server", lambda binary=None: True)
    assert get_adapter("llamacpp").launch_argv(spec)[:3] == ["llama-server", "-m", "sm.gguf"]
    f16 = LaunchSpec(model="sm.gguf", arm=make_arm("f16", weights="f16"), port=8080)
    assert "-fa" not in get_adapter("llamacpp").launch_argv(f16)


def test_xllamacpp_entry_point_accepts_the_same_options() -> None:
    spec = LaunchSpec(model="sm.gguf", arm=make_arm("q8kv", weights="q8_0", kv="q8_0"), port=8080,
                      context_len=2048, parallel=4)
    argv = get_adapter("llamacpp").launch_argv(spec)
    args = build_parser().parse_args(argv[argv.index("-m"):])
    assert (args.model, args.port, args.ctx_size, args.parallel) == ("sm.gguf", 8080, 2048, 4)
    assert (args.cache_type_k, args.cache_type_v, args.flash_attn, args.metrics) == ("q8_0", "q8_0", "on", True)


@pytest.mark.parametrize(("engine", "arm", "message"), [
    ("llamacpp", make_arm("x", kv="fp8"), "KV-cache dtype 'fp8' is not available on llamacpp"),
    ("vllm", make_arm("x", weights="q4_0"), "weights q4_0 is a GGUF type; serve it with --engine llamacpp"),
    ("sglang", make_arm("x", kv="q8_0"), "KV-cache dtype 'q8_0' is not available on sglang"),
])
def test_arm_engine_mismatch_is_bad_input(engine: str, arm, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadInput, match=message):
        get_adapter(engine).launch_argv(LaunchSpec(model="m", arm=arm))


def test_serve_dry_run_prints_the_command(tmp_path: Path) -> None:
    from quantrack.cli import cli

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    res = CliRunner().invoke(cli, ["serve", "--engine", "llamacpp", "--model", str(gguf), "--arm", "q8_0",
                                   "--port", "8089", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("command: ")
    assert f"-m {gguf} --host 127.0.0.1 --port 8089 -np 1 --cache-type-k q8_0 --cache-type-v q8_0 -fa on" \
        in res.output


def test_serve_missing_gguf_is_one_line_error(tmp_path: Path) -> None:
    from quantrack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--engine", "llamacpp", "--model", str(tmp_path / "none.gguf"), "--arm", "q8_0"])
    assert exc.value.code == 2
