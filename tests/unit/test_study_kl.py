"""[eval] kl in a study file: which arms are scored, and the KL baseline server's memory share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantrack.errors import BadInput
from quantrack.study import load_study

HEAD = '''
name = "h200"
[model]
name = "Llama-3-8B"
path = "/models/llama"
[engine]
kind = "vllm"
[gpu]
name = "H200"
util = 0.45
[eval]
{kl}
[[arms]]
name = "bf16"
weights = "bf16"
baseline = true
[[arms]]
name = "fp8"
weights = "fp8"
quantization = "fp8"
[[arms]]
name = "fp8-kv"
weights = "fp8"
kv = "fp8"
quantization = "fp8"
'''


def study(tmp_path: Path, kl: str) -> Any:
    p = tmp_path / "study.toml"
    p.write_text(HEAD.replace("{kl}", kl), encoding="utf-8")
    return load_study(p)


def wanted(s: Any) -> list[str]:
    return [a.name for a in s.arms if s.kl_wanted(a)]


def test_default_scores_every_candidate_not_the_baseline(tmp_path: Path) -> None:
    s = study(tmp_path, "kl = { tokens = 400, top_k = 20 }")
    assert (s.eval.kl_tokens, s.eval.kl_top_k, s.eval.kl_arms, s.eval.kl_baseline_util) == (400, 20, (), None)
    assert wanted(s) == ["fp8", "fp8-kv"]


def test_no_kl_table_scores_nothing(tmp_path: Path) -> None:
    assert wanted(study(tmp_path, 'task = "gsm8k"')) == []


def test_arms_choose_and_may_name_the_baseline_as_a_self_check(tmp_path: Path) -> None:
    s = study(tmp_path, 'kl = { tokens = 4000, arms = ["bf16", "fp8"], baseline_util = 0.45 }')
    assert wanted(s) == ["bf16", "fp8"]
    assert s.eval.kl_baseline_util == 0.45 and s.eval.kl_top_k == 20


def test_flat_keys_work_too(tmp_path: Path) -> None:
    s = study(tmp_path, 'kl_tokens = 100\nkl_arms = ["fp8-kv"]\nkl_baseline_util = 0.4')
    assert wanted(s) == ["fp8-kv"] and s.eval.kl_baseline_util == 0.4


@pytest.mark.parametrize("kl, message", [
    ('kl = { tokens = 400, arms = ["fp9"] }', "[eval] kl.arms: no arm 'fp9'"),
    ("kl = { tokens = 400, baseline_util = 1.5 }", "[eval] kl.baseline_util: expected a finite number in (0, 1], got 1.5"),
    ("kl = { tokens = 400, base_util = 0.4 }", "[eval] kl: unknown key 'base_util' (did you mean 'baseline_util'?)"),
    ('kl = { tokens = "many" }', '[eval] kl.tokens: expected an integer in 1..1000000 (the top-k log-probabilities of both sides are held for every position), got "many"'),
    ("kl = { tokens = 0 }", "[eval] kl.tokens: expected an integer in 1..1000000 (the top-k log-probabilities of both sides are held for every position), got 0"),
    ("kl = { tokens = 400, top_k = 0 }", "[eval] kl.top_k: expected an integer in 1..100, got 0"),
    ("kl = { tokens = 400, top_k = 500 }", "[eval] kl.top_k: expected an integer in 1..100, got 500"),
    ("kl = { tokens = 400, top_k = 21 }", "[eval] kl.top_k: vLLM returns at most --max-logprobs (default 20)"),
    ('kl = { tokens = 400, arms = "fp8" }', '[eval] kl.arms: expected a list of non-empty strings, got "fp8"'),
    ("kl = 400", "[eval] kl: expected a table like { tokens = 2000, top_k = 20 }, got 400"),
    ("kl_tokens = 5\nkl = { tokens = 400 }", "[eval] kl_tokens given twice"),
])
def test_bad_kl_tables_are_one_line_errors(tmp_path: Path, kl: str, message: str) -> None:
    with pytest.raises(BadInput, match="^[^\n]*$") as exc:
        study(tmp_path, kl)
    assert message in str(exc.value)


def test_kl_baseline_server_gets_the_kl_util_and_the_baseline_arm(tmp_path: Path, monkeypatch) -> None:
    """The baseline served for KL runs beside the candidate: it must get its own memory share."""
    import quantrack.accuracy.kl as kl_mod
    import quantrack.engines.lifecycle as life
    from quantrack.runner import step_kl

    seen: dict[str, Any] = {}

    class FakeServer:  # stands in for the engine process only; the wiring is what is tested
        base_url, pid = "http://127.0.0.1:1", 1

        def __init__(self, argv: list[str]) -> None:
            seen["argv"] = argv

        def __enter__(self) -> FakeServer:  # noqa: PYI034
            return self

        def __exit__(self, *exc: object) -> None:
            seen["stopped"] = True

    real = life.kl_baseline_server

    def fake_kl_baseline_server(study: Any, baseline: Any, **kw: Any) -> FakeServer:
        seen["arm"] = baseline.name
        return FakeServer(real(study, baseline, **kw).argv)  # the real argv, never started

    def fake_run_kl(base: str, cand: str, engine: str, **kw: Any) -> str:
        seen.update(kl_base=base, kl_cand=cand, tokens=kw["tokens"], top_k=kw["top_k"])
        return "result"

    monkeypatch.setattr(life, "kl_baseline_server", fake_kl_baseline_server)
    monkeypatch.setattr(kl_mod, "run_kl", fake_run_kl)
    s = study(tmp_path, 'kl = { tokens = 300, top_k = 10, arms = ["fp8"], baseline_util = 0.4 }')
    out = step_kl(s, s.arm("fp8"), "http://127.0.0.1:2", s.baseline, tmp_path, lambda _m: None)
    assert out == "result" and seen["stopped"] and seen["arm"] == "bf16"
    argv = seen["argv"]
    assert argv[:3] == ["vllm", "serve", "/models/llama"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.4"
    assert (seen["kl_base"], seen["kl_cand"], seen["tokens"], seen["top_k"]) == (
        "http://127.0.0.1:1", "http://127.0.0.1:2", 300, 10)
    # without baseline_util the study's [gpu] util is used
    s = study(tmp_path, "kl = { tokens = 300 }")
    step_kl(s, s.arm("fp8"), "http://127.0.0.1:2", s.baseline, tmp_path, lambda _m: None)
    argv = seen["argv"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.45"


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` without the given flags and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def test_kl_baseline_argv_is_the_launch_path_of_every_arm_on_tp2(tmp_path: Path) -> None:
    """[gpu] count = 2: the KL baseline gets the same --tensor-parallel-size and --served-model-name as the
    arms; its argv is exactly the baseline arm's own launch argv but for the memory share and the port."""
    from quantrack.engines.lifecycle import kl_baseline_server, server_for_study

    text = HEAD.format(kl='kl = { tokens = 300, arms = ["fp8"], baseline_util = 0.3 }').replace(
        "util = 0.45", "util = 0.45\ncount = 2").replace('path = "/models/llama"',
                                                         'path = "/models/llama"\nserved_name = "llama"')
    f = tmp_path / "s.toml"
    f.write_text(text, encoding="utf-8")
    s = load_study(f)
    base = kl_baseline_server(s, s.baseline).argv
    cand = server_for_study(s, "fp8").argv
    arm_itself = server_for_study(s, "bf16").argv
    for argv in (base, cand):
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert argv[argv.index("--served-model-name") + 1] == "llama"
    assert base[base.index("--gpu-memory-utilization") + 1] == "0.3"
    assert cand[cand.index("--gpu-memory-utilization") + 1] == "0.45"
    assert _without(base, "--port", "--gpu-memory-utilization") == \
        _without(arm_itself, "--port", "--gpu-memory-utilization")


