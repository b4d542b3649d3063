"""The patterns of issue #27 ("Logs from the wild, round two"), each on a real excerpt of tests/data/public-logs/.

Every log line here is one of those excerpts, copied verbatim from the public thread named in its ``.meta``; the one
exception is a vLLM "non-default args" line filled in from its format string (cited where it is used).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines import parse_log_file, parse_logs
from quantrack.engines.reconcile import establish_arm, reconcile
from quantrack.engines.runcheck import failure_phase, startup_failure
from quantrack.engines.vllm import parse_vllm_log
from quantrack.errors import BadInput
from quantrack.report.audit import build_audit

LOGS = Path(__file__).resolve().parents[1] / "data" / "public-logs"


def report(name: str):  # type: ignore[no-untyped-def]
    return parse_log_file(LOGS / name)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --- llama.cpp contexts: read from the log, else unknown (and reconcile asks for --context-len) -------------------
@pytest.mark.parametrize(("name", "context", "source"), [
    ("llamacpp-jamepeng89-cpu-ctx-4096.log", 4096, "n_ctx in the log"),
    ("llamacpp-1956-ggjt-2023-n-ctx-ftype.log", 512, "n_ctx in the log"),  # 2023: llama_model_load_internal
    ("llamacpp-lmstudio1454-cpu-kv-fa-auto-disabled.log", 16384, "the KV cache size line's cells in the log"),
    ("llamacpp-22319-dsv4-iswa-zero-non-swa.log", 393216, "the KV cache size line's cells in the log"),
    ("llamacpp-iklcpp259-mla-ckv-q8-slots.log", 32768, "the per-slot context x slots in the log"),
])
def test_llamacpp_context_is_read_from_the_log(name: str, context: int, source: str) -> None:
    r = report(name)
    assert (r.extra["context"], r.extra["context_source"]) == (context, source)


def test_llamacpp_context_not_in_the_log_is_unknown_and_reconcile_asks_for_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the 2024 two-GPU excerpt prints n_ctx; the 11-GPU ik_llama.cpp one prints KV buffers but no context line
    r = report("llamacpp-ollama6860-kv-self-compute-oom-dev4.log")
    assert r.extra["context"] is None
    assert r.extra["context_source"].startswith("unknown: the log states no context")
    assert "n_ctx_train is the model's training context, not the server's" in r.extra["context_source"]
    # a log with a context reconciles at it; the prediction is never made at the model's training context
    code, out, _ = run_cli(capsys, "logs", "reconcile", str(LOGS / "llamacpp-6122-old-kv-self-2gpu.log"), "--model",
                           "Llama-3.1-8B", "--arm", "weights=f16,kv=auto", "--format", "json")
    assert code == 0 and json.loads(out)["context_len"] == 4096
    # ...and without one, reconcile refuses and names the flag (one line, exit 2); with it, it predicts
    log = LOGS / "llamacpp-rocm79-print-info.log"
    assert report(log.name).extra["context"] is None
    code, out, err = run_cli(capsys, "logs", "reconcile", str(log), "--model", "Llama-3.1-8B", "--arm", "weights=q4_0,kv=auto")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("quantrack: error: cannot reconcile llamacpp-rocm79-print-info.log: context unknown: the log "
                          "states no context") and err.endswith("; pass --context-len\n")
    code, out, _ = run_cli(capsys, "logs", "reconcile", str(log), "--model", "Llama-3.1-8B", "--arm", "weights=q4_0,kv=auto",
                           "--context-len", "8192", "--format", "json")
    assert code == 0 and json.loads(out)["context_len"] == 8192


# --- which KV line is the cache --------------------------------------------------------------------------------
def test_per_device_kv_buffers_are_summed_and_the_choice_is_said() -> None:
    r = report("llamacpp-iklcpp749-11gpu-kv-buffers-compute-oom.log")
    assert r.extra["kv_mib"] == 1005.78 and r.extra["kv_buffer_devices"] == 11  # 379.23 + 82.44 + ... + 16.49
    assert r.extra["kv_mib_source"].startswith("sum of 11 per-device KV buffer(s) (CUDA0, CUDA1,")
    assert r.extra["kv_mib_source"].endswith("the KV self size line (MLA c^KV) (line 16) agrees (1005.79 MiB)")
    assert r.extra["mla_cache"] is True and r.kv_cache_dtype == "f16"


def test_when_the_buffers_seen_are_fewer_than_the_whole_cache_the_whole_cache_line_is_used_and_said() -> None:
    r = report("llamacpp-iklcpp235-kv-buffers-cut-context-failed.log")  # CUDA0..CUDA10's buffer lines are cut
    assert (r.extra["kv_mib"], r.extra["kv_buffer_devices"]) == (2196.0, 4)
    assert r.extra["kv_mib_source"] == ("KV self size line (MLA c^KV) (line 5): the per-device KV buffers in the log "
                                        "sum to 576.0 MiB, less than the whole cache, so some devices' buffer lines "
                                        "are not in it")


def test_an_mla_cache_line_is_read_as_the_cache_not_skipped() -> None:
    r = report("llamacpp-iklcpp259-mla-ckv-q8-slots.log")
    assert (r.extra["kv_mib"], r.kv_cache_dtype, r.available_kv_gib) == (1166.65, "q8_0", round(1166.65 / 1024, 4))


def test_a_zero_layer_size_line_is_not_the_cache() -> None:
    """DeepSeek V4's non-SWA half holds 0 layers (0.00 MiB): taking it would say the cache is empty."""
    r = report("llamacpp-22319-dsv4-iswa-zero-non-swa.log")
    assert r.extra.get("kv_mib") is None and r.available_kv_gib is None and r.kv_cache_tokens is None
    assert r.extra["kv_unknown_reason"].startswith("the only llama_kv_cache size line holds 0 layers")
    assert "kv_mib" in r.not_found or "available_kv_gib" in r.not_found


