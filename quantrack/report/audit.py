"""Fleet audit: which nodes silently fell back to a slower kernel (pure; no mlflow here).

Per node (one tracked run, or one raw startup log): GPU and compute capability, MIG, engine version,
requested quantization, the effective kernel the log names, fallback yes/no with the evidence line,
capacity deviation from the prediction, and batch-1 TPOT against the median of the FINISHED runs with the
same GPU, engine and arm (a FAILED or rejected run is shown with its status and kept out of the medians).
Fallbacks are what the engine adapters' log parsers report (``LogReport.fallbacks``), e.g.
vLLM/SGLang's "Your GPU does not have native support for FP8 computation ... Marlin kernel" warning
(engine-facts.md §2.1), looked for with every engine's catalogue whatever engine the log reads as.

Never a guessed "clean": a node is "no fallback" only when its log was read (engine recognised, the log reaches the
weight loading where fallbacks are printed, the requested quantization is named). Otherwise its fallback is
``unknown`` with the reason (a tracked run without a fallback tag, a log whose engine is unclear, a log cut before
loading, a binary or empty file). Exit codes of ``quantrack audit``: 4 when any node fell back; else 5 when any node
is unknown; 0 only when every node was read and none fell back. Degraded modes that are not a slower kernel (FP8 KV
with uncalibrated scales of 1.0) are listed per node, outside the exit code.

Node facts: when the store has the ``quantrack-node-facts`` experiment (``quantrack probe --track``), each
node's newest FP8 probe verdict (native | none) is shown beside its runs, and a node whose probe found no
native FP8 while an arm there requested FP8 W8A8 gets a warning line: evidence to look at, not a fallback
(the exit code stays that of the logs).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.errors import BadInput, QuantrackError, did_you_mean
from quantrack.report.armrun import ArmRun, ProbeFact, as_arm_runs, probe_fact
from quantrack.run.schema import ContentionState, FallbackState, Param, Role, RunStatus

if TYPE_CHECKING:
    from quantrack.engines.base import LogReport
    from quantrack.store.records import RunRow

FORMATS = ("table", "json")
EXIT_FALLBACK = 4
EXIT_UNKNOWN = 5
# warnings that mean "running in a degraded mode", listed by audit beside the fallbacks (not in the exit code): the
# kernel or path asked for runs, in a slower or less accurate mode (uncalibrated scales, untuned Triton configs for
# this GPU, all-reduce through NCCL, xformers without its extensions, flash attention resolved off by "auto", a
# compute buffer re-allocated without pipeline parallelism). A fallback is another, slower kernel put in the place of
# the one asked for (Marlin for FP8 W8A8, xformers for FlashAttention, weights left on the CPU).
DEGRADED_KINDS = ("kv_scale_uncalibrated", "q_scale_uncalibrated", "q_scale_missing", "moe_default_config",
                  "w8a8_block_fp8_default_config", "custom_allreduce_disabled", "xformers_extensions_missing",
                  "flash_attn_auto_disabled", "alloc_retried_without_pp", "moe_down_config_missing",
                  "moe_config_other_triton_version")
# CPU placement: part of the model or its KV cache runs from host memory on a GPU node (layers not offloaded, expert
# tensors overridden to the CPU, a KV cache in a CPU buffer): a class of its own beside fallback and degraded, and
# the largest silent slowdown of all; it counts in the exit code like a fallback (4)
CPU_PLACEMENT_KINDS = ("partial_gpu_offload", "no_gpu_offload", "tensors_overridden_to_cpu", "kv_cache_on_cpu")
FAILED = "FAILED"
NA = "n/a"
NO_PROBE = "—"
FINISHED = RunStatus.FINISHED
# --quantization values that ask the engine for FP8 weights *and* activations (W8A8); on a GPU without
# native FP8 the engines fall back to weight-only FP8 (Marlin), engine-facts.md §2.1
FP8_W8A8_QUANT = ("fp8", "fp8_w8a8", "w8a8_fp8", "fbgemm_fp8")


@dataclass
class AuditRow:
    node: str  # hostname, or the log file's name
    source: str  # run id or log path
    arm: str | None
    gpu: str | None
    compute_capability: str | None
    mig: str | None
    engine: str | None
    engine_version: str | None
    quantization: str | None  # requested
    effective_kernel: str | None  # from the log
    fallback: bool | None  # None: no log was parsed for this node
    fallback_kinds: str | None
    evidence: str | None  # "file:line: text" of the first fallback line
    capacity_error_pct: float | None  # derived: (reported - predicted) / predicted
    tpot_ms: float | None  # measured, batch-1 median
    tpot_vs_median_pct: float | None = None  # derived: against the median of same GPU + engine + arm
    group_size: int | None = None  # FINISHED runs in that GPU + engine + arm group
    status: str | None = None  # the run's status (FINISHED | FAILED | KILLED | rejected); None for a raw log
    weights: str | None = None  # requested weight format
    fp8_probe: str | None = None  # the node's newest FP8 probe verdict (native | none), None: no probe
    fp8_probe_run: str | None = None  # that probe's run id
    unknown_reason: str | None = None  # why fallback is None (the node could not be read)
    degraded: str | None = None  # degraded-mode kinds (FP8 KV scale 1.0 ...), with the first line in degraded_evidence
    degraded_evidence: str | None = None
    engine_evidence: str | None = None  # "line N: marker" that decided the engine of a raw log
    failure: str | None = None  # a raw log whose start failed: "kind at line N: text" (status FAILED)
    tpot_contention: str | None = None  # the latency step's contention reasons when it ran contended, else None
    tpot_median_contention: bool = False  # the median it is compared against includes a contended TPOT
    kv_scales: str | None = None  # quantrack.engines.kvplan.ScaleSource value the engine's own lines showed
    kv_scale_evidence: str | None = None  # "file:line: text" (or the reason when the engine prints no line)
    cpu_placement: str | None = None  # CPU-placement kinds (CPU_PLACEMENT_KINDS), the first line in its evidence
    cpu_placement_evidence: str | None = None
    ray_node_id: str | None = None  # the Ray node a fleet job ran on (param ray_node_id), None otherwise
    label: str = ""  # the name shown: ``node``, made distinct where runs share a hostname (label_nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def shown(self) -> str:
        return self.label or self.node

    @property
    def who(self) -> str:
        """The node and, for a tracked run, the arm it ran: what a finding line under the table is about."""
        if self.arm is None:
            return self.shown
        return f"{self.shown} arm {self.arm}" + (f" ({self.engine})" if self.engine else "")


@dataclass
class AuditReport:
    rows: list[AuditRow]
    warnings: list[str] = field(default_factory=list)
    probes: dict[str, dict[str, str | None]] = field(default_factory=dict)  # node -> newest FP8 probe
    node_notes: list[str] = field(default_factory=list)  # how rows sharing a hostname are named (label_nodes)

    @property
    def fell_back(self) -> list[AuditRow]:
        return [r for r in self.rows if r.fallback]

    @property
    def on_cpu(self) -> list[AuditRow]:
        return [r for r in self.rows if r.cpu_placement]

    @property
    def unknown(self) -> list[AuditRow]:
        return [r for r in self.rows if r.fallback is None and not r.cpu_placement]

    @property
    def exit_code(self) -> int:
        return EXIT_FALLBACK if self.fell_back or self.on_cpu else EXIT_UNKNOWN if self.unknown else 0


def rows_from_runs(runs: Iterable[RunRow | ArmRun]) -> list[AuditRow]:
    out = []
    for r in as_arm_runs(runs):
        cfg, fb = r.config, r.fallback
        reason = None
        if fb.state is None:
            reason = "the run has no fallback tag (no startup log was parsed for it)"
        elif fb.state not in (FallbackState.YES, FallbackState.NO):
            reason = fb.reason or f"the run's fallback tag says {fb.state!r}"
        out.append(AuditRow(
            node=cfg.hostname or r.row.run_name, source=r.run_id, arm=r.arm,
            gpu=cfg.gpu_name or cfg.gpu_catalog, compute_capability=cfg.compute_capability,
            mig=cfg.mig, engine=cfg.engine, engine_version=cfg.engine_version,
            quantization=_requested_quantization(r), effective_kernel=r.effective_kernel,
            fallback=None if fb.state not in (FallbackState.YES, FallbackState.NO) else fb.fell_back,
            fallback_kinds=fb.kinds, evidence=fb.evidence, capacity_error_pct=r.capacity_error_pct,
            tpot_ms=r.tpot_ms_p50, status=_run_status(r), weights=cfg.weights, unknown_reason=reason,
            tpot_contention=_latency_contention(r),
            kv_scales=r.kv_scale_source, kv_scale_evidence=r.kv_scale_evidence,
            ray_node_id=r.row.params.get(Param.RAY_NODE_ID) or None,
        ))
        from quantrack.hardware.rulebook import fallback_gate, gpu_vendor_cc, parse_cc

        row = out[-1]
        vendor, catalog_cc = gpu_vendor_cc(row.gpu)
        if vendor in (None, "nvidia"):  # the FP8 gates held are NVIDIA's (AMD: rule fp8-on-amd)
            cc = parse_cc(cfg.compute_capability) or catalog_cc
            apply_gate(row, fallback_gate(cfg.engine, quantization=row.quantization, weights=cfg.weights,
                                          kernel=row.effective_kernel, cc=cc, gpu=row.gpu,
                                          engine_version=cfg.engine_version), r.run_id)
    return out


def apply_gate(row: AuditRow, gate: Any, where: str) -> None:
    """Read the rulebook's FP8 gate into a row whose log printed no fallback line (``hardware.rulebook.fallback_gate``):
    a GPU below SM89 makes it a fallback (the rule is the evidence); an FP8 node on a GPU nobody named, with no
    native-kernel line, is unknown, not clean. A failed start stays as it is (it served nothing)."""
    if gate is None or row.fallback is True or row.failure:
        return
    if gate.state == "yes":
        row.fallback = True
        row.fallback_kinds = gate.kind
        row.evidence = f"{where}: rule {gate.rule}: {gate.reason}"
        row.unknown_reason = None
    elif row.fallback is False:
        row.fallback = None
        row.unknown_reason = gate.reason


def label_nodes(rows: list[AuditRow]) -> list[str]:
    """Name each run's node so that two rows never read as the same node by accident: a hostname that several runs
    share (every host here is ``vm``) gets the Ray node id the run recorded (``vm@ray:1a2b3c4d``: one machine), else
    the run id's first 8 characters (``vm/0b5ab369``: the runs record no machine id, so whether they ran on one
    machine is not known). Returns one note per shared hostname, saying so."""
    by_host: dict[str, list[AuditRow]] = defaultdict(list)
    for r in rows:
        r.label = r.node
        if r.arm is not None:  # raw log rows are named by file
            by_host[r.node].append(r)
    notes = []
    for host, members in sorted(by_host.items()):
        if len(members) < 2:
            continue
        ray = {r.ray_node_id for r in members}
        if None not in ray and len(ray) == 1:
            continue  # one Ray node: the same machine, the hostname names it
        ids = [r.source for r in members if not r.ray_node_id]
        n = next((k for k in range(8, max(map(len, ids), default=8)) if len({i[:k] for i in ids}) == len(set(ids))),
                 max(map(len, ids), default=8))  # a prefix long enough to tell these runs apart
        for r in members:
            r.label = f"{host}@ray:{r.ray_node_id[:8]}" if r.ray_node_id else f"{host}/{r.source[:n]}"
        untold = sum(1 for r in members if not r.ray_node_id)
        how = (f"each named {host}/<run id prefix>" if untold == len(members) else
               f"named {host}@ray:<Ray node id> where the run recorded one"
               + (f", else {host}/<run id prefix>" if untold else ""))
        why = ""
        if untold:
            who = "these runs record" if untold == len(members) else f"{untold} of them record"
            why = (f" ({who} no machine id beyond the hostname, "
                   "so whether they ran on one machine is not known"
                   + ("; the FP8 probe column matches nodes by hostname" if any(r.fp8_probe for r in members) else "")
                   + ")")
        notes.append(f"hostname {host!r} is shared by {len(members)} runs: {how}{why}.")
    return notes


def _latency_contention(r: ArmRun) -> str | None:
    """The reasons the run's latency step was flagged under contention (quantrack.measure.hygiene's tags)."""
    c = r.contention_of("latency")
    return (c.reasons or "contended") if c.state == ContentionState.YES else None


def _requested_quantization(r: ArmRun) -> str | None:
    """The quantization the run asked for. An engine that serves one GGUF file (llama.cpp) has no --quantization
    (the run's param says "none"): its quantization is the file's GGUF type, the run's ``weights`` (q8_0 -> Q8_0),
    else the file type its log printed."""
    quant = r.config.quantization
    engine = r.config.engine
    if engine and quant in (None, "none"):
        from quantrack.engines import get_adapter

        try:
            gguf = get_adapter(engine).serving.local_file
        except QuantrackError:  # an engine this quantrack does not know: its param as logged
            gguf = False
        if gguf:
            weights = r.config.weights
            return weights.upper() if weights else r.log_quantization or quant
    return quant


def _run_status(r: ArmRun) -> str:
    # the stored status, or "rejected" (as the audit has always shown it)
    return RunStatus.REJECTED if r.status == RunStatus.REJECTED else r.stored_status


def probes_by_node(facts: Iterable[RunRow]) -> dict[str, dict[str, str | None]]:
    """The newest FP8 probe run per node (``quantrack probe --track``: ``NodeFact``'s names)."""
    newest: dict[str, ProbeFact] = {}
    for f in facts:
        pr = probe_fact(f)
        if pr is None or not pr.hostname or not pr.finished:
            continue
        if pr.hostname not in newest or pr.start_time > newest[pr.hostname].start_time:
            newest[pr.hostname] = pr
    return {h: {"verdict": p.verdict, "run_id": p.run_id, "gpu": p.gpu_name} for h, p in newest.items()}


def requests_fp8_w8a8(row: AuditRow) -> bool:
    return (row.quantization or "").lower() in FP8_W8A8_QUANT and (row.weights or "fp8").lower() == "fp8"


def apply_probes(rows: list[AuditRow], probes: dict[str, dict[str, str | None]]) -> list[str]:
    """Set each row's FP8 probe verdict; warn for a node without native FP8 that ran an FP8 W8A8 arm."""
    warnings = []
    for r in rows:
        pr = probes.get(r.node)
        if pr is None or r.arm is None:  # raw log rows are named by file, not by node
            continue
        r.fp8_probe, r.fp8_probe_run = pr.get("verdict"), pr.get("run_id")
        if r.fp8_probe == "none" and requests_fp8_w8a8(r):
            fb = "it fell back" if r.fallback else ("no fallback in its log" if r.fallback is False
                                                      else "no log parsed")
            warnings.append(f"WARNING {r.node}: FP8 probe (run {r.fp8_probe_run}) found no native FP8 on "
                            f"{pr.get('gpu') or r.gpu or 'its GPU'}, but arm {r.arm} (run {r.source}) requested "
                            f"FP8 W8A8 (quantization {r.quantization}); {fb}. Evidence only.")
        elif r.fp8_probe == "native" and r.fallback:
            warnings.append(f"NOTE {r.node}: arm {r.arm} (run {r.source}) fell back although the node's FP8 probe "
                            f"(run {r.fp8_probe_run}) measured native FP8: the kernel choice was forced or "
                            "software-side (engine flags/env), not the GPU.")
    return warnings


def log_verdict(report: LogReport) -> tuple[bool | None, str | None]:
    """(fell back, why unknown) for one parsed log: True when any catalogue found a fallback line; False only when
    the log was read far enough to have printed one; None with the reason otherwise."""
    if any(e.kind not in CPU_PLACEMENT_KINDS for e in report.fallbacks):
        return True, None
    if report.engine is None:
        det = report.detection or {}
        return None, f"engine not recognised ({det.get('reason') or report.extra.get('detected') or 'no markers'})"
    from quantrack.engines import get_adapter
    from quantrack.engines.runcheck import failure_phase, startup_failure

    # figures printed only once the weights are on the device (where fallback lines are printed); a banner, server
    # args or llama.cpp's print_info (the GGUF header) come before it and do not count
    loaded = get_adapter(report.engine).loaded(report)
    fatal = startup_failure(report)
    if fatal is not None:  # a start that failed serves nothing: never "no fallback", whatever was printed before
        where = f"{fatal.kind} at line {fatal.line_no}"
        phase = failure_phase(fatal, report, loaded)
        if phase == "before load":
            return None, f"the engine failed before loading the weights ({where}): no fallback could be printed yet"
        if phase == "after load":
            return None, (f"the engine failed after loading the weights, sizing the KV cache or the context ({where}); "
                          "no fallback line in the log")
        return None, (f"the engine failed at startup ({where}); the log does not show whether the weights were "
                      "loaded; no fallback line in it")
    if not loaded:
        return None, ("the log has no line printed once the weights are loaded (no weight, KV or block figure), "
                      "where fallbacks are printed: it stops before them or is an excerpt without them")
    if report.quantization is None:
        return None, "the log names no quantization (no engine banner / server_args / GGUF file type)"
    return False, None


def rows_from_logs(paths: Iterable[Path], gpu: str | None = None) -> list[AuditRow]:
    """Parse raw startup logs with the engine adapters (engine detected from the text, every engine's fallback
    catalogue searched). A file that cannot be read as a log is a row with fallback unknown and the reason.
    ``gpu`` (a catalog name): the GPU the logs ran on, for logs that do not name it (the FP8 gate needs it)."""
    from quantrack.engines import parse_log_file
    from quantrack.hardware.rulebook import report_gate

    out = []
    for path in paths:
        try:
            rep = parse_log_file(path)
        except BadInput as exc:
            out.append(AuditRow(node=path.name, source=str(path), arm=None, gpu=None, compute_capability=None,
                                mig=None, engine=None, engine_version=None, quantization=None, effective_kernel=None,
                                fallback=None, fallback_kinds=None, evidence=None, capacity_error_pct=None,
                                tpot_ms=None, unknown_reason=str(exc).removeprefix(f"{path}: ")))
            continue
        fbs = [e for e in rep.fallbacks if e.kind not in CPU_PLACEMENT_KINDS]
        placed = sorted((e for e in [*rep.fallbacks, *rep.warnings] if e.kind in CPU_PLACEMENT_KINDS),
                        key=lambda e: e.line_no)
        evidence = f"{path.name}:{fbs[0].line_no}: {fbs[0].line.strip()}" if fbs else None
        fell, why = log_verdict(rep)
        degraded = [e for e in rep.warnings if e.kind in DEGRADED_KINDS]
        ev = rep.engine_evidence[0] if rep.engine_evidence else None
        failure = rep.extra.get("startup_failure") if rep.extra.get("startup_failed") else None
        out.append(AuditRow(
            node=path.name, source=str(path), arm=None, gpu=rep.gpu or gpu,
            compute_capability=rep.extra.get("compute_capability"), mig=None,
            engine=rep.engine, engine_version=rep.engine_version, quantization=rep.quantization,
            effective_kernel=rep.linear_kernel, fallback=fell,
            fallback_kinds=",".join(sorted({e.kind for e in fbs})) or None, evidence=evidence,
            capacity_error_pct=None, tpot_ms=None, unknown_reason=why,
            degraded=",".join(sorted({e.kind for e in degraded})) or None,
            degraded_evidence=f"{path.name}:{degraded[0].line_no}: {degraded[0].line.strip()}" if degraded else None,
            engine_evidence=f"line {ev['line_no']}: {ev['marker']}" if ev and ev.get("line_no") else None,
            status=FAILED if failure else None, failure=failure,
            kv_scales=_kv_scale_fields(path.name, rep.kv_scales)[0],
            kv_scale_evidence=_kv_scale_fields(path.name, rep.kv_scales)[1],
            cpu_placement=",".join(sorted({e.kind for e in placed})) or None,
            cpu_placement_evidence=f"{path.name}:{placed[0].line_no}: {placed[0].line.strip()}" if placed else None,
        ))
        apply_gate(out[-1], report_gate(rep, gpu), path.name)
    return out


def _kv_scale_fields(name: str, kv: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """(source, "file:line: text" or the reason) of a parsed log's KV-scale observation."""
    if not kv:
        return None, None
    ev = (kv.get("evidence") or [None])[0]
    return kv.get("source"), f"{name}:{ev['line_no']}: {ev['line'].strip()}" if ev else kv.get("reason")


def log_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise BadInput(f"--logs {str(directory)!r}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == ".log")
    if not files:
        raise BadInput(f"--logs {str(directory)!r}: no *.log files")
    return files


def add_tpot_deviation(rows: list[AuditRow]) -> None:
    """TPOT of each node against the median TPOT of the FINISHED runs with the same GPU, engine and arm
    (derived). A FAILED, rejected or still running run is neither measured against nor part of a median."""
    from quantrack.measure.stats import median

    groups: dict[tuple[str | None, str | None, str | None], list[AuditRow]] = defaultdict(list)
    for r in rows:
        if r.tpot_ms is not None and r.status in (None, FINISHED):
            groups[(r.gpu, r.engine, r.arm)].append(r)
    for members in groups.values():
        med = median([r.tpot_ms for r in members if r.tpot_ms is not None])
        mixed = any(r.tpot_contention for r in members)
        for r in members:
            r.group_size = len(members)
            r.tpot_median_contention = mixed
            if med and r.tpot_ms is not None:
                r.tpot_vs_median_pct = (r.tpot_ms - med) / med * 100.0


def build_audit(runs: Iterable[RunRow | ArmRun] = (), log_dirs: Iterable[Path] = (),
                node_facts: Iterable[RunRow] = (), gpu: str | None = None) -> AuditReport:
    rows = rows_from_runs(runs)
    for d in log_dirs:
        rows += rows_from_logs(log_files(d), gpu)
    add_tpot_deviation(rows)
    probes = probes_by_node(node_facts)
    warnings = apply_probes(rows, probes)
    return AuditReport(rows=rows, warnings=warnings, probes=probes, node_notes=label_nodes(rows))


def load_node_facts(uri: str | None) -> list[RunRow]:
    """The node-fact runs of the store, or none when it has no such experiment."""
    from quantrack.errors import NotFound
    from quantrack.store.tracking import NODE_FACTS_EXPERIMENT, load_runs

    try:
        return load_runs(NODE_FACTS_EXPERIMENT, uri, role=Role.NODE_FACT)
    except NotFound:
        return []


def audit(experiments: Iterable[str] = (), log_dirs: Iterable[str | Path] = (), uri: str | None = None,
          gpu: str | None = None) -> AuditReport:
    """Audit tracked runs of the experiments and/or raw log directories (``gpu``: the raw logs' GPU, a catalog
    name, for logs that do not name theirs)."""
    exps, dirs = list(experiments), [Path(d) for d in log_dirs]
    if not exps and not dirs:
        raise BadInput("nothing to audit: pass --experiment NAME and/or --logs DIR")
    if gpu is not None:
        if not dirs:
            raise BadInput("--gpu names the GPU of raw logs: give --logs DIR (tracked runs carry their own GPU)")
        from quantrack.hardware.catalog import get_gpu

        gpu = get_gpu(gpu).name  # an unknown name: one line with the catalog's names
    runs: list[RunRow] = []
    facts: list[RunRow] = []
    if exps:
        from quantrack.store.tracking import load_runs

        for e in exps:
            runs += load_runs(e, uri)
        facts = load_node_facts(uri)
    return build_audit(runs, dirs, facts, gpu)


def _cell(v: Any) -> str:
    if v is None:
        return NA
    if isinstance(v, bool):
        return "YES" if v else "no"
    return str(v)


def _pct(v: float | None) -> str:
    return NA if v is None else f"{v:+.1f}%"


def _node_lines(report: AuditReport) -> list[str]:
    """One line per finding under the table: fallbacks, unknowns, degraded paths, failed starts, contention, KV
    scales."""
    lines: list[str] = []
    for r in report.fell_back:
        lines.append(f"FALLBACK {r.who}: {r.evidence or 'no evidence line recorded'}")
    for r in report.on_cpu:
        lines.append(f"CPU-PLACEMENT {r.who}: {r.cpu_placement} ({r.cpu_placement_evidence or 'no line recorded'})")
    for r in report.unknown:
        lines.append(f"UNKNOWN {r.who}: {r.unknown_reason or 'not read'}")
    for r in report.rows:
        if r.degraded:
            lines.append(f"DEGRADED {r.who}: {r.degraded_evidence or r.degraded}")
    for r in report.rows:
        if r.failure:
            lines.append(f"FAILED {r.who}: the start failed ({r.failure})")
        if r.tpot_contention:
            lines.append(f"⚠ CONTENTION {r.who}: TPOT measured under contention ({r.tpot_contention}); its TPOT and "
                         "every TPOT vs median of its group are not a property of the node")
    for r in report.rows:  # quantized KV caches: which scales the engine used (quantrack.engines.kvscale)
        if r.kv_scales and r.kv_scales != "not-quantized":
            lines.append(f"KV SCALES {r.who}: {r.kv_scales} ({r.kv_scale_evidence or 'no line recorded'})")
    return lines


def render(report: AuditReport, fmt: str = "table") -> str:
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}; formats: {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps({"nodes": [r.to_dict() for r in report.rows],
                           "fell_back": [r.node for r in report.fell_back],
                           "unknown": {r.node: r.unknown_reason for r in report.unknown},
                           "failed": {r.node: r.failure for r in report.rows if r.failure},
                           "cpu_placement": {r.node: r.cpu_placement_evidence for r in report.on_cpu},
                           "exit_code": report.exit_code,
                           "warnings": report.warnings, "fp8_probes": report.probes,
                           "node_notes": report.node_notes,
                           "labels": {"capacity_error_pct": "derived", "tpot_ms": "measured",
                                      "tpot_vs_median_pct": "derived (FINISHED runs, same GPU + engine + arm)",
                                      "tpot_contention": "measured (host contention during the latency step)",
                                      "fallback": "measured (engine log)",
                                      "fp8_probe": "measured (quantrack probe --track)"}},
                          indent=2) + "\n"
    from tabulate import tabulate  # type: ignore[import-untyped]

    headers = ["Node", "Arm", "GPU", "CC", "MIG", "Engine", "Quant.", "Effective kernel", "Fallback",
               "FP8 probe", "Cap. error", "TPOT", "TPOT vs median", "Status"]
    body = []
    for r in report.rows:
        fb = _cell(r.fallback) if r.fallback is not None else "UNKNOWN"
        if r.fallback and r.fallback_kinds:
            fb = f"YES ({r.fallback_kinds})"
        if r.cpu_placement:
            fb = ("" if r.fallback is None else fb + " ") + f"+cpu-placement ({r.cpu_placement})"
        if r.degraded:
            fb += f" +degraded ({r.degraded})"
        eng = f"{r.engine or NA} {r.engine_version or ''}".strip()
        if r.status not in (None, FINISHED):
            vs = f"excluded ({r.status})"
        else:
            vs = _pct(r.tpot_vs_median_pct) + (f" (of {r.group_size})" if r.group_size else "")
            if r.tpot_vs_median_pct is not None and (r.tpot_contention or r.tpot_median_contention):
                vs += " ⚠"
        tpot = NA if r.tpot_ms is None else f"{r.tpot_ms:.2f} ms" + (" ⚠" if r.tpot_contention else "")
        body.append([r.shown, _cell(r.arm), _cell(r.gpu), _cell(r.compute_capability), _cell(r.mig), eng,
                     _cell(r.quantization), _cell(r.effective_kernel), fb, r.fp8_probe or NO_PROBE,
                     _pct(r.capacity_error_pct), tpot, vs,
                     "log" if r.status is None else r.status])
    text = tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
    lines = [text, "", *report.node_notes, *_node_lines(report)]
    lines.extend(report.warnings)
    not_finished = sum(1 for r in report.rows if r.status not in (None, FINISHED) and not r.failure)
    n_unknown = len(report.unknown)
    lines.append(f"{len(report.fell_back)} of {len(report.rows)} node(s) fell back"
                 + (f"; {len(report.on_cpu)} node(s) run part of the model or its KV cache on the CPU"
                    if report.on_cpu else "")
                 + (" (exit 4)" if report.fell_back or report.on_cpu else "")
                 + (f"; {n_unknown} node(s) unknown: not read far enough to say"
                    + ("" if report.fell_back or report.on_cpu else " (exit 5)") if n_unknown else "")
                 + (f"; {not_finished} run(s) not FINISHED, kept out of the medians" if not_finished else "")
                 + ". Cap. error and TPOT vs median (same GPU + engine + arm) are derived; TPOT, fallback and "
                   "FP8 probe are measured (— = no probe of that node).")
    return "\n".join(lines) + "\n"


__all__ = [
    "CPU_PLACEMENT_KINDS",
    "DEGRADED_KINDS",
    "EXIT_FALLBACK",
    "EXIT_UNKNOWN",
    "AuditReport",
    "AuditRow",
    "apply_probes",
    "audit",
    "build_audit",
    "label_nodes",
    "load_node_facts",
    "log_verdict",
    "probes_by_node",
    "render",
]
