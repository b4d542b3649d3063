"""The shipped rulebook: valid, sourced, and in step with the engine facts it cites."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from quantrack.hardware.rulebook import check_rules, engine_table, load_rules
from quantrack.resources import rules_dir

CITATION = re.compile(r"(vllm|sglang|llama\.cpp)@[0-9a-fv.]+:\S+:L\d+|seed |vllm-project/vllm#\d+|engine-facts §")


def test_shipped_rules_are_valid():
    assert check_rules() == []


def test_every_rule_cites_a_source():
    for r in load_rules():
        assert CITATION.search(r.source), f"{r.id}: source has no citation: {r.source}"


def test_required_rules_exist():
    have = {r.id for r in load_rules()}
    for rid in ("fp8-w8a8-needs-sm89", "cutlass-fp8-sm89-needs-cuda12.4", "cutlass-fp8-sm90-needs-cuda12.0",
                "vllm-fp8-marlin-fallback", "sglang-fp8-marlin-auto", "vllm-bf16-explicit-below-sm80",
                "sglang-needs-sm75", "vllm-fp8-kv-uncalibrated", "mig-fp8-not-native", "rocm-awq-gptq-docs-vs-code",
                "four-bit-different-artifact", "small-model-quantization", "fp8-weights-kv-conflated",
                "accuracy-sample-too-small", "llamacpp-quantized-v-needs-flash-attn", "cpu-no-fp8-weights"):
        assert rid in have


@pytest.fixture
def facts_text(shared_data) -> str:
    return (shared_data / "reference" / "engine-facts.md").read_text(encoding="utf-8")


def _literal_list(text: str, start: str) -> list[str]:
    block = text[text.index(start):]
    block = block[: block.index("]")]
    return re.findall(r'"([^"]+)"', block)


def test_vllm_method_list_matches_engine_facts(facts_text):
    names = _literal_list(facts_text, "QuantizationMethods = Literal[")
    assert len(names) == 30
    assert sorted(engine_table("vllm")["methods"]) == sorted(names)


def test_sglang_method_list_matches_engine_facts(facts_text):
    names = _literal_list(facts_text, "QUANTIZATION_CHOICES = [")
    assert sorted(engine_table("sglang")["methods"]) == sorted(names)


def test_kv_choices_match_engine_facts(facts_text):
    text = facts_text
    assert engine_table("vllm")["kv_choices"] == _literal_list(text, "CacheDType = Literal[")
    sglang = re.search(r'choices=(\["auto", "fp8_e5m2"[^\]]*\])', text)
    assert sglang and engine_table("sglang")["kv_choices"] == re.findall(r'"([^"]+)"', sglang.group(1))


def test_methods_toml_min_capabilities_spot_checks():
    # engine-facts §3.2 (vLLM 0.33), §3.3 (vLLM 0.11), §3.5 (SGLang 0.5.23)
    assert engine_table("vllm")["methods"]["fp8"] == 75
    assert engine_table("vllm", "0.11.0")["methods"]["fp8"] == 80
    assert engine_table("sglang")["methods"]["fp8"] == 80
    assert engine_table("sglang")["methods"]["w8a8_fp8"] == 89
    data = tomllib.loads((rules_dir() / "methods.toml").read_text(encoding="utf-8"))
    assert set(data["engine"]) == {"vllm", "sglang", "llamacpp"}


# ---------------------------------------------------------------- `quantrack rules ...`

def cli(capsys, *args: str) -> tuple[int, str, str]:
    from quantrack.cli import main

    try:
        code = main(["rules", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def test_rules_check_ok(capsys):
    code, out, _ = cli(capsys, "check")
    assert code == 0
    assert out.startswith(f"OK: {len(load_rules())} rules in 3 files (rules-engines.toml, rules-hardware.toml, "
                          "rules-methodology.toml) + methods.toml")


def test_rules_check_bad_dir_names_file_and_rule(capsys, tmp_path):
    (tmp_path / "rules-bad.toml").write_text(
        '[[rule]]\nid = "x"\nverdict = "deny"\nmessage = "m"\nsource = "s"\n', encoding="utf-8")
    code, out, err = cli(capsys, "check", str(tmp_path))
    assert code == 2 and out == ""
    assert err == "quantrack: error: rules-bad.toml: rule 'x': verdict 'deny' is not one of allow, warn, reject\n"


def test_rules_list_json_and_table(capsys):
    code, out, _ = cli(capsys, "list", "--format", "json")
    data = json.loads(out)
    assert code == 0 and len(data) == len(load_rules())
    assert {"id", "verdict", "message", "fix", "source", "match"} <= set(data[0])
    code, out, _ = cli(capsys, "list")
    assert code == 0 and "fp8-w8a8-needs-sm89" in out and "warn" in out


def test_rules_explain(capsys):
    code, out, _ = cli(capsys, "explain", "cutlass-fp8-sm89-needs-cuda12.4")
    assert code == 0
    assert "matches when: engine = vllm, vendor = nvidia, cc_min = 89, cc_max = 89, weights = ['fp8'], cuda_max = 12.3" in out
    assert "source: vllm@4ba787ec9:csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu:L147-L161" in out
    code, out, err = cli(capsys, "explain", "cutlass-fp8-sm89-needs-cuda12")
    assert code == 2
    assert err == ("quantrack: error: unknown rule 'cutlass-fp8-sm89-needs-cuda12' "
                   "(did you mean 'cutlass-fp8-sm89-needs-cuda12.4'?); see `quantrack rules list`\n")
