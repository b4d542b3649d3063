"""`--model ORG/NAME[@REV]` through huggingface_hub against a local Hub on 127.0.0.1 (tests/hub_fixture.py).

Configs are the published ones (tests/data/hub/README.md); safetensors headers are real small files written with
the ``safetensors`` package, or shape-only headers with each checkpoint's published tensor layout
(tests/hub_models.py). Every figure below is checked against a number the model authors or the engines publish:

* Qwen3-30B-A3B: "Number of Parameters: 30.5B in total and 3.3B activated", 48 layers, 32 Q / 4 KV heads
  (https://huggingface.co/Qwen/Qwen3-30B-A3B model card).
* DeepSeek-V3: "Total parameters: 671B" for the main model; the MTP module (layer 61) is separate
  (tenstorrent/tt-metal@c5cab334 models/demos/deepseek_v3/reference/README_WEIGHTS.md, copied from the
  DeepSeek-V3 repository); MLA caches (d_c + d_h^R) x l = (512 + 64) x 61 elements per token
  (DeepSeek-V2 paper, arXiv:2405.04434 §2.1.4 and Table 1).
* gpt-oss-120b: 116.83B total parameters, checkpoint 60.8 GiB, 36 layers alternating banded-window (128) and
  dense attention, 64 query heads of 64 dims, 8 KV heads; "fits on a single 80 GB GPU" (OpenAI gpt-oss model
  card, arXiv:2508.10925, Table 1 and §2).
* Llama-3.x-8B FP8: the neuralmagic/Meta-Llama-3-8B-Instruct-FP8 index publishes ``"total_size": 9081202432``
  (llm-d/llm-d-kv-cache-manager@eea3a359 tests/e2e/redis_mock/testdata/local-llama3/model.safetensors.index.json);
  RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8 has the same tensors (only rope/context differ in config).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hub_fixture as hf
import hub_models as hm
import pytest

from quantrack.arms import parse_arm_spec
from quantrack.cli import main

GiB = 1024**3
COMMIT = "4f1a2c3d5e6f708192a3b4c5d6e7f80912a3b4c5"
OTHER_COMMIT = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291807"
TINY_CONFIG = {  # synthetic, for the protocol paths only (a real Llama layout at toy size)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
    "max_position_embeddings": 512, "torch_dtype": "float16", "tie_word_embeddings": False,
}


def _tiny_safetensors(cfg: dict[str, Any]) -> bytes:
    """A real safetensors file (safetensors.numpy) with the tiny model's tensors, float16."""
    import numpy as np
    from safetensors.numpy import save

    h, i, v, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_key_value_heads"] * 16
    t: dict[str, Any] = {"model.embed_tokens.weight": np.zeros((v, h), np.float16),
                         "lm_head.weight": np.zeros((v, h), np.float16), "model.norm.weight": np.ones(h, np.float16)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t.update({p + "self_attn.q_proj.weight": np.zeros((h, h), np.float16),
                  p + "self_attn.k_proj.weight": np.zeros((kv, h), np.float16),
                  p + "self_attn.v_proj.weight": np.zeros((kv, h), np.float16),
                  p + "self_attn.o_proj.weight": np.zeros((h, h), np.float16),
                  p + "mlp.gate_proj.weight": np.zeros((i, h), np.float16),
                  p + "mlp.up_proj.weight": np.zeros((i, h), np.float16),
                  p + "mlp.down_proj.weight": np.zeros((h, i), np.float16),
                  p + "input_layernorm.weight": np.ones(h, np.float16),
                  p + "post_attention_layernorm.weight": np.ones(h, np.float16)})
    return bytes(save(t))


def _repo(cfg: dict[str, Any], files: dict[str, bytes | hf.SparseFile], **kw: Any) -> hf.Repo:
    return hf.Repo(files={"config.json": json.dumps(cfg).encode(), **files}, commit=COMMIT, **kw)


@pytest.fixture(scope="module")
def hub() -> Iterator[hf.HubServer]:
    tiny = _tiny_safetensors(TINY_CONFIG)
    hybrid = {**TINY_CONFIG, "layers_block_type": ["attention", "mamba"], "mamba_d_state": 16}
    repos = {
        "quantrack-test/tiny-llama": _repo(TINY_CONFIG, {"model.safetensors": tiny},
                                           revisions={"v1": OTHER_COMMIT}),
        "quantrack-test/gated-llama": _repo(TINY_CONFIG, {"model.safetensors": tiny}, gated=True),
        "quantrack-test/mamba-hybrid": _repo(hybrid, {"model.safetensors": tiny}),
        "quantrack-test/no-weights": _repo(TINY_CONFIG, {}),
    }
    for repo_id, name, build, shards in (
        ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b", hm.qwen3_moe, 4),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3", hm.deepseek_v3, 16),
        ("openai/gpt-oss-120b", "gpt-oss-120b", hm.gpt_oss, 3),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", "meta-llama-3.1-8b-instruct-fp8", hm.llama_fp8, 2),
        ("neuralmagic/Meta-Llama-3-8B-Instruct-FP8", "meta-llama-3-8b-instruct-fp8", hm.llama_fp8, 2),
    ):
        cfg = hm.config(name)
        repos[repo_id] = _repo(cfg, hf.sharded(build(cfg), shards))
    server = hf.start(repos)
    yield server
    server.shutdown()


