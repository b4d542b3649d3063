"""Render a ``decision.DecisionReport``: one self-contained HTML page (figures embedded as base64 PNG, inline CSS,
no script, nothing fetched from the network) or Markdown with the PNGs written beside it.

Every table cell carries its label (measured / derived / imported / FILL IN) and, in its tooltip and in the
section's "Figures and sources" table, the metric or artifact and the MLflow run id it came from.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.report.decision import DecisionReport
from quantrack.report.judge import V_CANNOT, V_CLEAR, V_MISSES, ArmDecision, Verdict
from quantrack.report.labelled import Figure
from quantrack.report.recommend import Section
from quantrack.run.schema import Tag
from quantrack.store.files import refuse_link, special_target, write_atomic

FORMATS = ("html", "md")
_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1400px;color:#222;
line-height:1.4;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:36px}
h3{margin-top:24px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border:1px solid #ccc;padding:4px 6px;
vertical-align:top;text-align:left}th{background:#f3f3f3}
.k{font-size:9px;border-radius:3px;padding:0 2px;margin-left:2px;color:#fff;white-space:nowrap}
.measured{background:#2b7a3d}.derived{background:#2f5fa8}.imported{background:#8a5a00}.fill,.unknown{background:#b02a2a}
.v{font-weight:bold;white-space:nowrap;border-radius:3px;padding:1px 5px}
.v-cleared{background:#d9f2dd}.v-misses{background:#f8d4d4}.v-cannot{background:#fff1c6}.v-not{background:#e4e4e4}
.rec{background:#eef5ff;border-left:4px solid #2f5fa8;padding:8px 12px;margin:12px 0}
.slo{min-width:150px}.scroll{overflow-x:auto}
table.verdicts{width:100%;font-size:12px}table.verdicts td{overflow-wrap:anywhere;padding:3px 4px}
table.verdicts th{padding:3px 4px;font-size:11px}.warn{color:#8a4b00}.val{white-space:nowrap}.small{font-size:12px;color:#555}figure{margin:16px 0}figcaption{font-size:12px;color:#555;
max-width:640px}.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:8px}img{max-width:100%;border:1px solid #eee}ul{margin:4px 0}code{background:#f5f5f5;padding:0 3px}
"""


def _kind_class(kind: str) -> str:
    return {"measured": "measured", "derived": "derived", "imported": "imported"}.get(kind, "fill")


def _cell(f: Figure) -> str:
    tip = f"{f.kind}: {f.source}" + (f" (run {f.run_id})" if f.run_id else "")
    label = f.kind if f.value is not None else ("FILL IN" if f.kind == "FILL IN" else "unknown")
    if f.value is None and f.kind == "FILL IN" and f.show() == "FILL IN":
        return f'<span class="k fill" title="{html.escape(tip)}">FILL IN</span>'
    if f.value is None:
        return f'<span title="{html.escape(tip)}">{html.escape(f.show())}</span>'
    return (f'<span class="val" title="{html.escape(tip)}">{html.escape(f.show())}</span>'
            f'<span class="k {_kind_class(f.kind)}">{html.escape(label)}</span>')


def _verdict_class(v: Verdict) -> str:
    return {V_CLEAR: "v-cleared", V_MISSES: "v-misses", V_CANNOT: "v-cannot"}.get(v, "v-not")


_MARK = {"meets": "✓", "misses": "✗", "unknown": "?"}


def _slo_text(a: ArmDecision) -> list[str]:
    out = []
    for k in a.slo_checks:
        out.append(f"{_MARK.get(k.status, '?')} {k.slo.name} {k.value.show()} (≤ {k.slo.limit_ms:g} ms @c"
                   f"{k.slo.concurrency}); goodput " + (f"c{k.goodput_c}" if k.goodput_c is not None else "none"))
    return out


def _distinguish(a: ArmDecision) -> str:
    if a.baseline:
        return "—"
    if a.acc.distinguishable is None:
        return "unknown (FILL IN)" if not a.acc.accuracy.known else "unknown"
    yes = "yes" if a.acc.distinguishable else "no"
    need = f"; n≈{a.acc.n_needed:,} per arm to tell |Δ| from 0" if a.acc.n_needed else ""
    return f"{yes} at n={a.acc.n if a.acc.n is not None else '?'}{need}"


