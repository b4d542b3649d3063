"""Preflight refuses what the engines' newest releases removed or never had, for the study's stated version (issue 41):
vLLM 0.33 with --calculate-kv-scales (rule vllm-calculate-kv-scales-removed), SGLang 0.5.23 with an INT8 KV arm
(rule kv-dtype: SGLang's --kv-cache-dtype choices). Each refusal names its rule and carries its citation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.arms import make_arm
from quantrack.cli import main
from quantrack.hardware.rulebook import NodeFacts, evaluate, get_rule

H200 = NodeFacts(name="H200", vendor="nvidia", cc=90, memory_gib=139.8)


def _study(tmp: Path, engine: str, version: str | None, arm: str) -> Path:
    p = tmp / f"{engine}-{version}.toml"
    p.write_text(f'''
name = "versions"
[model]
name = "Llama-3.1-8B"
[engine]
kind = "{engine}"
{f'version = "{version}"' if version else ""}
[gpu]
name = "H200"
[[arms]]
name = "bf16"
weights = "bf16"
[[arms]]
{arm}
''', encoding="utf-8")
    return p


def _preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    try:
        code = main(["preflight", *args, "--format", "json"])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert err == ""
    return int(code or 0), json.loads(out)


def _reasons(data: dict, arm: str) -> dict[str, dict]:
    res = next(r for r in data["results"] if r["arm"] == arm)
    return {v["rule"]: v for v in res["reasons"]}


COMPUTED = 'name = "kv-fp8-computed"\nweights = "bf16"\nkv = "fp8"\nargs = ["--calculate-kv-scales"]'


def test_calculate_kv_scales_is_refused_on_vllm_033(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for version in ("0.33.0", None):  # stated, or the version the rules were read from (0.33.0)
        code, data = _preflight(capsys, "--study", str(_study(tmp_path, "vllm", version, COMPUTED)))
        assert code == 3
        v = _reasons(data, "kv-fp8-computed")["vllm-calculate-kv-scales-removed"]
        assert v["verdict"] == "reject"
        assert "vllm-project/vllm#49389" in v["source"] and "vllm@4ba787ec9" in v["source"]
        assert "Drop --calculate-kv-scales" in v["fix"]
        assert "vllm-calculate-kv-scales-removed" not in _reasons(data, "bf16")


def test_calculate_kv_scales_passes_on_the_vllm_that_had_it(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    code, data = _preflight(capsys, "--study", str(_study(tmp_path, "vllm", "0.25.0", COMPUTED)))
    assert "vllm-calculate-kv-scales-removed" not in _reasons(data, "kv-fp8-computed")
    assert code == 0


def test_the_flag_is_matched_in_any_spelling() -> None:
    rule = get_rule("vllm-calculate-kv-scales-removed")
    for args in (("--calculate-kv-scales",), ("--calculate-kv-scales=true",), ("--no-calculate-kv-scales",)):
        arm = make_arm("c", kv="fp8", engine_args=args)
        assert [v.verdict for v in evaluate(H200, arm, "vllm", "0.33.0", rules=[rule])] == ["reject"], args
    # a value that only looks like the flag, and SGLang (which never had it: no such rule), are left alone
    assert evaluate(H200, make_arm("c", engine_args=("--served-model-name", "x")), "vllm", rules=[rule]) == []
    assert evaluate(H200, make_arm("c", engine_args=("--calculate-kv-scales",)), "sglang", rules=[rule]) == []


def test_sglang_int8_kv_arm_is_refused_with_sglangs_choices(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    arm = 'name = "kv-int8"\nweights = "bf16"\nkv = "int8_per_token_head"'
    code, data = _preflight(capsys, "--study", str(_study(tmp_path, "sglang", "0.5.23", arm)))
    assert code == 3
    v = _reasons(data, "kv-int8")["kv-dtype"]
    assert v["verdict"] == "reject"
    assert v["message"] == ("KV-cache dtype 'int8_per_token_head' is not available on sglang 0.5.23; it accepts: "
                            "auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16")
    assert "sglang@v0.5.23:python/sglang/srt/arg_groups/fields/model.py:L209-L218" in v["source"]
    # the same arm on vLLM 0.33 is a dtype vLLM has (its CacheDType list)
    code, data = _preflight(capsys, "--study", str(_study(tmp_path, "vllm", "0.33.0", arm)))
    assert "kv-dtype" not in _reasons(data, "kv-int8")