def test_half_an_iswa_cache_is_not_the_cache() -> None:
    r = report("llamacpp-ollama16480-rocm-gptoss-iswa-2seq.log")
    assert r.extra.get("kv_mib") is None and r.extra["kv_mib_non_swa"] == 9216.0
    assert r.extra["kv_unknown_reason"].startswith("iSWA cache: only the non-SWA half's lines are in the log")


# --- failed runs are not capacities ----------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "kind", "phase"), [
    ("vllm-10439-docker-no-cache-blocks.log", "no_kv_memory", "after load"),
    ("vllm-qanything302-v03-zero-gpu-blocks.log", "no_kv_memory", "after load"),  # "# GPU blocks: 0"
    ("vllm-13882-rtx4060-qwen25-7b-awq.log", "negative_kv_budget", "after load"),  # "reserved for KV Cache is -1.05GiB"
    ("vllm-16118-v1-kv-too-small-noestimate.log", "kv_cache_too_small", "after load"),  # each line quoted with "> "
    ("llamacpp-lcppython1944-kv-cache-init-failed.log", "cuda_malloc_failed", "after load"),
    ("vllm-17431-a800-enginecore-failed.log", "engine_core_failed", "unknown"),
    ("vllm-substratus37-t4-bf16-error.log", "bf16_unsupported_error", "before load"),
])
def test_a_failed_start_is_recorded_with_its_line(name: str, kind: str, phase: str) -> None:
    r = report(name)
    fatal = startup_failure(r)
    assert fatal is not None and fatal.kind == kind and r.extra["startup_failed"] is True
    assert r.extra["startup_failure"].startswith(f"{kind} at line {fatal.line_no}: ")
    lines = (LOGS / name).read_text().splitlines()
    assert fatal.line == lines[fatal.line_no - 1].strip()
    assert failure_phase(fatal, r) == phase