def _kl_text(a: ArmDecision) -> Figure:
    if a.kl.value is None:
        return a.kl
    txt = a.kl.show() + (f" (top-1 {a.top1.show()})" if a.top1.value is not None else "")
    return Figure(a.kl.value, a.kl.kind, a.kl.source, a.kl.run_id, txt)


def _warn_text(a: ArmDecision) -> str:
    """Short form for the table (the fallback's evidence line is under Why)."""
    items = a.warnings + [f.split(" — ")[0].split(" (engine log")[0] for f in a.fallbacks]
    return "; ".join(items) if items else "none"


def _contention_text(a: ArmDecision) -> str:
    if a.contention is None:
        return "not recorded"
    return "; ".join(a.contention) if a.contention else "none flagged"


def _provenance(sec: Section) -> list[tuple[str, str, Figure]]:
    rows: list[tuple[str, str, Figure]] = []
    for a in sec.arms:
        rows += [(a.arm, "capacity (KV tokens)", a.capacity), (a.arm, "capacity predicted", a.predicted),
                 (a.arm, "capacity × baseline", a.capacity_x), (a.arm, "batch-1 TPOT", a.tpot_b1)]
        for c in sorted(a.levels):
            for key, f in sorted(a.levels[c].items()):
                rows.append((a.arm, f"c{c} {key}", f))
        rows += [(a.arm, "throughput at the SLO", a.throughput), (a.arm, "throughput × baseline", a.throughput_x),
                 (a.arm, "cost per 1M output tokens", a.cost), (a.arm, "GSM8K accuracy", a.acc.accuracy),
                 (a.arm, "GSM8K Δ", a.acc.delta), (a.arm, "KL mean", a.kl), (a.arm, "top-1 agreement", a.top1)]
    for b, f in sorted(sec.probe.items()):
        rows.append(("(node)", f"FP8 GEMM probe speedup, batch {b}", f))
    return rows


# --- HTML -------------------------------------------------------------------------------------------------