def test_kl_baseline_llamacpp_one_slot_one_thread_same_flags(tmp_path: Path) -> None:
    """llama.cpp: the baseline beside the candidate gets one slot (-np 1) and one thread (-t 1); the rest of
    its argv (context, alias, the study's args) is the baseline arm's own."""
    from quantrack.engines.lifecycle import kl_baseline_server, server_for_study

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    f = tmp_path / "s.toml"
    f.write_text(f"""
name = "cpu"
context_len = 1024
parallel = 2
[model]
gguf = "{gguf}"
served_name = "smol"
[engine]
kind = "llamacpp"
args = ["--no-warmup"]
[gpu]
name = "H200"
[eval]
kl = {{ tokens = 100, arms = ["q8"] }}
[[arms]]
name = "f16"
weights = "f16"
baseline = true
[[arms]]
name = "q8"
weights = "q8_0"
""", encoding="utf-8")
    s = load_study(f)
    base = kl_baseline_server(s, s.baseline).argv
    own = server_for_study(s, "f16").argv
    assert base[base.index("-np") + 1] == "1" and own[own.index("-np") + 1] == "2"
    assert base[-2:] == ["-t", "1"] and "-t" not in own
    assert _without(base, "--port", "-np", "-t") == _without(own, "--port", "-np")
    assert "--alias" in base and "--no-warmup" in base and base[base.index("-c") + 1] == "1024"
