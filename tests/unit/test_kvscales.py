"""Before launch: which k/v scales vLLM 0.25.0 / SGLang 0.5.16 will use, from checkpoints made here.

Every checkpoint is a directory written by the test: a config.json (and ModelOpt's hf_quant_config.json) and real
safetensors files (8-byte header length, JSON header, then the data region). Some files carry *no* data region at
all: quantrack must read only headers, so a checkpoint whose weights are missing reads the same.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from quantrack.arms import make_arm
from quantrack.engines import plan_scales
from quantrack.engines.kvplan import (
    ScaleSource,
    check_rules,
    checkpoint_for,
    load_rules,
    read_checkpoint,
    safetensors_header,
)
from quantrack.errors import BadInput

LAYERS = 2
_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], *, with_data: bool = True) -> None:
    """A real safetensors file (header + zeroed data), or with ``with_data=False`` the header alone."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in tensors.items():
        n = _BYTES[dtype]
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        if with_data:
            fh.write(b"\0" * off)


def weights(layers: int = LAYERS) -> dict[str, tuple[str, list[int]]]:
    out: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [64, 16])}
    for i in range(layers):
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"model.layers.{i}.self_attn.{p}.weight"] = ("BF16", [16, 16])
    return out


def checkpoint(tmp: Path, *, model_type: str = "qwen2", qc: dict | None = None,
               scales: dict[str, tuple[str, list[int]]] | None = None, hf_quant: dict | None = None,
               with_data: bool = True) -> Path:
    d = tmp / "ckpt"
    d.mkdir()
    cfg: dict[str, object] = {"model_type": model_type, "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": LAYERS}
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    if hf_quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    write_safetensors(d / "model.safetensors", {**weights(), **(scales or {})}, with_data=with_data)
    return d


def per_tensor(naming: str = "self_attn.{kv}_scale") -> dict[str, tuple[str, list[int]]]:
    return {f"model.layers.{i}.{naming.format(kv=kv)}": ("F32", []) for i in range(LAYERS) for kv in "kv"}


CT_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
CT_QC = {"quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": CT_SCHEME,
         "config_groups": {}}


def plan(ckpt: Path | None, engine: str, arm_spec: dict, args: tuple[str, ...] = (), version: str | None = None):
    arm = make_arm(arm_spec.pop("name", "arm"), **arm_spec)
    return plan_scales(arm, engine, engine_version=version, checkpoint=read_checkpoint(ckpt) if ckpt else None,
                       engine_args=args)


# ------------------------------------------------------------------------------------------------ headers


def test_headers_only_a_checkpoint_without_its_weight_bytes_reads_the_same(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = read_checkpoint(checkpoint(tmp_path / "a", scales=per_tensor()))
    b = read_checkpoint(checkpoint(tmp_path / "b", scales=per_tensor(), with_data=False))
    assert (a.scale_tensors, a.scale_layout, a.scale_naming) == (b.scale_tensors, b.scale_layout, b.scale_naming)
    assert b.scale_tensors == 2 * LAYERS and b.scale_layout == "per-tensor"
    assert b.scale_naming == "self_attn.k_scale"
    assert b.examples == ("model.layers.0.self_attn.k_scale", "model.layers.0.self_attn.v_scale")


def test_no_scales(tmp_path: Path) -> None:
    ck = read_checkpoint(checkpoint(tmp_path))
    assert ck.read and ck.scale_tensors == 0 and not ck.has_scales and ck.kv_cache_scheme is None
    assert ck.model_type == "qwen2" and ck.quant_method is None


def test_bad_header_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 50) + b"{not json" + b" " * 41)
    with pytest.raises(BadInput, match=r"x\.safetensors: safetensors header is not usable JSON \(Expecting property name enclosed in double "
                       r"quotes\)$"):
        safetensors_header(p)
    p.write_bytes(b"\x01\x02")
    with pytest.raises(BadInput, match="shorter than its 8-byte header length"):
        safetensors_header(p)
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(BadInput, match=r"truncated safetensors header \(2 of 1,000 bytes\)"):
        safetensors_header(p)