def test_reconcile_reports_the_failure_instead_of_a_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    log = LOGS / "vllm-16118-v1-kv-too-small-noestimate.log"  # "> ERROR ... ValueError: To serve at least one ..."
    code, out, err = run_cli(capsys, "logs", "reconcile", str(log), "--model", "Llama-3.1-8B", "--arm", "bf16",
                             "--gpu", "H100")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("quantrack: error: cannot reconcile vllm-16118-v1-kv-too-small-noestimate.log: the run failed "
                          "at startup (kv_cache_too_small at line 1: > ERROR 04-05 01:12:55 [core.py:390] ValueError:")
    assert "a start that failed has no capacity to compare" in err
    # a failure that sized nothing is refused even when asked to compare the sized cache
    with pytest.raises(BadInput, match=r"^--sized-before-failure: vllm-10439-docker-no-cache-blocks.log failed before "
                                       r"its KV cache was sized \(no_kv_memory at line 3"):
        reconcile(LOGS / "vllm-10439-docker-no-cache-blocks.log", "Llama-3.1-8B", gpu="H100",
                  sized_before_failure=True)
    with pytest.raises(BadInput, match=r"^--sized-before-failure: vllm-20707-v1-kv-922k-tokens.log shows no failed "
                                       r"start$"):
        reconcile(LOGS / "vllm-20707-v1-kv-922k-tokens.log", "Llama-3.1-8B", gpu="H200", sized_before_failure=True)


def test_a_recovered_allocation_is_not_a_failure() -> None:
    r = report("llamacpp-26297-alloc-retry-no-pp.log")
    assert r.errors == [] and r.extra["startup_failed"] is False
    assert r.extra["recovered_errors"] == ["cuda_malloc_failed@1", "error@2", "compute_buffer_alloc_failed@3"]
    assert [(w.kind, w.line_no) for w in r.warnings] == [("alloc_retried_without_pp", 4)]


# --- one log, one run ------------------------------------------------------------------------------------------
def test_two_launches_in_one_file_are_refused_in_parse_and_in_audit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "vllm-15617-two-launches-kv-too-small-then-oom.log"
    code, out, err = run_cli(capsys, "logs", "parse", str(LOGS / name))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == (f"quantrack: error: {LOGS / name}: holds 2 runs (a second startup failure at line 3 (oom), 51 min "
                   "after the one at line 1 (kv_cache_too_small)); split it into one file per run\n")
    shutil.copy(LOGS / name, tmp_path)
    row = build_audit(log_dirs=[tmp_path]).rows[0]
    assert row.fallback is None and row.unknown_reason == err.removeprefix(f"quantrack: error: {LOGS / name}: ")[:-1]


def test_data_parallel_engine_cores_are_one_run() -> None:
    r = report("vllm-19954-dp2-enginecores-kv.log")  # EngineCore_0 and EngineCore_1 print the same lines
    assert (r.extra["runs_in_file"], r.extra["engine_cores_seen"]) == (1, 2)


# --- SGLang parallel layouts, per SGLang's own rules -------------------------------------------------------------
@pytest.mark.parametrize(("name", "gpus", "attn_tp"), [
    ("sglang-4390-tp8-dp2-dp-attention-command.log", 8, 4),
    ("sglang-9359-tp4-dp4-dp-attention-gptoss-command.log", 4, 1),
])
def test_dp_attention_runs_on_tp_gpus_not_tp_times_dp(name: str, gpus: int, attn_tp: int) -> None:
    r = report(name)
    assert (r.extra["parallel_layout"], r.extra["gpus"], r.extra["attn_tp_size"]) == ("dp_attention", gpus, attn_tp)
    assert r.extra["gpus"] != r.extra["tp_size"] * r.extra["dp_size"]
    assert r.extra["layout_source"].startswith("sglang@v0.5.23:python/sglang/srt/managers/data_parallel_controller.py")


def test_rank_prefixes_alone_do_not_name_the_layout() -> None:
    r = report("sglang-5390-dp-attention-b200-default-config.log")  # "[... DP4 TP4]": DP attention or DP replicas
    assert r.extra["parallel_layout"] is None and "gpus" not in r.extra