def to_html(rep: DecisionReport) -> str:
    from quantrack.report.figures import pictures

    e = html.escape
    parts = [(f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>quantrack report: "
             f"{e(rep.experiment)}</title><style>{_CSS}</style></head><body>"),
             f"<h1>Which arm to deploy: {e(rep.experiment)}</h1>",
             (f"<p class=\"small\">quantrack report, generated {e(rep.generated)} from {rep.n_runs} arm run(s) in "
             f"<code>{e(rep.uri)}</code>. Labels: <span class=\"k measured\">measured</span> "
             "<span class=\"k derived\">derived</span> <span class=\"k imported\">imported</span> "
             "<span class=\"k fill\">FILL IN</span> (not measured); hover a figure for its metric and run id.</p>"),
             "<h3>Constraints</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in rep.constraints.describe()) + "</ul>",
             f"<p class=\"small\">from: {e(', '.join(rep.constraints.sources) or 'defaults')}; {e(rep.price_note)}</p>"]
    if rep.fleet_pick:
        parts.append(f"<div class=\"rec\"><b>Fleet:</b> {e(rep.fleet_pick)}</div>")
    for i, sec in enumerate(rep.sections):
        parts.append(_section_html(i, sec, rep, pictures(sec, rep.constraints)))
    if rep.audit is not None:
        parts.append(_audit_html(rep))
    if rep.notes:
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in rep.notes) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _section_html(i: int, sec: Section, rep: DecisionReport, pics: list[tuple[str, str, str, bytes]]) -> str:
    e = html.escape
    out = [f"<h2 id=\"gpu-{i}\">{e(sec.gpu)} — baseline {e(sec.baseline or 'none')}</h2>",
           f"<div class=\"rec\"><b>Recommendation:</b> {e(sec.recommendation)}</div>"]
    head = ["Arm", "Verdict", "SLOs", "Throughput at SLO (× baseline)", "Capacity, KV tokens (× baseline)",
            "Cost / 1M out tok", "GSM8K", "Δ vs baseline [95% CI]", "Distinguishable from 0", "KL (top-1)",
            "Warnings, fallbacks", "Contention", "Run"]
    out.append(f"<div class=\"scroll\"><table class=\"verdicts\" id=\"verdicts-{i}\"><thead><tr>" +
               "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>")
    for a in sec.arms:
        lvl = f" @c{a.slo_level}" if a.slo_level is not None else ""
        slos = "<br>".join(e(s) for s in _slo_text(a)) or "no SLO stated"
        flag = '<br><span class="warn">⚠ warnings</span>' if a.warnings or a.fallbacks else ""
        out.append(
            "<tr>" + f"<td><b>{e(a.arm)}</b>{' (baseline)' if a.baseline else ''}<br>"
            f"<span class=\"small\">{e(a.configuration)}; {e(a.engine)}</span></td>"
            f"<td><span class=\"v {_verdict_class(a.verdict)}\">{e(a.verdict)}</span>{flag}</td>"
            f"<td class=\"small slo\">{slos}</td><td>{_cell(a.throughput)}{e(lvl)}<br>{_cell(a.throughput_x)}</td>"
            f"<td>{_cell(a.capacity)}<br>{_cell(a.capacity_x)}</td><td>{_cell(a.cost)}</td>"
            f"<td>{_cell(a.acc.accuracy)}</td><td>{_cell(a.acc.delta)}</td><td class=\"small\">{e(_distinguish(a))}</td>"
            f"<td>{_cell(a.kl)}{'<br>' + _cell(a.top1) if a.top1.known else ''}</td><td class=\"small warn\">{e(_warn_text(a))}</td>"
            f"<td class=\"small\">{e(_contention_text(a))}</td><td class=\"small\"><code title=\"{e(a.run_id)}\">"
            f"{e(a.run_id[:8])}</code>"
            f"{'<br>' + e(a.status) if a.status != 'FINISHED' else ''}</td></tr>")
    out.append("</tbody></table></div>")
    out.append("<h3>Why</h3><ul>")
    for a in sec.arms:
        out.append(f"<li><b>{e(a.arm)}: {e(a.verdict)}</b><ul>" + "".join(f"<li>{e(r)}</li>" for r in a.reasons)
                   + (f"<li>{sum(a.skipped.values())} other run(s) of this arm not used ("
                      + e(", ".join(f"{k} {v}" for k, v in a.skipped.items()))
                      + "): the newest FINISHED run is the one shown</li>" if a.skipped else "") + "</ul></li>")
    out.append("</ul>")
    out.append(f"<h3>Pareto frontier {e(sec.frontier_axes)}</h3><p>"
               + (e(", ".join(sec.frontier)) if sec.frontier else "—")
               + (f"</p><p class=\"small\">{e(sec.frontier_note)}" if sec.frontier_note else "") + "</p>")
    out.append("<h3>What would change the answer</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in sec.changes)
               + "</ul>")
    out.append("<h3>Pictures</h3><div class=\"grid\">")
    for name, title, caption, png in pics:
        b64 = base64.b64encode(png).decode("ascii")
        out.append(f"<figure><img alt=\"{e(title)}\" data-name=\"{e(name)}\" src=\"data:image/png;base64,{b64}\">"
                   f"<figcaption>{e(caption)}</figcaption></figure>")
    out.append("</div>")
    out.append("<details><summary>Figures and sources</summary><table><thead><tr><th>Arm</th><th>Figure</th>"
               "<th>Value</th><th>Kind</th><th>Source</th><th>Run</th></tr></thead><tbody>")
    for arm, what, f in _provenance(sec):
        out.append(f"<tr><td>{e(arm)}</td><td>{e(what)}</td><td>{e(f.show())}</td><td>{e(f.kind)}</td>"
                   f"<td class=\"small\">{e(f.source)}</td><td class=\"small\"><code>{e(f.run_id or '')}</code></td></tr>")
    out.append("</tbody></table></details>")
    return "\n".join(out)


def _audit_html(rep: DecisionReport) -> str:
    e = html.escape
    a = rep.audit
    assert a is not None
    out = ["<h2>Fleet audit</h2>",
           f"<p>{len(a.fell_back)} of {len(a.rows)} node run(s) fell back to a slower kernel (engine log, measured).</p>"]
    if a.fell_back:
        out.append("<ul>" + "".join(f"<li>{e(r.node)} ({e(r.gpu or '?')}, arm {e(r.arm or '?')}, run "
                                    f"<code>{e(r.source)}</code>): {e(r.evidence or 'no evidence line recorded')}</li>"
                                    for r in a.fell_back) + "</ul>")
    if a.warnings:
        out.append("<ul>" + "".join(f"<li class=\"warn\">{e(w)}</li>" for w in a.warnings) + "</ul>")
    return "\n".join(out)