@pytest.fixture
def hub_env(hub: hf.HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> hf.HubServer:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("QUANTRACK_CACHE", str(tmp_path / "qt"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no stored token from this machine
    return hub


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code, out, err = run(["plan", *args, "--format", "json"], capsys)
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


# --- the four "Done when" commands ---------------------------------------------------------------------------


def test_qwen3_30b_a3b_on_h100(hub_env: hf.HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.models.hub import resolve_model

    shape = resolve_model("Qwen/Qwen3-30B-A3B")
    assert round(shape.params / 1e9, 1) == 30.5  # model card: 30.5B in total
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.num_experts, shape.experts_per_token) == \
        (48, 4, 128, 128, 8)
    assert shape.revision == COMMIT and shape.checkpoint and shape.checkpoint.weight_format is None
    rows = plan_json(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H100", "--arm", "bf16", "--arm", "fp8",
                     "--engine", "vllm")
    bf16, fp8 = rows
    assert bf16["kv_bytes_per_token"] == 2 * 48 * 4 * 128 * 2 == 98_304
    assert bf16["weights_gib"] == round(30_532_122_624 * 2 / GiB, 4)  # every tensor BF16: 2 bytes per parameter
    budget = 81559 * 1024**2 * 0.92 - 30_532_122_624 * 2
    assert bf16["token_capacity"] == math.floor(budget / 98_304)
    # online FP8: only the Linear weights (experts, attention) convert; embeddings, norms, routers stay BF16
    assert 28.9 < fp8["engine_weights_gib"] < 29.1 and fp8["engine_tokens"] > bf16["engine_tokens"] > 0
    code, out, _ = run(["plan", "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H100"], capsys)
    assert code == 0 and "MoE: all 128 experts resident, 8 active per token" in out
    assert [ln.split()[0] for ln in out.splitlines()[3:7]] == ["bf16", "fp8", "fp8-kv", "int8"]  # no 4-bit default
    code, _, err = run(["plan", "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H100", "--arm", "w4a16"], capsys)
    assert code == 2 and "engines load only from a pre-quantized checkpoint" in err
    assert f"safetensors headers of Qwen/Qwen3-30B-A3B@{COMMIT[:12]}" in out


def test_deepseek_v3_on_h200_tp8(hub_env: hf.HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.models.hub import resolve_model

    shape = resolve_model("deepseek-ai/DeepSeek-V3")
    assert shape.checkpoint is not None
    assert round(shape.params / 1e9) == 671  # main model: "Total parameters: 671B" (MTP layer 61 skipped)
    assert "num_nextn_predict_layers=1" in shape.checkpoint.skipped
    assert shape.attention == "mla" and shape.head_dim == 512 + 64 and shape.kv_heads == 1
    assert shape.checkpoint.weight_format == "fp8"  # quantization_config.quant_method fp8
    rows = plan_json(capsys, "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--engine", "vllm")
    assert [r["arm"] for r in rows] == ["fp8", "fp8-kv-fp8"]  # a pre-quantized checkpoint serves its own format
    fp8, fp8kv = rows
    # per token: one 576-element latent per layer on every one of the 8 ranks (MLA is not split by TP)
    assert fp8["kv_bytes_per_token"] == 576 * 61 * 2 * 8 and fp8kv["kv_bytes_per_token"] == 576 * 61 * 1 * 8
    per_rank = shape.checkpoint.total_bytes / 8
    assert fp8["weights_gib"] == round(shape.checkpoint.total_bytes / GiB, 4)
    assert 78.0 < per_rank / GiB < 78.7  # FP8 body + F32 block scales + BF16 embeddings, per H200
    assert fp8["engine_tokens"] > 0 and fp8kv["engine_tokens"] > 1.9 * fp8["engine_tokens"]
    # SGLang: MLA cell = 576 x 61 x kv bytes per rank; its default memory fraction reserves 1.5 GiB for MLA graphs
    from quantrack.hardware.capacity import predict_engine, sglang_default_mem_fraction
    from quantrack.hardware.catalog import get_gpu

    h200 = get_gpu("H200").total_bytes
    sg = predict_engine(shape, h200, parse_arm_spec("fp8"), "sglang", tp=8, context_len=4096)
    assert sg.kv_bytes_per_token == 576 * 61 * 2
    assert sg.settings["mem_fraction_static"] == sglang_default_mem_fraction(h200, 8, mla=True) \
        < sglang_default_mem_fraction(h200, 8)
    code, _, err = run(["plan", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--arm", "bf16"],
                       capsys)
    assert code == 2 and err == ("quantrack: error: arm 'bf16' wants bf16 weights, but deepseek-ai/DeepSeek-V3 is a "
                                 "pre-quantized fp8 checkpoint (quantization_config.quant_method=fp8); use "
                                 "weights=fp8 or the unquantized repository\n")


def test_gpt_oss_120b_on_h100(hub_env: hf.HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.models.hub import resolve_model

    shape = resolve_model("openai/gpt-oss-120b")
    assert shape.checkpoint is not None
    assert round(shape.params / 1e9, 2) == 116.83  # model card: 116.83B total parameters
    assert round(shape.checkpoint.total_bytes / GiB, 1) == 60.8  # model card: checkpoint size 60.8 GiB
    assert (shape.sliding_layers, shape.sliding_window, shape.kv_heads, shape.head_dim) == (18, 128, 8, 64)
    rows = plan_json(capsys, "--model", "openai/gpt-oss-120b", "--gpu", "H100", "--engine", "vllm",
                     "--context-len", "131072")
    mx = rows[0]
    assert mx["arm"] == "mxfp4" and mx["fits"]  # "fits on a single 80 GB GPU"
    assert mx["kv_bytes_per_token"] == 36 * 8 * 64 * 2 * 2 == 73_728
    assert mx["engine_tokens"] > mx["token_capacity"]  # window layers need only ~window+batch tokens per request
    # SGLang re-splits the pool: full layers get raw x 36 / (0.8 x 18 + 18) tokens, the window layers 0.8 of that
    (sg,) = plan_json(capsys, "--model", "openai/gpt-oss-120b", "--gpu", "H100", "--engine", "sglang",
                      "--arm", "weights=mxfp4,kv=auto")
    from quantrack.hardware.capacity import predict_engine
    from quantrack.hardware.catalog import get_gpu

    pred = predict_engine(shape, get_gpu("H100").total_bytes, _mxfp4(), "sglang", context_len=4096)
    raw = pred.settings["pool_tokens_all_layers"]
    assert sg["engine_tokens"] == pred.engine_tokens == int(raw * 36 / (0.8 * 18 + 18))
    assert pred.settings["swa_layer_tokens"] == int(pred.engine_tokens * 0.8)


def _mxfp4() -> Any:
    from quantrack.arms import make_arm

    return make_arm("mxfp4", weights="mxfp4")


def test_llama31_8b_fp8_on_l4(hub_env: hf.HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.models.hub import resolve_model

    published = resolve_model("neuralmagic/Meta-Llama-3-8B-Instruct-FP8")
    assert published.checkpoint and published.checkpoint.total_bytes == 9_081_202_432  # the index's total_size
    rows = plan_json(capsys, "--model", "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", "--gpu", "L4", "--engine",
                     "vllm", "--context-len", "8192")
    fp8, fp8kv = rows
    assert fp8["weights_gib"] == round(9_081_202_432 / GiB, 4)  # not 8.03e9 x 1 B = 7.48 GiB
    assert fp8["kv_bytes_per_token"] == 131_072 and fp8kv["kv_bytes_per_token"] == 65_536
    assert fp8["token_capacity"] == math.floor((23034 * 1024**2 * 0.92 - 9_081_202_432) / 131_072)
    assert 0 < fp8["engine_tokens"] < fp8["token_capacity"]


# --- cache, offline, revisions, token ------------------------------------------------------------------------


def test_cached_then_offline_reads_nothing(hub_env: hf.HubServer, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.models.hub import resolve_model

    first = resolve_model("quantrack-test/tiny-llama")
    assert first.checkpoint and first.checkpoint.tensors == 21 and first.params_estimated is False
    assert first.checkpoint.total_bytes == 2 * (2 * 100 * 64 + 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64
                                                                         + 2 * 64))
    before = sum(hub_env.hits.values())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = resolve_model("quantrack-test/tiny-llama")
    assert sum(hub_env.hits.values()) == before  # config from the HF cache, headers from ours
    assert again.checkpoint == first.checkpoint


def test_offline_with_empty_cache_is_one_line(hub_env: hf.HubServer, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = sum(hub_env.hits.values())
    code, out, err = run(["plan", "--model", "Qwen/Qwen3-30B-A3B", "--gpu", "H100"], capsys)
    assert code == 2 and out == ""
    assert err == ("quantrack: error: model Qwen/Qwen3-30B-A3B: HF_HUB_OFFLINE is set and config.json is not in "
                   "the Hugging Face cache; run once online (or unset HF_HUB_OFFLINE)\n")
    assert sum(hub_env.hits.values()) == before  # offline means no request at all


@pytest.mark.parametrize(("model", "message"), [
    ("nobody/no-such-model", "model nobody/no-such-model: no such repository on {url} (a private one needs HF_TOKEN)"),
    ("quantrack-test/gated-llama", ("model quantrack-test/gated-llama: gated repository; accept its licence on the "
                                   "Hub and set HF_TOKEN")),
    ("quantrack-test/mamba-hybrid", ("quantrack-test/mamba-hybrid@{short} config.json: not modelled: hybrid "
                                    "attention/Mamba layers (layers_block_type / SSM keys)")),
    ("quantrack-test/no-weights", ("model quantrack-test/no-weights: no safetensors weights (model.safetensors or its "
                                  "index), so its parameter bytes are unknown; give --config with the shapes instead")),
    ("quantrack-test/tiny-llama@nope", "model quantrack-test/tiny-llama@nope: no revision 'nope' in that repository"),
])
def test_hub_errors_are_one_line_exit_2(hub_env: hf.HubServer, capsys: pytest.CaptureFixture[str], model: str,
                                        message: str) -> None:
    code, out, err = run(["plan", "--model", model, "--gpu", "H100"], capsys)
    assert code == 2 and out == ""
    assert err == "quantrack: error: " + message.format(url=hub_env.url, short=COMMIT[:12]) + "\n"


def test_gated_with_token_works_and_never_shows_it(hub_env: hf.HubServer, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", hf.TOKEN)
    code, out, err = run(["plan", "--model", "quantrack-test/gated-llama", "--gpu", "L4", "--format", "json"],
                         capsys)
    assert code == 0 and json.loads(out)[0]["fits"]
    assert hf.TOKEN not in out + err and f"Bearer {hf.TOKEN}" in hub_env.auth_seen
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "fresh-hf"))  # fresh caches: the Hub is asked again
    monkeypatch.setenv("QUANTRACK_CACHE", str(tmp_path / "fresh-qt"))
    code, out, err = run(["plan", "--model", "quantrack-test/gated-llama", "--gpu", "L4"], capsys)
    assert code == 2 and "HF_TOKEN does not grant access" in err and "hf_wrong" not in err


def test_revision_pins_the_commit(hub_env: hf.HubServer) -> None:
    from quantrack.models.hub import parse_hub_id, resolve_model

    assert parse_hub_id("Qwen/Qwen3-30B-A3B@v1") == ("Qwen/Qwen3-30B-A3B", "v1")
    assert parse_hub_id("Llama-3-8B") is None and parse_hub_id("./model/config.json") is None
    assert resolve_model("quantrack-test/tiny-llama@v1").revision == OTHER_COMMIT
    assert resolve_model("Llama-3-8B").checkpoint is None  # catalog names never touch the network


def test_preflight_rejects_an_arm_the_checkpoint_cannot_serve(hub_env: hf.HubServer,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["preflight", "--gpu", "L4", "--engine", "vllm", "--model",
                        "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", "--arm", "fp8", "--arm", "bf16", "--format",
                        "json"], capsys)
    report = json.loads(out)
    assert report["exit_code"] == 3 and report["verdict"] == "reject"
    results = {r["arm"]: r for r in report["results"]}
    rules = {v["rule"] for v in results["bf16"]["reasons"]}
    assert "model-checkpoint-format" in rules and results["bf16"]["verdict"] == "reject"
    assert "model-checkpoint-format" not in {v["rule"] for v in results["fp8"]["reasons"]}


def test_study_file_takes_a_hub_id(hub_env: hf.HubServer, tmp_path: Path) -> None:
    from quantrack.hardware.preflight import request_from_study, run_preflight

    study = tmp_path / "study.toml"
    study.write_text('name = "fp8-l4"\ncontext_len = 8192\n\n[model]\nname = "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8"\n'
                     '\n[engine]\nkind = "vllm"\n\n[gpu]\nname = "L4"\n\n'
                     '[[arms]]\nname = "fp8"\nweights = "fp8"\n\n[[arms]]\nname = "bf16"\nweights = "bf16"\n',
                     encoding="utf-8")
    report = run_preflight(request_from_study(str(study)))
    by_arm = {r.arm: r for r in report.results}
    assert by_arm["fp8"].capacity and by_arm["fp8"].capacity["engine_weights_gib"] == round(9_081_202_432 / GiB, 4)
    assert "model-checkpoint-format" in {v.rule_id for v in by_arm["bf16"].reasons}


def test_awq_checkpoint_bytes_match_the_engine_log(hub: hf.HubServer, hub_env: hf.HubServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Packed int4 + zero points + group scales from the headers vs vLLM's 'Loading model weights took 5.2032 GB'
    for Qwen2.5-7B-Instruct-AWQ (https://github.com/vllm-project/vllm/issues/13882; V0's "GB" is GiB)."""
    from quantrack.engines import parse_log_file
    from quantrack.models.hub import resolve_model

    cfg = hm.config("qwen2.5-7b-instruct-awq")
    hub.repos["Qwen/Qwen2.5-7B-Instruct-AWQ"] = _repo(cfg, hf.sharded(hm.qwen2_awq(cfg), 2))
    shape = resolve_model("Qwen/Qwen2.5-7B-Instruct-AWQ")
    assert shape.checkpoint and shape.checkpoint.weight_format == "w4a16"
    assert shape.params == 7_615_616_512  # qweight x 8 unpacked; scales and zeros are not parameters
    logged = parse_log_file(hf_logs() / "vllm-13882-rtx4060-qwen25-7b-awq.log", "vllm").weights_gib
    assert logged == 5.2032
    assert abs(shape.checkpoint.total_bytes / GiB - logged) / logged < 0.005  # 5.188 GiB: -0.3%
    (row,) = plan_json(capsys, "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--vram", "8GiB", "--util", "0.7",
                       "--arm", "w4a16")
    assert row["weights_gib"] == round(shape.checkpoint.total_bytes / GiB, 4)


def hf_logs() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "public-logs"