# --- settings the log states -----------------------------------------------------------------------------------
def test_non_default_args_and_namespace_give_the_settings() -> None:
    r = report("vllm-club3090-612-nondefault-modelopt-fp8kv.log")
    assert (r.quantization, r.kv_cache_dtype, r.dtype) == ("modelopt", "fp8", "bf16")
    assert (r.extra["max_model_len"], r.extra["max_num_seqs"], r.extra["max_num_batched_tokens"]) == (131072, 1, 8192)
    # the argument alone does not say FP8 or NVFP4 (the banner would): no arm is established from it
    arm, why = establish_arm(r)
    assert arm is None and why.startswith("quantization 'modelopt' from the arguments line: a ModelOpt checkpoint is "
                                          "FP8 or NVFP4")
    ns = report("vllm-functionary128-args-namespace-v03.log")
    assert (ns.extra["tensor_parallel_size"], ns.extra["gpu_memory_utilization"], ns.extra["max_num_seqs"]) == (1, 0.9,
                                                                                                                 256)
    assert ns.quantization == "none" and ns.extra.get("max_model_len") is None  # max_model_len=None: not set


def test_a_new_kv_cache_dtype_is_kept_as_printed_and_refused_as_an_arm() -> None:
    # filled in from vLLM's format string logger.info("non-default args: %s", non_default_args)
    # (vllm 0.25.0: vllm/entrypoints/serve/utils/api_utils.py:L273); int8_per_token_head is a CacheDType of v0.33
    # (vllm@4ba787ec9:vllm/config/cache.py:L44-L66)
    line = ("(APIServer pid=1) INFO 07-06 22:50:34 [api_utils.py:273] non-default args: {'model': 'm', "
            "'kv_cache_dtype': 'int8_per_token_head', 'quantization': 'fp8'}")
    r = parse_vllm_log(line)
    assert r.kv_cache_dtype == "int8_per_token_head"
    arm, why = establish_arm(r)
    assert arm is None and why == "KV-cache dtype 'int8_per_token_head' is not one quantrack models"


def test_max_model_len_line_and_old_weight_lines() -> None:
    assert report("vllm-24162-nondefault-tp2-max-model-len.log").extra["max_model_len"] == 32768
    assert report("vllm-qwen3vl345-v0-weights-no-seconds.log").weights_gib == 17.7835  # "took 17.7835 GB" (V0)


def test_sycl_and_rocm_device_names() -> None:
    assert report("llamacpp-6036-sycl-a770-device-table.log").gpu == "Intel(R) Arc(TM) A770 Graphics"
    assert report("llamacpp-20338-sycl0-a770-fit.log").extra["device_free_mib"] == 15473
    rocm = report("llamacpp-rocm5901-windows-7900xtx-kvu.log")
    assert (rocm.gpu, rocm.extra["gpu_arch"], rocm.extra["n_parallel"]) == ("AMD Radeon RX 7900 XTX", "gfx1100", 4)


# --- kernel-choice and degraded-path warnings ------------------------------------------------------------------
@pytest.mark.parametrize(("name", "bucket", "kind"), [
    ("vllm-llamafactory5050-fa2-missing-xformers.log", "fallbacks", "attention_backend_fallback"),
    ("llamacpp-6787-h800-ngl90-offloaded-0.log", "fallbacks", "no_gpu_offload"),  # -ngl 90, 0/33 layers on the GPU
    ("vllm-17619-default-moe-config.log", "warnings", "moe_default_config"),
    ("sglang-5675-w8a8-block-fp8-default-config.log", "warnings", "w8a8_block_fp8_default_config"),
    ("vllm-15340-custom-allreduce-disabled-8gpu.log", "warnings", "custom_allreduce_disabled"),
    ("llamacpp-lmstudio1454-cpu-kv-fa-auto-disabled.log", "warnings", "flash_attn_auto_disabled"),
])
def test_kernel_choice_lines_are_flagged_with_their_line(name: str, bucket: str, kind: str) -> None:
    r = report(name)
    events = [e for e in getattr(r, bucket) if e.kind == kind]
    assert events
    lines = (LOGS / name).read_text().splitlines()
    assert events[0].line == lines[events[0].line_no - 1].strip()


