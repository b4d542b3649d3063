"""quantrack.hardware.rulebook: validation of rule files, pure evaluation, engine flag spellings."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.arms import make_arm, parse_arm_spec
from quantrack.errors import BadInput
from quantrack.hardware.catalog import get_gpu
from quantrack.hardware.rulebook import (
    UNCHECKED,
    NodeFacts,
    StudyContext,
    check_rules,
    engine_flags,
    evaluate,
    evaluate_study,
    get_rule,
    overall,
)

T4 = NodeFacts("T4", "nvidia", "turing", 75, 16.0)
V100 = NodeFacts("V100", "nvidia", "volta", 70, 16.0)
A100 = NodeFacts("A100-80GB", "nvidia", "ampere", 80, 80.0)
L4 = NodeFacts("L4", "nvidia", "ada", 89, 24.0)
H100 = NodeFacts("H100-SXM", "nvidia", "hopper", 90, 80.0)
MI300X = NodeFacts("MI300X", "amd", "cdna3", None, 192.0)
CPU = NodeFacts("x86-cpu", "cpu", "x86", None, None)


def ids(verdicts, verdict=None):
    return {v.rule_id for v in verdicts if verdict is None or v.verdict == verdict}


# ---------------------------------------------------------------- validation

GOOD = '''
[[rule]]
id = "a-rule"
verdict = "warn"
message = "m"
source = "s"
[rule.match]
cc_min = 75
cc_max = 88
'''


def write(tmp_path: Path, text: str, name: str = "rules-x.toml") -> Path:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_check_accepts_a_good_file(tmp_path):
    assert check_rules(write(tmp_path, GOOD)) == []


@pytest.mark.parametrize("text, problem", [
    (GOOD.replace('cc_max = 88', 'cc_max = 70'), "rules-x.toml: rule 'a-rule': match.cc_min 75 is greater than match.cc_max 70"),
    (GOOD.replace('cc_max = 88', 'cc_max = "high"'), "rules-x.toml: rule 'a-rule': match.cc_max must be an integer, got 'high'"),
    (GOOD.replace('verdict = "warn"', 'verdict = "maybe"'), "rules-x.toml: rule 'a-rule': verdict 'maybe' is not one of allow, warn, reject"),
    (GOOD.replace('cc_min = 75', 'cc_mni = 75'), "rules-x.toml: rule 'a-rule': unknown match key 'cc_mni' (did you mean 'cc_min'?)"),
    (GOOD.replace('source = "s"', 'source = "s"\nsorce = "t"'), "rules-x.toml: rule 'a-rule': unknown key 'sorce' (did you mean 'source'?)"),
    (GOOD + GOOD, "rules-x.toml: rule 'a-rule': duplicate id (first in rules-x.toml)"),
    (GOOD.replace('cc_max = 88', 'cuda_min = "12.4"\ncuda_max = "12.0"'), "rules-x.toml: rule 'a-rule': match.cuda_min '12.4' is greater than match.cuda_max '12.0'"),
    (GOOD.replace('cc_max = 88', 'engine = "vlm"'), "rules-x.toml: rule 'a-rule': match.engine 'vlm' is unknown (did you mean 'vllm'?)"),
    (GOOD.replace('source = "s"', ''), "rules-x.toml: rule 'a-rule': 'source' (a non-empty string) is required"),
])
def test_check_names_file_and_rule(tmp_path, text, problem):
    assert problem in check_rules(write(tmp_path, text))


def test_check_reports_invalid_toml(tmp_path):
    problems = check_rules(write(tmp_path, "[[rule]\nid="))
    assert len(problems) == 1 and problems[0].startswith("rules-x.toml: not valid TOML:")


def test_duplicate_id_across_files(tmp_path):
    write(tmp_path, GOOD, "rules-a.toml")
    write(tmp_path, GOOD, "rules-b.toml")
    assert check_rules(tmp_path) == ["rules-b.toml: rule 'a-rule': duplicate id (first in rules-a.toml)"]


def test_unknown_rule_id_suggests():
    with pytest.raises(BadInput, match=r"unknown rule 'fp8-w8a8-needs-sm9' \(did you mean 'fp8-w8a8-needs-sm89'\?\)"):
        get_rule("fp8-w8a8-needs-sm9")


# ---------------------------------------------------------------- evaluation: FP8

def test_vllm_fp8_on_a100_is_marlin_warning_with_log_lines():
    vs = evaluate(A100, parse_arm_spec("fp8"), "vllm")
    assert overall(vs) == "warn"
    marlin = next(v for v in vs if v.rule_id == "vllm-fp8-marlin-fallback")
    assert marlin.log_lines[0] == "Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod"
    assert marlin.log_lines[1].startswith("Your GPU does not have native support for FP8 computation")
    assert "memory win" in marlin.message and "no compute win" in marlin.message


def test_catalog_gpu_works_like_facts():
    assert ids(evaluate(get_gpu("A100"), parse_arm_spec("fp8"), "vllm")) == ids(evaluate(A100, parse_arm_spec("fp8"), "vllm"))


def test_sglang_rejects_fp8_on_t4_min_capability_80():
    vs = evaluate(T4, parse_arm_spec("fp8"), "sglang")
    assert overall(vs) == "reject"
    v = next(v for v in vs if v.rule_id == "method-min-capability")
    assert v.verdict == "reject"
    assert "Minimum capability: 80. Current capability: 75." in v.message


def test_sglang_marlin_only_on_sm80_to_88():
    assert "sglang-fp8-marlin-auto" in ids(evaluate(A100, parse_arm_spec("fp8"), "sglang"), "warn")
    assert "sglang-fp8-marlin-auto" not in ids(evaluate(T4, parse_arm_spec("fp8"), "sglang"))
    assert "sglang-fp8-marlin-auto" not in ids(evaluate(L4, parse_arm_spec("fp8"), "sglang"))


def test_fp8_on_h100_with_cuda_12_4_is_allowed():
    vs = evaluate(H100, parse_arm_spec("fp8"), "vllm", engine_version="0.25.0", cuda="12.4")
    assert overall(vs) == "allow"
    assert ids(vs, "allow") == {"cutlass-fp8-sm90-ok"}


def test_fp8_on_l4_with_cuda_12_1_is_rejected_by_cutlass_gate():
    vs = evaluate(L4, parse_arm_spec("fp8"), "vllm", cuda="12.1")
    assert "cutlass-fp8-sm89-needs-cuda12.4" in ids(vs, "reject")
    assert overall(vs) == "reject"


@pytest.mark.parametrize("cuda, expected", [("12.3.2", "reject"), ("12.4", "allow"), ("12.4.1", "allow"), ("11.8", "reject")])
def test_cutlass_gate_compares_at_the_rules_precision(cuda, expected):
    vs = evaluate(L4, parse_arm_spec("fp8"), "vllm", engine_version="0.25.0", cuda=cuda)
    assert overall(vs) == expected


def test_without_cuda_the_gate_is_unchecked_not_passed():
    vs = evaluate(L4, parse_arm_spec("fp8"), "vllm", engine_version="0.25.0")
    assert ids(vs, UNCHECKED) == {"cutlass-fp8-sm89-needs-cuda12.4"}
    assert overall(vs) == "allow"
    assert next(v for v in vs if v.verdict == UNCHECKED).message.startswith("not checked (needs --cuda)")


def test_vllm_033_fp8_online_warning_only_for_shared_checkpoint():
    assert "vllm-fp8-no-online-quantization" in ids(evaluate(H100, parse_arm_spec("fp8"), "vllm"))
    own = make_arm("fp8ckpt", weights="fp8", quantization="fp8", model="org/model-FP8")
    assert "vllm-fp8-no-online-quantization" not in ids(evaluate(H100, own, "vllm"))
    assert "vllm-fp8-no-online-quantization" not in ids(evaluate(H100, parse_arm_spec("fp8"), "vllm", "0.25.0"))


def test_legacy_vllm_needs_sm80_for_fp8():
    # v0.11.0: Fp8Config min capability 80; v0.33.0: 75 (engine-facts §3.2/§3.3)
    assert overall(evaluate(T4, parse_arm_spec("fp8"), "vllm", "0.11.0")) == "reject"
    assert "method-min-capability" not in ids(evaluate(T4, parse_arm_spec("fp8"), "vllm", "0.33.0"))


def test_mig_slice_fp8_warns_with_issue_source():
    vs = evaluate(H100, parse_arm_spec("fp8"), "vllm", cuda="12.4", mig=True)
    v = next(v for v in vs if v.rule_id == "mig-fp8-not-native")
    assert v.verdict == "warn" and "vllm-project/vllm#10142" in v.source
    assert "mig-fp8-not-native" not in ids(evaluate(H100, parse_arm_spec("fp8"), "vllm", cuda="12.4"))


# ---------------------------------------------------------------- evaluation: dtype, methods, KV

def test_bf16_below_sm80_vllm_explicit_rejects_auto_warns():
    explicit = make_arm("bf16x", weights="bf16", dtype="bf16")
    vs = evaluate(T4, explicit, "vllm")
    assert "vllm-bf16-explicit-below-sm80" in ids(vs, "reject")
    assert "--dtype half" in next(v.fix for v in vs if v.rule_id == "vllm-bf16-explicit-below-sm80")
    assert "vllm-bf16-auto-fallback" in ids(evaluate(T4, parse_arm_spec("bf16"), "vllm"), "warn")
    assert overall(evaluate(A100, parse_arm_spec("bf16"), "vllm")) == "allow"


def test_sglang_refuses_below_sm75():
    assert "sglang-needs-sm75" in ids(evaluate(V100, parse_arm_spec("bf16"), "sglang"), "reject")


def test_unknown_method_for_engine_rejects_with_did_you_mean():
    arm = make_arm("x", weights="w4a16", quantization="awq_marlinn")
    v = next(v for v in evaluate(A100, arm, "vllm") if v.rule_id == "method-name")
    assert v.verdict == "reject"
    assert "no quantization method 'awq_marlinn' (did you mean 'awq_marlin'?)" in v.message


def test_method_names_differ_per_engine():
    arm = make_arm("w8", weights="fp8", quantization="w8a8_fp8")  # SGLang spelling, no vLLM flag
    assert "method-name" not in ids(evaluate(H100, arm, "sglang"))
    assert engine_flags("sglang", arm) == {"--quantization": "w8a8_fp8"}
    assert engine_flags("vllm", arm) == {}  # read from the compressed-tensors checkpoint
    humming_sglang = make_arm("h", weights="w4a16", quantization="fp8_per_tensor")
    assert "method-name" in ids(evaluate(H100, humming_sglang, "sglang"), "reject")


def test_awq_on_volta_rejected():
    assert "awq-needs-sm75" in ids(evaluate(V100, parse_arm_spec("awq"), "vllm"), "reject")


def test_fp8_kv_uncalibrated_warns_per_engine():
    assert "vllm-fp8-kv-uncalibrated" in ids(evaluate(H100, parse_arm_spec("kv-fp8"), "vllm"), "warn")
    assert "sglang-fp8-kv-uncalibrated" in ids(evaluate(H100, parse_arm_spec("kv-fp8"), "sglang"), "warn")
    calibrated = make_arm("kvc", weights="bf16", kv="fp8", engine_args=["--quantization-param-path", "scales.json"])
    assert "sglang-fp8-kv-uncalibrated" not in ids(evaluate(H100, calibrated, "sglang"))


def test_sglang_fp4_kv_needs_cuda_12_8():
    arm = make_arm("kv4", weights="bf16", kv="nvfp4")
    assert "sglang-fp4-kv-needs-cuda12.8" in ids(evaluate(H100, arm, "sglang", cuda="12.4"), "reject")
    assert "sglang-fp4-kv-needs-cuda12.8" not in ids(evaluate(H100, arm, "sglang", cuda="12.8"))


def test_kv_dtype_not_on_engine_rejects():
    arm = make_arm("kvf16", weights="bf16", kv="fp16")  # SGLang has no float16 KV choice
    v = next(v for v in evaluate(H100, arm, "sglang") if v.rule_id == "kv-dtype")
    assert v.verdict == "reject" and "fp8_e4m3" in v.message


def test_rocm_awq_docs_code_disagreement_warns():
    vs = evaluate(MI300X, make_arm("awq", weights="w4a16", quantization="awq"), "vllm")
    assert "rocm-awq-gptq-docs-vs-code" in ids(vs, "warn")
    assert "rocm-vllm-method-unsupported" in ids(
        evaluate(MI300X, make_arm("g", weights="w4a16", quantization="gptq_marlin"), "vllm"), "reject")


# ---------------------------------------------------------------- llama.cpp and CPU

def test_llamacpp_quantized_v_cache_needs_flash_attention():
    off = make_arm("q8kv", weights="q8_0", kv="q8_0", engine_args=["-fa", "off"])
    assert "llamacpp-quantized-v-needs-flash-attn" in ids(evaluate(CPU, off, "llamacpp"), "reject")
    auto = make_arm("q8kv", weights="q8_0", kv="q8_0")
    assert overall(evaluate(CPU, auto, "llamacpp")) == "allow"


@pytest.mark.parametrize("spec", ["fp8", "awq", "gptq", "weights=w4a16,quantization=gptq_marlin"])
def test_gpu_only_formats_rejected_on_cpu(spec):
    assert overall(evaluate(CPU, parse_arm_spec(spec), "llamacpp")) == "reject"


def test_gguf_on_cpu_allowed():
    vs = evaluate(CPU, make_arm("q4", weights="q4_0"), "llamacpp")
    assert overall(vs) == "allow" and "cpu-gguf-llamacpp" in ids(vs)


# ---------------------------------------------------------------- methodology

def test_four_bit_arm_is_a_different_artifact():
    assert "four-bit-different-artifact" in ids(evaluate(H100, parse_arm_spec("w4a16"), "vllm"), "warn")


def test_conflated_fp8_weights_and_kv_unless_isolated():
    fp8kv = parse_arm_spec("fp8-kv")
    alone = StudyContext(arms=(parse_arm_spec("bf16"), fp8kv))
    assert "fp8-weights-kv-conflated" in ids(evaluate(H100, fp8kv, "vllm", study_context=alone))
    isolated = StudyContext(arms=(parse_arm_spec("bf16"), parse_arm_spec("fp8"), fp8kv))
    assert "fp8-weights-kv-conflated" not in ids(evaluate(H100, fp8kv, "vllm", study_context=isolated))


def test_small_model_share_below_ten_percent():
    # Qwen2.5-0.5B: 0.49e9 params x 2 B = 0.92 GiB of an 80 GiB H100 (1.1 %) -> warn; 8B on a 16 GiB T4 -> no
    small = StudyContext(arms=(parse_arm_spec("fp8"),), model_params=0.49e9)
    assert "small-model-quantization" in ids(evaluate(H100, parse_arm_spec("fp8"), "vllm", study_context=small))
    big = StudyContext(arms=(parse_arm_spec("fp8"),), model_params=8.03e9)
    assert "small-model-quantization" not in ids(evaluate(T4, parse_arm_spec("fp8"), "vllm", study_context=big))
    assert "small-model-quantization" not in ids(evaluate(H100, parse_arm_spec("bf16"), "vllm", study_context=small))


def test_accuracy_sample_rule_is_study_level():
    assert ids(evaluate_study(StudyContext(eval_questions=200))) == {"accuracy-sample-too-small"}
    assert "200 GSM8K questions" in evaluate_study(StudyContext(eval_questions=200))[0].message
    assert evaluate_study(StudyContext(eval_questions=1319)) == []
    assert evaluate_study(StudyContext(eval_questions=None)) == []


# ---------------------------------------------------------------- engine flags

def test_engine_flags_spellings():
    fp8kv = parse_arm_spec("fp8-kv")
    assert engine_flags("vllm", fp8kv) == {"--quantization": "fp8", "--kv-cache-dtype": "fp8"}
    assert engine_flags("sglang", fp8kv) == {"--quantization": "fp8", "--kv-cache-dtype": "fp8_e4m3"}
    q8 = make_arm("q8", weights="q8_0", kv="q8_0")
    assert engine_flags("llamacpp", q8) == {"--cache-type-k": "q8_0", "--cache-type-v": "q8_0"}
    assert engine_flags("vllm", make_arm("h", weights="fp16", dtype="fp16")) == {"--dtype": "half"}
    assert engine_flags("vllm", parse_arm_spec("bf16")) == {}


def test_engine_flags_bad_input():
    with pytest.raises(BadInput, match=r"unknown vllm quantization method 'fp9' \(did you mean 'fp8'\?\)"):
        engine_flags("vllm", make_arm("x", weights="fp8", quantization="fp9"))
    with pytest.raises(BadInput, match=r"KV-cache dtype 'fp8' is not available on llamacpp"):
        engine_flags("llamacpp", make_arm("x", weights="q8_0", kv="fp8"))
    with pytest.raises(BadInput, match=r"llamacpp takes no --quantization"):
        engine_flags("llamacpp", make_arm("x", weights="q8_0", quantization="awq"))