def test_what_is_not_a_local_directory_is_not_read(tmp_path: Path) -> None:
    hub = checkpoint_for("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert hub is not None and not hub.read and "not a local directory" in hub.note
    assert checkpoint_for("model.Q8_0.gguf") is None
    export = checkpoint_for("qwen2.5-coder-1.5b:hf-bf16")
    assert export is not None and export.read and not export.has_scales and export.kv_cache_scheme is None


# ----------------------------------------------------------------------------------------------- vLLM 0.25


def test_vllm_arms_on_a_checkpoint_without_scales(tmp_path: Path) -> None:
    d = checkpoint(tmp_path)
    p = plan(d, "vllm", {"name": "fp8-kv", "weights": "fp8", "kv": "fp8", "quantization": "fp8"})
    assert (p.source, p.rule_id) == (ScaleSource.UNSCALED, "vllm-kv-unscaled-warned")
    assert p.log_line and p.log_line.startswith("Using KV cache scaling factor 1.0 for fp8_e4m3.")
    assert p.engine_source.startswith("vllm@dd10e03f9:vllm/model_executor/layers/quantization/kv_cache.py:L111")
    p = plan(d, "vllm", {"name": "kv-fp8", "kv": "fp8"})
    assert (p.source, p.rule_id, p.log_line) == (ScaleSource.UNSCALED, "vllm-kv-unscaled-silent", None)
    # quantrack's own H200 runs: SmolLM2 (KL only) and Qwen2.5-Coder-1.5B (GSM8K -27.4 pts; calibrated -14.8 pts)
    assert [m["run_id"] for m in p.measured] == ["089a0f04ef304dafac5df5b0b5c2a80d", "75cd274899264f7fa7c1b88c42c1575d",
                                                 "22dc979e676744128da13673258b98d5"]
    p = plan(d, "vllm", {"name": "e5m2", "kv": "fp8_e5m2"})
    assert (p.source, p.rule_id) == (ScaleSource.UNSCALED, "vllm-kv-e5m2-unscaled")
    # on TRITON_ATTN the query quantizer asserts fp8/fp8_e4m3/nvfp4: refused at start (quantrack's H200 run)
    for args in (("--attention-backend", "TRITON_ATTN"), ("--attention-backend=triton_attn",)):
        p = plan(d, "vllm", {"name": "e5m2", "kv": "fp8_e5m2"}, args=args)
        assert (p.source, p.rule_id) == (ScaleSource.REFUSED, "vllm-kv-e5m2-query-quant"), args
        assert p.log_line == 'assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}'
    p = plan(d, "vllm", {"name": "fp8-e5m2", "weights": "fp8", "kv": "fp8_e5m2", "quantization": "fp8"})
    assert (p.source, p.rule_id) == (ScaleSource.REFUSED, "vllm-kv-e5m2-quantized-checkpoint")
    p = plan(d, "vllm", {"name": "calc", "kv": "fp8"}, args=("--calculate-kv-scales",))
    assert (p.source, p.rule_id) == (ScaleSource.COMPUTED, "vllm-kv-calculate-scales")
    assert p.log_line and "--calculate-kv-scales` option is deprecated" in p.log_line
    p = plan(d, "vllm", {"name": "pth", "kv": "fp8_per_token_head"})
    assert (p.source, p.rule_id) == (ScaleSource.DYNAMIC_PER_TOKEN_HEAD, "vllm-kv-per-token-head")
    p = plan(d, "vllm", {"name": "bf16"})
    assert p.source == ScaleSource.NOT_QUANTIZED


def test_vllm_compressed_tensors_per_tensor_scales(tmp_path: Path) -> None:
    d = checkpoint(tmp_path, qc=CT_QC, scales=per_tensor())
    ck = read_checkpoint(d)
    assert ck.kv_cache_scheme == CT_SCHEME and ck.quant_method == "compressed-tensors" and ck.declares_kv_quant
    p = plan(d, "vllm", {"name": "calibrated"})  # kv auto: the checkpoint's scheme makes it fp8
    assert (p.source, p.rule_id, p.kv) == (ScaleSource.CHECKPOINT, "vllm-kv-scheme-auto-fp8", "fp8")
    p = plan(d, "vllm", {"name": "calibrated", "kv": "fp8"})
    assert (p.source, p.rule_id) == (ScaleSource.CHECKPOINT, "vllm-kv-checkpoint-scales")
    assert "4 scale tensors (per-tensor, named self_attn.k_scale)" in p.message
    # --calculate-kv-scales is ignored when the scheme picks the dtype (attention.py:L283-L289), not otherwise
    p = plan(d, "vllm", {"name": "c"}, args=("--calculate-kv-scales",))
    assert p.source == ScaleSource.CHECKPOINT


def test_vllm_compressed_tensors_attn_head_scales(tmp_path: Path) -> None:
    scheme = {**CT_SCHEME, "strategy": "attn_head"}
    scales = {f"model.layers.{i}.self_attn.{kv}_scale": ("F32", [2, 1, 1]) for i in range(LAYERS) for kv in "kv"}
    d = checkpoint(tmp_path, qc={**CT_QC, "kv_cache_scheme": scheme}, scales=scales)
    ck = read_checkpoint(d)
    assert ck.scale_layout == "per-head" and ck.kv_cache_scheme and ck.kv_cache_scheme["strategy"] == "attn_head"
    assert plan(d, "vllm", {"name": "h", "kv": "fp8"}).source == ScaleSource.CHECKPOINT


def test_vllm_scheme_without_scale_tensors_is_unscaled(tmp_path: Path) -> None:
    d = checkpoint(tmp_path, qc=CT_QC)
    p = plan(d, "vllm", {"name": "x"})
    assert (p.source, p.rule_id) == (ScaleSource.UNSCALED, "vllm-kv-scheme-no-scales")


def test_modelopt_checkpoint(tmp_path: Path) -> None:
    d = checkpoint(tmp_path, hf_quant={"producer": {"name": "modelopt"},
                                       "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
                   scales=per_tensor("self_attn.{kv}_proj.{kv}_scale"))
    ck = read_checkpoint(d)
    assert ck.modelopt_kv_algo == "FP8" and ck.scale_naming == "k_proj.k_scale" and ck.declares_kv_quant
    p = plan(d, "vllm", {"name": "mo", "weights": "fp8", "kv": "fp8", "quantization": "modelopt"})
    assert (p.source, p.rule_id) == (ScaleSource.CHECKPOINT, "vllm-kv-checkpoint-scales")
    # the same scales with no quantization method: not established, and said so
    p = plan(d, "vllm", {"name": "mo", "kv": "fp8"})
    assert (p.source, p.rule_id) == (ScaleSource.UNKNOWN, "vllm-kv-scales-without-method")


# ---------------------------------------------------------------------------------------------- SGLang 0.5.16


def test_sglang(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    plain = checkpoint(tmp_path / "a")
    p = plan(plain, "sglang", {"name": "kv", "kv": "fp8"})
    assert (p.source, p.rule_id, p.kv) == (ScaleSource.UNSCALED, "sglang-kv-unscaled-warned", "fp8_e4m3")
    assert p.log_line == "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0."
    p = plan(plain, "sglang", {"name": "kv", "kv": "fp8"}, args=("--quantization-param-path", "/x/kv.json"))
    assert (p.source, p.rule_id) == (ScaleSource.CHECKPOINT, "sglang-kv-param-path")
    # the same file on the Triton backend with no quantization method fails at start (measured, SGLang 0.5.16 on H200);
    # with a method (FP8 weights) or another backend it is not refused
    triton = ("--quantization-param-path", "/x/kv.json", "--attention-backend", "triton")
    p = plan(plain, "sglang", {"name": "kv", "kv": "fp8"}, args=triton)
    assert (p.source, p.rule_id) == (ScaleSource.REFUSED, "sglang-kv-param-path-triton-crash")
    assert "af3f1bbe5b3444d590a2f461d8d08329" in p.engine_source and "'NoneType'" in (p.log_line or "")
    p = plan(plain, "sglang", {"name": "kv", "kv": "fp8", "quantization": "fp8"}, args=triton)
    assert p.rule_id == "sglang-kv-param-path"
    p = plan(plain, "sglang", {"name": "kv", "kv": "fp8"}, args=triton[:2] + ("--attention-backend", "fa3"))
    assert p.rule_id == "sglang-kv-param-path"
    assert plan(plain, "sglang", {"name": "e5", "kv": "fp8_e5m2"}).rule_id == "sglang-kv-e5m2-unscaled"
    qwen = checkpoint(tmp_path / "b", qc=CT_QC, scales=per_tensor())
    p = plan(qwen, "sglang", {"name": "cal", "kv": "fp8"})
    assert (p.source, p.rule_id) == (ScaleSource.UNSCALED, "sglang-kv-qwen2-checkpoint-scales-dropped")
    assert p.engine_source.startswith("sglang@v0.5.16:python/sglang/srt/models/qwen2.py:L571-L639")
    llama = checkpoint(tmp_path / "c", model_type="llama", qc=CT_QC, scales=per_tensor())
    assert plan(llama, "sglang", {"name": "cal", "kv": "fp8"}).source == ScaleSource.UNKNOWN


def test_unread_checkpoint_is_unknown_not_guessed() -> None:
    arm = make_arm("fp8-kv", weights="fp8", kv="fp8", quantization="fp8")
    p = plan_scales(arm, "vllm", checkpoint=checkpoint_for("org/some-hub-model"))
    assert p is not None and p.source == ScaleSource.UNKNOWN and "not read" in p.message
    p = plan_scales(arm, "vllm", engine_version="0.33.0", checkpoint=checkpoint_for("qwen2.5-coder-1.5b:hf-bf16"))
    assert p is not None and p.source == ScaleSource.UNSCALED
    assert p.version_note == "rules read from vllm 0.25.0; vllm 0.33.0 not checked"


def test_llamacpp_block_scales() -> None:
    p = plan_scales(make_arm("q8kv", weights="q8_0", kv="q8_0"), "llamacpp")
    assert p is not None and p.source == ScaleSource.DYNAMIC_PER_BLOCK


# -------------------------------------------------------------------------------------------------- the data


def test_rules_file_is_valid_and_cited() -> None:
    data = load_rules()
    assert check_rules(data) == []
    for e in data["kv_scale"]:
        assert "@" in e["source"] and ":L" in e["source"] or e["engine"] == "llamacpp", e["id"]
    for m in data["measured"]:
        assert len(m["run_id"]) == 32 and m["store"].startswith("docs/gpu/")
    bad = {"kv_scale": [{"id": "x", "engine": "vllm", "scale_source": "guessed", "message": "m", "source": "s"}]}
    assert check_rules(bad) == [("kv_scale 'x': scale_source 'guessed' is not one of 1.0, checkpoint, "
                                 "computed-at-start, dynamic-per-block, dynamic-per-token-head, not-quantized, "
                                 "refused, unknown")]


def test_preflight_json_carries_the_plan(tmp_path: Path) -> None:
    from quantrack.hardware.catalog import get_gpu
    from quantrack.hardware.preflight import PreflightRequest, run_preflight

    d = checkpoint(tmp_path, qc=CT_QC, scales=per_tensor())
    arms = [make_arm("auto"), make_arm("bf16-kv", kv="bf16"), make_arm("cal", kv="fp8"),
            make_arm("fp8-kv", weights="fp8", kv="fp8", quantization="fp8")]
    rep = run_preflight(PreflightRequest(gpus=[get_gpu("H200")], arms=arms, engine="vllm", engine_version="0.25.0",
                                         model_path=str(d)))
    got = {r.arm: (r.kv_scales or {}).get("rule_id") for r in rep.results}
    # kv "auto" on a checkpoint that declares a kv_cache_scheme is an FP8 KV cache in vLLM: preflight says so
    assert got == {"auto": "vllm-kv-scheme-auto-fp8", "bf16-kv": "kv-not-quantized",
                   "cal": "vllm-kv-checkpoint-scales", "fp8-kv": "vllm-kv-checkpoint-scales"}
    assert rep.to_dict()["results"][2]["kv_scales"]["source"] == "checkpoint"
    # checkpoint scales read from the headers: the generic "FP8 KV without calibrated scales" warning does not fire
    # for those arms (it did beside calibrated arms before); an arm whose scales stay 1.0 keeps it
    by_arm = {r.arm: r for r in rep.results}
    for name in ("cal", "fp8-kv"):
        assert "vllm-fp8-kv-uncalibrated" not in [v.rule_id for v in by_arm[name].reasons], name
    (tmp_path / "b").mkdir()
    no_scales = checkpoint(tmp_path / "b")
    bare = run_preflight(PreflightRequest(gpus=[get_gpu("H200")], arms=[make_arm("kv", kv="fp8")], engine="vllm",
                                          engine_version="0.25.0", model_path=str(no_scales)))
    assert bare.results[0].kv_scales["source"] == "1.0"
    assert "vllm-fp8-kv-uncalibrated" in [v.rule_id for v in bare.results[0].reasons]
    # --calculate-kv-scales: vLLM computes them at start (not 1.0): the "uses scales of 1.0" warning would be wrong
    calc = make_arm("calc", kv="fp8", engine_args=("--calculate-kv-scales",))
    rep = run_preflight(PreflightRequest(gpus=[get_gpu("H200")], arms=[calc], engine="vllm", engine_version="0.25.0",
                                         model_path=str(no_scales)))
    assert rep.results[0].kv_scales["source"] == "computed-at-start"
    assert "vllm-fp8-kv-uncalibrated" not in [v.rule_id for v in rep.results[0].reasons]


def test_measured_runs_attach_to_the_plans_their_rule_decided(tmp_path: Path) -> None:
    """quantrack's own H200 runs (rules/kv-scales.toml [[measured]]) reach the preflight of the arms they bear on:
    an entry naming a rule only that rule's plans; a computed or per-token-head plan never gets the 1.0-scale runs."""
    d = checkpoint(tmp_path)
    p = plan(d, "vllm", {"name": "i8", "kv": "int8_per_token_head"}, args=("--attention-backend", "TRITON_ATTN"))
    assert [m["run_id"] for m in p.measured] == ["8df3c6350f5943a79ebd8973511b901c"]
    assert "+0.7 pts" in p.measured[0]["figure"]
    p = plan(d, "vllm", {"name": "c", "kv": "fp8"}, args=("--calculate-kv-scales",))
    assert (p.rule_id, [m["run_id"] for m in p.measured]) == ("vllm-kv-calculate-scales",
                                                              ["d7901b13c0f74499bf176fa4cc8b9722"])
    p = plan(d, "vllm", {"name": "kv-fp8", "kv": "fp8"})  # scales 1.0: not the computed or per-token-head runs
    assert "d7901b13c0f74499bf176fa4cc8b9722" not in [m["run_id"] for m in p.measured]
    p = plan(d, "sglang", {"name": "e5", "kv": "fp8_e5m2"})
    assert [m["run_id"] for m in p.measured] == ["e1873907245e4fbbbc04b9d59833adfe"]
    assert plan(d, "vllm", {"name": "bf16", "kv": "auto"}).measured == []