# --- Markdown ---------------------------------------------------------------------------------------------

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]#!"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _md(text: object) -> str:
    """Text from a run (names, engine log lines, notes) as Markdown shows it, never as markup or raw HTML (the HTML
    page escapes the same text with html.escape)."""
    return str(text).translate(_MD_SPECIAL)


def _md_cell(f: Figure) -> str:
    if f.value is None:
        return f.show().replace("|", "\\|")
    return f"{f.show()} _({f.kind})_".replace("|", "\\|")


def to_markdown(rep: DecisionReport, png_dir: Path, stem: str) -> tuple[str, list[Path]]:
    """The Markdown text and the PNGs written into ``png_dir`` (named ``<stem>-<section>-<figure>.png``)."""
    from quantrack.report.figures import pictures

    lines = [f"# Which arm to deploy: {_md(rep.experiment)}", "",
             (f"quantrack report, generated {rep.generated} from {rep.n_runs} arm run(s) in `{rep.uri}`. "
             "Labels: measured / derived / imported; FILL IN = not measured."), "", ("**Constraints** (from "
             f"{', '.join(rep.constraints.sources) or 'defaults'}; {rep.price_note}):"), ""]
    lines += [f"- {_md(x)}" for x in rep.constraints.describe()] + [""]
    if rep.fleet_pick:
        lines += [f"**Fleet:** {_md(rep.fleet_pick)}", ""]
    written: list[Path] = []
    for i, sec in enumerate(rep.sections):
        lines += [f"## {_md(sec.gpu)} — baseline {_md(sec.baseline or 'none')}", "",
                  f"> **Recommendation:** {_md(sec.recommendation)}",
                  "", ("| Arm | Verdict | SLOs | Throughput at SLO | × baseline | Capacity | × baseline | Cost / 1M | "
                  "GSM8K | Δ [95% CI] | Distinguishable | KL | Warnings, fallbacks | Contention | Run |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for a in sec.arms:
            lvl = f" @c{a.slo_level}" if a.slo_level is not None else ""
            row = [f"**{_md(a.arm).replace('|', chr(92) + '|')}**" + (" (baseline)" if a.baseline else ""),
                   f"**{a.verdict}**", "<br>".join(_md(t) for t in _slo_text(a)) or "no SLO stated", _md_cell(a.throughput) + lvl,
                   _md_cell(a.throughput_x), _md_cell(a.capacity), _md_cell(a.capacity_x), _md_cell(a.cost),
                   _md_cell(a.acc.accuracy), _md_cell(a.acc.delta), _distinguish(a), _md_cell(_kl_text(a)),
                   _md(_warn_text(a)), _md(_contention_text(a)), f"`{a.run_id}`"]
            lines.append("| " + " | ".join(x.replace("|", "\\|") if not x.startswith("**") else x for x in row) + " |")
        lines += ["", "**Why**", ""]
        for a in sec.arms:
            lines.append(f"- **{_md(a.arm)}: {a.verdict}**")
            lines += [f"  - {_md(r)}" for r in a.reasons]
        lines += ["", f"**Pareto frontier** {_md(sec.frontier_axes)}: " + (", ".join(_md(f) for f in sec.frontier) or "—")
                  + (f" — {_md(sec.frontier_note)}" if sec.frontier_note else ""), "", "**What would change the answer**",
                  ""]
        lines += [f"- {_md(x)}" for x in sec.changes] + [""]
        for name, title, caption, png in pictures(sec, rep.constraints):
            p = png_dir / f"{stem}-s{i}-{name}.png"
            write_atomic(p, png, flag="--out")
            written.append(p)
            lines += [f"![{_md(title)}]({p.name})", "", f"_{_md(caption)}_", ""]
    if rep.audit is not None:
        au = rep.audit
        lines += ["## Fleet audit", "", f"{len(au.fell_back)} of {len(au.rows)} node run(s) fell back.", ""]
        lines += [f"- {_md(r.node)} ({_md(r.gpu)}, arm {_md(r.arm)}, run `{r.source}`): {_md(r.evidence)}"
                  for r in au.fell_back]
        lines += [f"- {_md(w)}" for w in au.warnings] + [""]
    if rep.notes:
        lines += ["## Notes", ""] + [f"- {_md(n)}" for n in rep.notes] + [""]
    return "\n".join(lines), written


def write_report(rep: DecisionReport, out: str | Path, fmt: str = "html", flag: str | None = "--out") -> list[Path]:
    """Write the page (and, for md, its PNGs beside it), each file whole or not at all and never through a link;
    returns every file written. ``flag``: what the messages call the path (None: the path alone)."""
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; formats: {', '.join(FORMATS)}")
    kind = special_target(out, flag)  # a device or FIFO is written through, never replaced (issue #43)
    if kind is not None:
        if fmt != "html":
            raise BadInput(f"{flag or '--out'} {out} is a {kind}: the Markdown page's PNGs are written beside it as "
                           "files; write --format html there (it holds its figures) or give a file name")
        return [write_atomic(out, to_html(rep), flag=flag)]
    path = refuse_link(out, flag)
    if path.exists() and path.is_dir():
        raise BadInput(f"--out {str(path)!r} is a directory: give a file name")
    if not path.parent.is_dir():
        raise BadInput(f"--out {str(path)!r}: no such directory {str(path.parent)!r}")
    if fmt == "html":  # whole or not at all: a full disk never leaves a 0-byte page
        return [write_atomic(path, to_html(rep), flag=flag)]
    text, pngs = to_markdown(rep, path.parent, path.stem)
    return [write_atomic(path, text, flag=flag), *pngs]




def log_report(files: list[Path], run_id: str, uri: str | None) -> list[str]:
    """Log the written report files as artifacts ``report/<name>`` of a run; returns the artifact paths."""
    from quantrack.store.tracking import log_files_to_run

    mapping = {f"report/{p.name}": p for p in files}
    log_files_to_run(run_id, mapping, uri)
    return sorted(mapping)


@dataclass(frozen=True)
class PublishedPage:
    """The page `quantrack run` wrote, and its decision in plain lines (printed under the closing table)."""

    path: Path
    decision: tuple[str, ...]


def publish_study_report(result: Any, uri: str, workdir: Path, say: Callable[[str], None],
                         prices: Any = None) -> PublishedPage | None:
    """After ``quantrack run``: the decision page of this study's arm runs (the study's [decision] constraints),
    written to ``workdir/report.html`` and logged as ``report/report.html`` on the study's parent run.
    Never raises: the runs are logged already, the page is a view of them."""
    from quantrack.report.decision import (
        Constraints,
        build_report,
        constraints_from_spec,
    )
    from quantrack.store.tracking import load_runs

    parent = result.parent
    if parent is None or parent.run_id is None:
        say(f"report: the runs were spooled; after `quantrack sync`, run `quantrack report --experiment "
            f"{result.experiment} --log-to-run`")
        return None
    try:
        runs = [r for r in load_runs(result.experiment, uri) if r.tags.get(Tag.MLFLOW_PARENT_RUN_ID) == parent.run_id]
        if not runs:
            return None
        c = constraints_from_spec(result.study.decision, result.study.source) or Constraints()
        rep = build_report(result.experiment, runs, c, uri=uri, baseline=result.study.baseline.name,
                           prices=prices if c.prices is None else None)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        files = write_report(rep, Path(workdir) / "report.html", "html", flag=None)
        log_report(files, parent.run_id, uri)
    except Exception as exc:  # noqa: BLE001 - the runs are logged already; the page is only a view of them
        say(f"report: could not write the decision page ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            f"run `quantrack report --experiment {result.experiment}`")
        return None
    for s in rep.sections:
        say(f"report: {s.gpu}: {s.recommendation}")
    say(f"report: {files[0]} (artifact report/report.html of the parent run {parent.run_id})")
    return PublishedPage(files[0], tuple(rep.decision_lines()))


__all__ = ["FORMATS", "PublishedPage", "log_report", "publish_study_report", "to_html", "to_markdown", "write_report"]