def test_weights_left_on_the_cpu_show_in_the_buffers() -> None:
    r = report("llamacpp-6787-h800-ngl90-offloaded-0.log")
    assert r.extra["offloaded_layers"] == "0/33" and r.extra["model_buffers_mib"] == {"CPU": 5459.93}


# --- wrapped logs, and parse and audit agreeing ------------------------------------------------------------------
@pytest.mark.parametrize(("name", "figure", "value"), [
    ("vllm-14574-buildkite-prefixed-enginecore-exception.log", "weights_gib", 0.2389),  # "[time] " and "  | "
    ("vllm-rayserve65486-nested-prefixes-kv-memory.log", "available_kv_gib", 54.45),  # 4 nested process tags
    ("vllm-qanything302-v03-zero-gpu-blocks.log", "dtype", "bf16"),  # FastChat's "| ERROR | stderr |" beside vLLM
    ("vllm-6234-v0-indented-tp4-blocks.log", "weights_gib", 6.1138),  # indented by the thread
])
def test_wrapped_vllm_lines_are_read(name: str, figure: str, value: object) -> None:
    r = report(name)
    assert r.engine == "vllm" and getattr(r, figure) == value


def test_logs_parse_and_audit_never_disagree(tmp_path: Path) -> None:
    files = sorted(LOGS.glob("*.log"))
    for p in files:
        shutil.copy(p, tmp_path)
    rows = {r.node: r for r in build_audit(log_dirs=[tmp_path]).rows}
    for p in files:
        try:
            r = parse_logs([p])[0]
        except BadInput as exc:  # refused by parse: unknown in audit, with the same reason
            assert rows[p.name].fallback is None and str(exc).endswith(rows[p.name].unknown_reason or "?")
            continue
        row = rows[p.name]
        assert (row.engine, row.engine_version, row.quantization, row.gpu) == (r.engine, r.engine_version,
                                                                            r.quantization, r.gpu)
        from quantrack.report.audit import CPU_PLACEMENT_KINDS

        kernel = {e.kind for e in r.fallbacks} - set(CPU_PLACEMENT_KINDS)
        placed = {e.kind for e in (*r.fallbacks, *r.warnings)} & set(CPU_PLACEMENT_KINDS)
        assert row.fallback_kinds == (",".join(sorted(kernel)) or None)
        assert row.cpu_placement == (",".join(sorted(placed)) or None)
        assert (row.status == "FAILED") == bool(r.extra.get("startup_failed"))
        assert row.failure == (r.extra.get("startup_failure") if r.extra.get("startup_failed") else None)


def test_the_json_of_logs_parse_says_failure_runs_and_layout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "logs", "parse", str(LOGS / "vllm-17431-a800-enginecore-failed.log"),
                           str(LOGS / "sglang-4390-tp8-dp2-dp-attention-command.log"), "--format", "json")
    assert code == 0
    failed, layout = json.loads(out)
    assert failed["extra"]["startup_failed"] is True and failed["extra"]["runs_in_file"] == 1
    assert failed["extra"]["startup_failure"].startswith("engine_core_failed at line 2: ERROR 04-30 10:20:36")
    assert layout["extra"]["gpus"] == 8 and layout["extra"]["startup_failed"] is False


def test_sglang_02_load_weight_end_without_mem_usage_derives_the_weights() -> None:
    # filled in from SGLang 0.2.14's format strings (no public excerpt with them was found):
    # f"Load weight begin. avail mem={...:.2f} GB" and f"Load weight end. type={...}, dtype={self.dtype}, avail
    # mem={...:.2f} GB" (sglang@v0.2.14:python/sglang/srt/model_executor/model_runner.py:L157, L210-L215)
    from quantrack.engines.sglang import parse_sglang_log

    r = parse_sglang_log("[16:43:20 TP0] Load weight begin. avail mem=23.30 GB\n"
                         "[16:43:29 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, "
                         "avail mem=8.23 GB\n")
    assert r.weights_gib == 15.07 and r.extra["derived"]["weights_gib"].endswith("(TP0)")
    assert r.dtype == "fp16"
