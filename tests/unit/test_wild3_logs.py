"""Round three of the public corpus (tests/data/wild3/, issue 41): excerpts from public threads the first corpus does
not hold, each with its URL (``.log.meta``) and the figures a person read off it (``.expect.json``, written before the
parser ran on it). One test per class the issue names: hybrid KV pools, buffers repeated on one device, draft models,
CPU placement, absence as evidence, Ollama's Go-style lines, ANSI codes, failed starts, rank ids as lower bounds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from quantrack.cli import main
from quantrack.engines import parse_log_file
from quantrack.engines.llamacpp import parse_llamacpp_log
from quantrack.engines.logparse import make_line
from quantrack.engines.reconcile import parallel_from_report
from quantrack.engines.sglang import parse_sglang_log
from quantrack.report.audit import CPU_PLACEMENT_KINDS, DEGRADED_KINDS

ROOT = Path(__file__).resolve().parents[2]
WILD = ROOT / "tests" / "data" / "wild3"
FILES = sorted(WILD.glob("*.log"))


def expected(p: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((p.parent / f"{p.stem}.expect.json").read_text())
    return data


def got(r: Any, key: str) -> Any:
    kinds = {e.kind for e in r.fallbacks} | {e.kind for e in r.warnings}
    if key == "cpu_placement":
        return sorted(kinds & set(CPU_PLACEMENT_KINDS))
    if key == "degraded":
        return sorted(kinds & set(DEGRADED_KINDS))
    if key == "fallbacks":
        return sorted({e.kind for e in r.fallbacks} - set(CPU_PLACEMENT_KINDS))
    if key == "errors":
        return sorted({e.kind for e in r.errors})
    if key == "tp_size_is":
        tp = parallel_from_report(r).get("tp", {})
        return "lower bound" if tp.get("bound") == "lower" else ("value" if tp else None)
    if key == "engine":
        return r.engine
    if hasattr(r, key) and key != "extra":
        return getattr(r, key)
    return r.extra.get(key)


def test_every_excerpt_names_its_thread() -> None:
    assert len(FILES) >= 12
    for p in FILES:
        meta = (p.parent / f"{p.name}.meta").read_text()
        assert re.search(r"^# source: https://github\.com/\S+", meta, re.MULTILINE), p.name
        assert "written before the parser was run" in meta and (p.parent / f"{p.stem}.expect.json").is_file()


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_the_stated_figures_come_out_exactly(path: Path) -> None:
    r = parse_log_file(path)
    for key, want in expected(path).items():
        have = got(r, key)
        if key == "startup_failed" and want is None:
            have = have or None  # "not failed": False or absent
        if isinstance(want, list) and all(isinstance(x, str) for x in want):
            want = sorted(want)
        assert have == want, f"{path.name}: {key}"


def test_hybrid_pools_are_pools_and_the_capacity_is_the_full_pools() -> None:
    r = parse_log_file(WILD / "sglang-18039-mimo-swa-pools.log")
    assert r.extra["kv_pools"] == [{"kind": "full", "tokens": 375360, "gib": None},
                                   {"kind": "swa", "tokens": 300288, "gib": 13.97}]
    assert r.kv_cache_tokens == 375360  # not the window pool's 300288 of the 'KV Cache is allocated' line
    # only the window pool's allocation line is in the excerpt: the memory of all pools is unknown, and says why
    assert r.available_kv_gib is None and "full pool is not in the log" in r.extra["available_kv_gib_unknown"]
    assert "k_size_gib" not in r.extra  # one pool's K size is not the cache's


def test_hybrid_pools_are_not_reconciled_against_one_pool(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["logs", "reconcile", str(WILD / "sglang-18039-mimo-swa-pools.log"), "--model", "Llama-3.1-8B",
              "--arm", "bf16", "--gpu", "H100"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "quantrack: error: cannot reconcile sglang-18039-mimo-swa-pools.log: the log shows hybrid KV pools (full "
        "375360 tokens, swa 300288 tokens); the capacity model predicts one full-attention pool, so it is not "
        "compared with either\n")


def test_a_rank_id_is_a_lower_bound_never_the_tp_size(capsys: pytest.CaptureFixture[str]) -> None:
    r = parse_log_file(WILD / "sglang-4161-h800-w8a8-moe-default-config.log")  # ranks TP1, TP4, TP6, TP7 only
    tp = parallel_from_report(r)["tp"]
    assert (tp["size"], tp["bound"]) == (8, "lower") and "at least 8" in tp["source"]
    with pytest.raises(SystemExit) as exc:
        main(["logs", "reconcile", str(WILD / "sglang-4161-h800-w8a8-moe-default-config.log"), "--model",
              "Llama-3.1-8B", "--arm", "bf16", "--gpu", "H100"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "quantrack: error: tp unknown: the log states no tp size, only TP ranks in the log's process prefixes "
        "(highest rank + 1: at least 8); a lower bound is not the size: pass --tp\n")


def test_repeated_buffer_lines_of_one_device_are_summed() -> None:
    # copied verbatim from github.com/ggml-org/llama.cpp/issues/22319 (comment by DenisVASI9, 2026-05-12; a thread
    # the first corpus holds another excerpt of): four CPU_Mapped lines for one device, weights mmapped in 4 parts
    lines = ["load_tensors: offloaded 44/44 layers to GPU",
             "load_tensors:   CPU_Mapped model buffer size = 43780.02 MiB",
             "load_tensors:   CPU_Mapped model buffer size = 45255.08 MiB",
             "load_tensors:   CPU_Mapped model buffer size = 45257.27 MiB",
             "load_tensors:   CPU_Mapped model buffer size = 20628.57 MiB",
             "load_tensors:        CUDA0 model buffer size = 24202.74 MiB"]
    r = parse_llamacpp_log("\n".join(lines))
    assert r.extra["model_buffers_mib"] == {"CPU_Mapped": 154920.94, "CUDA0": 24202.74}
    assert r.extra["model_buffer_lines"] == {"CPU_Mapped": 4}
    assert r.weights_gib == round((154920.94 + 24202.74) / 1024, 4)


def test_a_draft_models_weights_are_not_the_targets() -> None:
    # filled in from SGLang's format string "Load weight end. type=%s, dtype=%s, avail mem=%.2f GB, mem usage=%.2f GB."
    # (sglang@v0.5.23:python/sglang/srt/model_executor/model_runner.py:L1373-L1378); the draft's class is the
    # NextN module of a DeepSeek checkpoint (sglang/srt/models/deepseek_nextn.py: DeepseekV3ForCausalLMNextN)
    lines = [("[2025-06-01 10:00:00 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
             "avail mem=18.20 GB, mem usage=82.31 GB."),
             ("[2025-06-01 10:00:30 TP0] Load weight end. type=DeepseekV3ForCausalLMNextN, dtype=torch.bfloat16, "
             "avail mem=16.10 GB, mem usage=2.10 GB.")]
    r = parse_sglang_log("\n".join(lines))
    assert r.weights_gib == 82.31 and r.extra["model_class"] == "DeepseekV3ForCausalLM"
    assert (r.extra["draft_model"], r.extra["draft_model_class"], r.extra["draft_weights_gib"]) == (
        True, "DeepseekV3ForCausalLMNextN", 2.1)
    # the draft loaded first would not be read as the target either
    r = parse_sglang_log("\n".join(reversed(lines)))
    assert r.weights_gib == 82.31 and r.extra["draft_weights_gib"] == 2.1


def test_a_failed_draft_worker_is_a_failed_start() -> None:
    r = parse_log_file(WILD / "sglang-3582-nextn-draft-worker-failed.log")
    assert r.extra["startup_failed"] is True and r.extra["draft_model"] is True
    assert r.extra["startup_failure"].startswith("scheduler_init_failed at line 3:")


def test_cpu_placement_is_its_own_audit_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for p in FILES:
        shutil.copy(p, tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--format", "json"])
    assert exc.value.code == 4  # a node on the CPU is a slowdown like a fallback
    data = json.loads(capsys.readouterr().out)
    placed = data["cpu_placement"]
    assert sorted(placed) == ["iklcpp-1532-experts-overridden-to-cpu.log", "ollama-3711-partial-39of41.log",
                              "ollama-5913-rocm-offload-43of81.log", "ollama-8447-cpu-mapped-kv-on-cpu.log"]
    assert data["fell_back"] == []  # none of them is a kernel fallback
    for name, evidence in placed.items():  # the evidence is the file's own line, at its number
        line_no = int(evidence.split(":")[1])
        assert evidence == f"{name}:{line_no}: {(WILD / name).read_text().splitlines()[line_no - 1].strip()}"
    by = {n["node"]: n for n in data["nodes"]}
    assert by["ollama-8447-cpu-mapped-kv-on-cpu.log"]["cpu_placement"] == "kv_cache_on_cpu,partial_gpu_offload"
    assert "CPU KV buffer size" in next(e.line for e in parse_log_file(
        WILD / "ollama-8447-cpu-mapped-kv-on-cpu.log").warnings if e.kind == "kv_cache_on_cpu")
    # eight devices, every layer on them: no CPU placement, and not called clean either (no quantization named)
    assert by["ollama-9782-62of62-eight-devices.log"]["cpu_placement"] is None
    assert by["ollama-9782-62of62-eight-devices.log"]["fallback"] is None


def test_ollama_go_lines_are_read() -> None:
    r = parse_log_file(WILD / "ollama-5913-rocm-offload-43of81.log")
    assert r.engine == "llamacpp" and r.engine_evidence[0]["marker"] == "Ollama (runs llama.cpp)"
    assert (r.extra["offloaded_layers"], r.extra["n_ctx"]) == ("43/81", 2048)
    assert (r.extra["ollama_kv_gib"], r.extra["ollama_weights_gib"]) == (0.625, 39.9)
    assert [e.kind for e in r.fallbacks] == ["partial_gpu_offload"] and "layers.offload=43" in r.fallbacks[0].line


def test_ansi_colour_codes_are_stripped() -> None:
    raw = (WILD / "vllm-33297b-ansi-caret-second-run.log").read_text().splitlines()[0]
    line = make_line(1, raw)
    assert "^[[" not in line.text and line.level == "ERROR"
    assert make_line(1, raw.replace("^[", "\x1b")).text == line.text  # the bytes themselves, as a terminal gets them


def test_failed_starts_are_reported_with_their_figures() -> None:
    failed = [p for p in FILES if expected(p).get("startup_failed") is True]
    assert len(failed) == 6
    for p in failed:
        assert parse_log_file(p).extra["startup_failed"] is True, p.name
    r = parse_log_file(WILD / "club3090-4-free-memory-traceback.log")
    assert (r.extra["free_memory_gib"], r.extra["total_gpu_memory_gib"], r.extra["gpu_memory_utilization"],
            r.extra["requested_memory_gib"]) == (22.76, 24.0, 0.97, 23.28)


def test_sglang_sub_optimal_moe_lines_are_degraded_with_their_line() -> None:
    r = parse_log_file(WILD / "sglang-19003-h200-moe-down-triton-fallback.log")
    by = {e.kind: e for e in r.warnings}
    assert by["moe_config_other_triton_version"].line_no == 2 and "Fallback to triton version 3.2.0" in \
        by["moe_config_other_triton_version"].line
    assert by["moe_down_config_missing"].line_no == 1


def test_no_kernel_for_the_layer_is_a_failed_start() -> None:
    # filled in from vLLM's kernel chooser: raise ValueError("Failed to find a kernel that can implement the WNA16
    # linear layer. Reasons: \n" + "\n".join(failure_reasons)), each reason " {kernel} cannot implement due to: {why}"
    # (vllm/model_executor/kernels/linear/__init__.py, v0.24; the message as github.com/vllm-project/vllm/issues/23320
    # names it)
    from quantrack.engines.vllm import parse_vllm_log

    lines = [("(EngineCore_0 pid=24294) ValueError: Failed to find a kernel that can implement the WNA16 linear layer. "
             "Reasons: "),
             ("(EngineCore_0 pid=24294)  MacheteLinearKernel cannot implement due to: Machete requires compute "
             "capability of 90 (Hopper)")]
    r = parse_vllm_log("\n".join(lines))
    assert r.extra["startup_failed"] is True and r.extra["startup_failure"].startswith("no_kernel at line 1:")


def test_a_ggml_assert_before_the_server_listens_is_a_failed_start() -> None:
    # the CUDA out-of-memory lines of tests/data/wild3/llamacpp-20431-... (public), then an abort filled in from
    # ggml_abort's "%s:%d: GGML_ASSERT(%s) failed" (ggml/src/ggml.c); after "server is listening" it is not a start
    oom = (WILD / "llamacpp-20431-cuda0-alloc-failed.log").read_text().splitlines()[3:5]
    abort = "/src/llama.cpp/ggml/src/ggml-backend.cpp:1675: GGML_ASSERT(buf != NULL && \"tensor buffer not set\") failed"
    r = parse_llamacpp_log("\n".join([*oom, abort]))
    assert {e.kind for e in r.errors} >= {"cuda_malloc_failed", "ggml_assert"} and r.extra["startup_failed"] is True
    served = parse_llamacpp_log(f"main: server is listening on http://127.0.0.1:8080 - starting the main loop\n{abort}")
    assert [e.kind for e in served.errors] == ["ggml_assert_after_start"] and not served.extra["startup_failed"]


def test_figures_printed_in_kernel_and_scale_lines_are_read() -> None:
    # filled in from vLLM's logger.info("Using %s for %s", kernel_type.__name__, self.__class__.__name__)
    # (compressed_tensors_wNa16.py) and the KV-scale warning (quantization/kv_cache.py:L147-L152, vLLM 0.11+)
    from quantrack.engines.vllm import parse_vllm_log

    lines = [("(EngineCore pid=1) INFO 01-01 00:00:00 [compressed_tensors_wNa16.py:95] Using MarlinLinearKernel for "
             "CompressedTensorsWNA16"),
             ("(EngineCore pid=1) WARNING 01-01 00:00:05 [kv_cache.py:148] Using KV cache scaling factor 1.0 for "
             "fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the "
             "checkpoint.")]
    r = parse_vllm_log("\n".join(lines))
    assert (r.linear_kernel, r.quantization, r.kv_cache_dtype) == ("MarlinLinearKernel", "compressed-tensors",
                                                                    "fp8_e4m3")
    assert r.extra["derived"]["quantization"] == "the scheme in the kernel line (CompressedTensorsWNA16)"
