"""Two accuracy runs from files, compared: paired (exact McNemar, Newcombe's interval) when both have per-question
records (``quantrack eval compare``). The statistics are ``quantrack.accuracy.stats``; reading the files is
``quantrack.accuracy.importers``."""

from __future__ import annotations

from typing import Any

from quantrack.accuracy.importers import load_run
from quantrack.accuracy.stats import compare_counts, paired_counts
from quantrack.errors import BadInput


def compare_runs(base_path: str, arm_path: str, *, budget: float | None = None, sequential: bool = False,
                 metric: str | None = None, lm_eval_filter: str | None = None) -> dict[str, Any]:
    """Load two runs (records, result JSON or importable files) and compare them, paired when both
    have per-question records. Returns a plain dict for rendering; accuracies only as measured/imported.

    ``budget`` (a fraction: 0.01 = 1 point) adds the budget verdict (:mod:`quantrack.accuracy.budget`): on all
    paired questions with Newcombe's interval, or with ``sequential`` question by question in the order the arm's
    records were written (the order they were answered), by the betting confidence sequence.

    Two lm-eval imports of any task (:mod:`quantrack.accuracy.lmeval`; ``metric`` / ``lm_eval_filter`` pick what
    each file is scored by) pair only the docs whose prompt, doc and target hashes agree; the others are dropped
    and counted in ``excluded``, and the report names the metric."""
    if sequential and budget is None:
        raise BadInput("--sequential judges a budget: give --budget too (e.g. --budget 1pp)")
    base_res, base_recs = load_run(base_path, metric=metric, lm_eval_filter=lm_eval_filter)
    arm_res, arm_recs = load_run(arm_path, metric=metric, lm_eval_filter=lm_eval_filter)
    report: dict[str, Any] = {
        "base": {"path": base_path, "source": base_res.source, "style": base_res.style,
                 "accuracy": base_res.accuracy, "n": base_res.n, "errors": base_res.errors},
        "arm": {"path": arm_path, "source": arm_res.source, "style": arm_res.style,
                "accuracy": arm_res.accuracy, "n": arm_res.n, "errors": arm_res.errors},
        "paired": False,
        "task": base_res.task if base_res.task == arm_res.task else f"{base_res.task} / {arm_res.task}",
    }
    if base_recs is None or arm_recs is None:
        which = " and ".join(name for name, recs in (("base", base_recs), ("arm", arm_recs)) if recs is None)
        verb = "have" if " and " in which else "has"
        report["reason"] = (f"a paired test is impossible: {which} {verb} no per-question records "
                            "(accuracy-only import)")
        return report
    if base_res.style and arm_res.style and base_res.style != arm_res.style:
        raise BadInput(f"base was scored with style {base_res.style!r}, arm with {arm_res.style!r}: "
                       "compare runs scored the same way")
    dropped = None
    scored = [res.settings.get("lm_eval_metric") for res in (base_res, arm_res)]
    if any(scored):
        from quantrack.accuracy.lmeval import drop_unmatched

        filters = [res.settings.get("filter") for res in (base_res, arm_res)]
        if scored[0] != scored[1] or filters[0] != filters[1]:
            raise BadInput(f"base is scored by {scored[0] or 'no lm-eval metric'} (filter {filters[0]}), arm by "
                           f"{scored[1] or 'no lm-eval metric'} (filter {filters[1]}): compare two lm-eval imports "
                           "scored by the same metric and filter (--metric, --filter)")
        report["metric"], report["filter"] = scored[0], filters[0]
        base_recs, arm_recs, dropped = drop_unmatched(base_recs, arm_recs)
    shared = sorted(set(base_recs) & set(arm_recs))
    differing = [q for q in shared if base_recs[q].prompt_sha256 and arm_recs[q].prompt_sha256
                 and base_recs[q].prompt_sha256 != arm_recs[q].prompt_sha256]
    if differing:
        raise BadInput(f"{len(differing)} shared questions were asked with different prompts (prompt_sha256 differs, "
                       f"first id {differing[0]}): different shots or data; a paired comparison needs identical prompts")
    a, b, c, d = paired_counts(base_recs, arm_recs)
    if a + b + c + d == 0:
        report["reason"] = "a paired test is impossible: no question was answered by both runs"
        if dropped is not None and any(dropped.values()):
            report["reason"] += (f" with the same prompt ({dropped['prompt_hash_differs']} dropped: prompt_hash "
                                 f"differs; {dropped['doc_or_target_hash_differs']}: doc or target hash differs)")
        return report
    cmp = compare_counts(a, b, c, d)
    report["paired"] = True
    report["comparison"] = cmp.to_dict()
    report["verdict"] = cmp.verdict()
    if budget is not None:
        report["budget"] = budget_verdict(base_recs, arm_recs, cmp, budget, sequential=sequential).to_dict()
    report["excluded"] = {
        "only_in_base": len(set(base_recs) - set(arm_recs)),
        "only_in_arm": len(set(arm_recs) - set(base_recs)),
        "errored_in_either": sum(1 for q in shared if not (base_recs[q].answered and arm_recs[q].answered)),
    }
    if dropped is not None:
        report["excluded"].update(dropped)
    return report


def budget_verdict(base_recs: dict[int, Any], arm_recs: dict[int, Any], cmp: Any, budget: float, *,
                   sequential: bool) -> Any:
    """The budget verdict of two runs' records; sequentially in the arm's record order (its file order)."""
    from quantrack.accuracy.budget import fixed_verdict, paired_differences, sequential_verdict

    if not sequential:
        return fixed_verdict(cmp, budget)

    def ok(r: Any) -> bool | None:
        return bool(r.correct) if r.answered else None

    order = [q for q in arm_recs if q in base_recs]
    return sequential_verdict(paired_differences((ok(base_recs[q]), ok(arm_recs[q])) for q in order), budget)
