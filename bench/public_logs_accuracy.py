"""Parser accuracy and reconcile error on the public corpus (tests/data/public-logs/), as markdown tables.

    python bench/public_logs_accuracy.py            # the three tables
    python bench/public_logs_accuracy.py --summary  # the totals only (docs/benchmarks.md)

Table 1: for every excerpt, the engine detected with --engine auto (and the marker that decided it), how many of the
figures its sidecar states (``# expect:``) the parser read exactly, and the kernel-choice lines (fallbacks and degraded
paths) it flagged. A figure is *silently wrong* when the parser gives a value where the sidecar states another (or
none). Table 2: every excerpt of a start that failed (``"startup_failed": true`` in its sidecar): whether the parser
says so, and whether `logs reconcile` reports the failure instead of predicting a capacity. Table 3: `quantrack logs
reconcile` on the excerpts whose thread states the model and enough of the setup, with the settings listed (from the
sidecar), the KV-token and weight errors per rank, or the one-line refusal. Nothing here is fitted: the parser and
the capacity model are used as shipped.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LOGS = REPO / "tests" / "data" / "public-logs"
WILD3 = REPO / "tests" / "data" / "wild3"  # round three: expected figures in <name>.expect.json, written before parsing

# (excerpt, reconcile arguments from its sidecar's "settings stated" / "model" lines)
RECONCILE: list[tuple[str, list[str]]] = [
    ("vllm-10517-rtx3090-llama31-8b-20k.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "RTX 3090",
                                               "--max-num-batched-tokens", "20000", "--max-num-seqs", "256"]),
    ("vllm-10517-rtx3090-llama31-8b-29k.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "RTX 3090",
                                               "--max-num-batched-tokens", "29000", "--max-num-seqs", "256"]),
    ("vllm-10511-v0-profile-table-tp1.log", ["--model", "Llama-3-8B", "--arm", "bf16"]),
    ("vllm-10511-v0-profile-table-tp2.log", ["--model", "Llama-3-8B", "--arm", "bf16"]),
    ("vllm-13882-rtx4060-qwen25-7b-awq.log", ["--model", "Qwen2.5-7B", "--arm", "awq", "--context-len", "4096",
                                              "--max-num-batched-tokens", "4096", "--max-num-seqs", "256"]),
    ("vllm-12126-h100-llama32-11b-vision.log", ["--params", "10.6e9", "--layers", "40", "--kv-heads", "8",
                                                "--head-dim", "128", "--arm", "bf16", "--context-len", "65536",
                                                "--max-num-batched-tokens", "65536", "--max-num-seqs", "128"]),
    ("vllm-jimw-v064-turing-opt125m-xformers.log", ["--params", "125e6", "--layers", "12", "--kv-heads", "12",
                                                    "--head-dim", "64", "--max-num-batched-tokens", "2048",
                                                    "--max-num-seqs", "256"]),
    ("vllm-5248-2xt4-tp2-blocks.log", ["--params", "6.74e9", "--layers", "32", "--kv-heads", "32", "--head-dim",
                                       "128", "--arm", "fp16", "--gpu", "T4", "--tp", "2", "--context-len", "16384",
                                       "--max-num-batched-tokens", "16384", "--max-num-seqs", "256"]),
    ("vllm-13061-2x4090-tp2-maxlen.log", ["--params", "14.77e9", "--layers", "48", "--kv-heads", "8", "--head-dim",
                                          "128", "--arm", "bf16", "--gpu", "RTX 4090", "--tp", "2", "--util", "0.98",
                                          "--max-num-batched-tokens", "131072", "--max-num-seqs", "256"]),
    ("vllm-21348-4xh100-qwen3-235b-fp8.log", ["--params", "235e9", "--layers", "94", "--kv-heads", "4",
                                              "--head-dim", "128", "--arm", "fp8", "--gpu", "H100", "--tp", "4",
                                              "--util", "0.90", "--context-len", "40960"]),
    ("sglang-21348-4xh100-qwen3-235b-fp8.log", ["--params", "235e9", "--layers", "94", "--kv-heads", "4",
                                                "--head-dim", "128", "--arm", "fp8", "--gpu", "H100", "--tp", "4",
                                                "--util", "0.93", "--context-len", "40960"]),
    ("sglang-ktransformers1870-tp2-hybrid-gdn.log", ["--params", "35e9", "--layers", "40", "--kv-heads", "2",
                                                     "--head-dim", "256", "--arm", "bf16", "--gpu", "RTX 4090"]),
    ("vllm-32105-pp-kv-too-small.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "H100"]),
    ("vllm-lmcache1739-qwen3-14b.log", ["--params", "14.8e9", "--layers", "40", "--kv-heads", "8", "--head-dim",
                                        "128", "--arm", "bf16"]),
]


# failed starts whose engine sized the cache before refusing (a max model length it cannot hold): `logs reconcile`
# compares that cache only with --sized-before-failure
SIZED_BEFORE_FAILURE = ("vllm-10517-rtx3090-llama31-8b-29k.log", "vllm-13061-2x4090-tp2-maxlen.log",
                        "vllm-32105-pp-kv-too-small.log")
# degraded-path kinds (quantrack.report.audit.DEGRADED_KINDS): kernel-choice lines that are not a fallback
DEGRADED = ("kv_scale_uncalibrated", "q_scale_uncalibrated", "q_scale_missing", "moe_default_config",
            "w8a8_block_fp8_default_config", "custom_allreduce_disabled", "xformers_extensions_missing",
            "flash_attn_auto_disabled", "alloc_retried_without_pp", "moe_down_config_missing",
            "moe_config_other_triton_version")
# CPU-placement kinds (quantrack.report.audit.CPU_PLACEMENT_KINDS): weights, layers or the KV cache left on the CPU
CPU_PLACEMENT = ("partial_gpu_offload", "no_gpu_offload", "kv_cache_on_cpu", "tensors_overridden_to_cpu")


def _got(report: object, key: str) -> object:
    if key == "engine":
        return report.engine  # type: ignore[attr-defined]
    if key in ("errors", "fallbacks", "warnings"):
        return sorted({e.kind for e in getattr(report, key)})
    if key != "extra" and hasattr(report, key):
        return getattr(report, key)
    return report.extra.get(key)  # type: ignore[attr-defined]


def _expect(p: Path) -> tuple[dict, str]:
    meta = (p.parent / f"{p.name}.meta").read_text()
    want = json.loads(re.search(r"^# expect: (\{.*\})$", meta, re.MULTILINE).group(1))  # type: ignore[union-attr]
    return want, re.search(r"^# source: (\S+)", meta, re.MULTILINE).group(1)  # type: ignore[union-attr]


def _kernel_kinds(want: dict) -> set[str]:
    return set(want.get("fallbacks", [])) | {k for k in want.get("warnings", []) if k in DEGRADED}


def accuracy(totals: dict[str, int]) -> list[str]:
    from quantrack.engines import parse_log_file

    out = ["| excerpt | source | engine (auto) | decided by | figures read / stated | kernel lines flagged |",
           "|---|---|---|---|---|---|"]
    files = sorted(LOGS.glob("*.log"))
    for key in ("files", "engines_ok", "figures_ok", "figures", "wrong", "kernel_ok", "kernel"):
        totals.setdefault(key, 0)
    totals["files"] = len(files)
    for p in files:
        want, url = _expect(p)
        kern = _kernel_kinds(want)
        short = url.replace("https://github.com/", "")
        try:
            r = parse_log_file(p)
        except Exception as exc:  # noqa: BLE001 - a refusal is an answer; anything else is counted as not read
            refused = "refused" in want and want["refused"] in str(exc)
            totals["engines_ok"] += refused
            totals["figures_ok"] += refused
            totals["figures"] += 1
            out.append(f"| `{p.name}` | [{short}]({url}) | refused | - | {int(refused)} / 1 | - |")
            continue
        stated = {k: v for k, v in want.items() if k != "refused"}
        ok = wrong = 0
        for k, v in stated.items():
            have, norm = _got(r, k), (sorted(v) if isinstance(v, list) else v)
            if have == norm:
                ok += 1
            elif have not in (None, []) and k not in ("engine",):  # a value where the log states another, or none
                wrong += 1
        if "refused" in want:  # read as one run although it holds two: every figure of it is suspect
            wrong += 1
            stated["refused"] = want["refused"]
        flagged = {e.kind for e in r.fallbacks} | {e.kind for e in r.warnings if e.kind in DEGRADED}
        totals["engines_ok"] += r.engine == want["engine"]
        totals["figures_ok"] += ok
        totals["figures"] += len(stated)
        totals["wrong"] += wrong
        totals["kernel_ok"] += len(kern & flagged)
        totals["kernel"] += len(kern)
        ev = r.engine_evidence[0] if r.engine_evidence else {}
        out.append(f"| `{p.name}` | [{short}]({url}) | {r.engine} | {ev.get('marker', '-')} (line "
                   f"{ev.get('line_no', '-')}) | {ok} / {len(stated)}{f' ({wrong} wrong)' if wrong else ''} | "
                   f"{f'{len(kern & flagged)} / {len(kern)}' if kern else '-'} |")
    out.append(f"| **all {len(files)}** | | **{totals['engines_ok']} / {len(files)}** | | **{totals['figures_ok']} / "
               f"{totals['figures']}** ({totals['wrong']} silently wrong) | **{totals['kernel_ok']} / "
               f"{totals['kernel']}** |")
    return out


def failed_runs(totals: dict[str, int]) -> list[str]:
    """Every excerpt of a failed start: said by the parser, and reconcile reports it instead of a prediction."""
    from quantrack.engines import parse_log_file
    from quantrack.engines.reconcile import reconcile
    from quantrack.errors import QuantrackError

    out = ["| excerpt | failure the parser names | reconcile (Llama-3.1-8B, bf16, H100) |", "|---|---|---|"]
    for key in ("failed", "failed_said", "failed_predicted"):
        totals.setdefault(key, 0)
    for p in sorted(LOGS.glob("*.log")):
        want, _ = _expect(p)
        if want.get("startup_failed") is not True:
            continue
        totals["failed"] += 1
        r = parse_log_file(p)
        said = r.extra.get("startup_failure") if r.extra.get("startup_failed") else None
        totals["failed_said"] += bool(said)
        try:
            res = reconcile(p, "Llama-3.1-8B", gpu="H100", arm=_bf16())
            kv = next((x for x in res.rows if x.figure == "kv_cache_tokens"), None)
            answer = f"PREDICTED {kv.predicted if kv else '?'} tokens for a failed start"
            totals["failed_predicted"] += 1
        except QuantrackError as exc:
            answer = "refused: " + str(exc)[:110].replace("|", "/")
        out.append(f"| `{p.name}` | {(said or 'not said')[:90].replace('|', '/')} | {answer} |")
    out.append(f"| **{totals['failed']} failed starts** | **{totals['failed_said']} said** | "
               f"**{totals['failed_predicted']} predicted** |")
    return out


def _bf16() -> object:
    from quantrack.arms import parse_arm_spec

    return parse_arm_spec("bf16")


def reconcile_table() -> list[str]:
    from quantrack.arms import parse_arm_spec
    from quantrack.cli.logs import _shape
    from quantrack.engines.reconcile import reconcile
    from quantrack.errors import QuantrackError

    out = [("| excerpt | settings passed (from the sidecar) | KV tokens: predicted / log, error | weights GiB per rank: "
           "predicted / log, error | layout |"), "|---|---|---|---|---|"]
    for name, args in RECONCILE:
        opts: dict[str, str] = {}
        it = iter(args)
        for flag in it:
            opts[flag.lstrip("-").replace("-", "_")] = next(it)
        shape = _shape({k: opts.get(k) for k in ("model", "config", "gguf", "params", "layers", "kv_heads",
                                                  "head_dim")})
        kw = {k: (int(v) if k in ("tp", "context_len", "max_num_batched_tokens", "max_num_seqs") else float(v)
                  if k == "util" else v) for k, v in opts.items()
              if k in ("gpu", "util", "tp", "context_len", "max_num_batched_tokens", "max_num_seqs")}
        arm = parse_arm_spec(opts["arm"]) if "arm" in opts else None
        if name in SIZED_BEFORE_FAILURE:  # failed after sizing the cache: compared only when asked to
            kw["sized_before_failure"] = True  # type: ignore[assignment]
        try:
            res = reconcile(LOGS / name, shape, arm=arm, **kw)  # type: ignore[arg-type]
        except QuantrackError as exc:
            out.append(f"| `{name}` | `{' '.join(args)}` | refused: {exc} | | |")
            continue
        rows = {(r["figure"], r["scope"].split(" ")[0]): r for r in res.to_dict()["rows"]}

        def cell(key: tuple[str, str], rows: dict[tuple[str, str], dict] = rows) -> str:
            r = rows.get(key)
            if not r or r["log"] is None:
                return f"{r['predicted'] if r else '-'} / not in the log"
            err = "n/a (log 0)" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
            return f"{r['predicted']:,} / {r['log']:,}, {err}"

        kv_key = next(k for k in rows if k[0] == "kv_cache_tokens")
        layout = ", ".join(f"{k} {v}" for k, v in res.parallel.items())
        out.append(f"| `{name}` | `{' '.join(args)}` | {cell(kv_key)} | {cell(('weights_gib', 'per'))} | "
                   f"{layout}; arm from {res.arm_source} |")
    return out


def _wild3_got(r: object, key: str) -> object:
    kinds = {e.kind for e in r.fallbacks} | {e.kind for e in r.warnings}  # type: ignore[attr-defined]
    if key == "cpu_placement":
        return sorted(kinds & set(CPU_PLACEMENT))
    if key == "degraded":
        return sorted(kinds & set(DEGRADED))
    if key == "fallbacks":  # the fallbacks that are not a CPU placement (that is its own class)
        return sorted({e.kind for e in r.fallbacks} - set(CPU_PLACEMENT))  # type: ignore[attr-defined]
    if key == "tp_size_is":
        from quantrack.engines.reconcile import parallel_from_report

        tp = parallel_from_report(r).get("tp", {})  # type: ignore[arg-type]
        return "lower bound" if tp.get("bound") == "lower" else ("value" if tp else None)
    return _got(r, key)


def wild3(totals: dict[str, int]) -> list[str]:
    """Round three (tests/data/wild3/): per excerpt, the figures of its .expect.json read exactly, and the ones
    given wrong (a value where the file states another, or none), with the classes the issue names."""
    from quantrack.engines import parse_log_file

    out = ["| excerpt | source | engine (auto) | figures read / stated | wrong |", "|---|---|---|---|---|"]
    for key in ("w_files", "w_engines_ok", "w_figures_ok", "w_figures", "w_wrong", "w_failed", "w_failed_said",
                "w_flag", "w_flag_ok", "w_clean_wrong"):
        totals.setdefault(key, 0)
    for p in sorted(WILD3.glob("*.log")):
        want = json.loads((p.parent / f"{p.stem}.expect.json").read_text())
        url = re.search(r"^# source: (\S+)", (p.parent / f"{p.name}.meta").read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]
        totals["w_files"] += 1
        try:
            r = parse_log_file(p)
        except Exception as exc:  # noqa: BLE001 - not read: every stated figure is missed
            out.append(f"| `{p.name}` | {url} | error: {str(exc)[:60]} | 0 / {len(want)} | |")
            totals["w_figures"] += len(want)
            continue
        ok, wrong = 0, []
        for k, v in want.items():
            have = _wild3_got(r, k)
            norm = sorted(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v
            if k == "startup_failed" and v is None:
                have = have or None
            if have == norm:
                ok += 1
            elif k != "engine" and not (have in (None, [], {}) and norm not in (None, [], {})):
                wrong.append(k)  # a value where the file states another (or states none)
        totals["w_engines_ok"] += r.engine == want["engine"]
        totals["w_figures_ok"] += ok
        totals["w_figures"] += len(want)
        totals["w_wrong"] += len(wrong)
        if want.get("startup_failed") is True:
            totals["w_failed"] += 1
            totals["w_failed_said"] += bool(r.extra.get("startup_failed"))
        for k in ("cpu_placement", "degraded"):
            if want.get(k):
                totals["w_flag"] += len(want[k])
                totals["w_flag_ok"] += len(set(want[k]) & set(_wild3_got(r, k)))  # type: ignore[arg-type]
        if want.get("cpu_placement") and not _wild3_got(r, "cpu_placement") and not r.fallbacks:
            totals["w_clean_wrong"] += 1  # a CPU placement read as a clean node
        out.append(f"| `{p.name}` | {url} | {r.engine} | {ok} / {len(want)} | {', '.join(wrong) or '-'} |")
    return out


def wild3_summary(t: dict[str, int]) -> str:
    return (f"wild3 excerpts: {t['w_files']}; engine detected: {t['w_engines_ok']} / {t['w_files']}; figures read "
            f"exactly: {t['w_figures_ok']} / {t['w_figures']}; silently wrong: {t['w_wrong']}; CPU-placement + "
            f"degraded lines flagged: {t['w_flag_ok']} / {t['w_flag']}; CPU placements read as clean: "
            f"{t['w_clean_wrong']}; failed starts said: {t['w_failed_said']} / {t['w_failed']}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    totals: dict[str, int] = {}
    table1 = accuracy(totals)
    table2 = failed_runs(totals)
    table4 = wild3(totals)
    if "--summary" in args:
        print(wild3_summary(totals))
        print(f"excerpts: {totals['files']}; engine detected: {totals['engines_ok']} / {totals['files']}; figures read "
              f"exactly: {totals['figures_ok']} / {totals['figures']}; silently wrong: {totals['wrong']}; kernel-choice "
              f"lines flagged (fallback + degraded): {totals['kernel_ok']} / {totals['kernel']}; failed starts said: "
              f"{totals['failed_said']} / {totals['failed']}; capacities predicted for a failed start: "
              f"{totals['failed_predicted']}")
        return 0
    print("\n".join(table1))
    print()
    print("\n".join(table2))
    print()
    print("\n".join(reconcile_table()))
    print()
    print("\n".join(table4))
    print(wild3_summary(totals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
