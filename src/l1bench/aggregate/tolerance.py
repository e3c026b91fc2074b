"""Correctness pass rates at other tolerances, from the smallest passing tolerance each check
records per trial (``min_tolerance``, :mod:`l1bench.mintolerance`); no GPU run is needed.

A task passes at ``t`` when every correctness trial does (``allclose(atol=t, rtol=t)``). A check
that failed stopped at its first failing trial: at a tolerance looser than every trial it ran,
whether the trials it did not run pass is not known. A check that failed before comparing
outputs (build, load, laziness, an error in a trial) fails at every tolerance. A check written
without the record (before it existed) is *not recorded*: it needs a check run, and its pool is
never shown as 0 %.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..mintolerance import from_json, table_param
from ..results import FAILED_STATUSES, Status
from .conventions import NA
from .markdown import md_table

#: What a rate reads when no check of the pool recorded its trials.
NOT_RECORDED = "not recorded (needs a check run)"

PASS, FAIL, UNKNOWN, UNRECORDED = "pass", "fail", "unknown", "unrecorded"

__all__ = ["NOT_RECORDED", "any_record", "load_checks", "pass_counts", "pass_rate", "sections", "table_param",
           "verdict_at"]


def load_checks(paths) -> dict[str, dict]:
    """``{tid: {"status", "trials" (recorded tolerances or None), "n_trials"}}`` of the check
    results at ``paths`` (unreadable files are left out: the tables count them missing)."""
    out = {}
    for path in paths:
        try:
            res = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        trials = res.get("min_tolerance")
        out[res.get("tid") or Path(path).stem] = {
            "status": res.get("status"),
            "trials": None if trials is None else [from_json(t) for t in trials],
            "n_trials": (res.get("params") or {}).get("correctness_trials"),
        }
    return out


def ran_code(check: dict) -> bool:
    """Whether the check ran the custom code (pass or a failure; not no code, not skipped)."""
    return check.get("status") == Status.PASS or check.get("status") in FAILED_STATUSES


def verdict_at(check: dict, t: float) -> str | None:
    """:data:`PASS`, :data:`FAIL`, :data:`UNKNOWN` (trials the check did not run decide it),
    :data:`UNRECORDED` (no record), or None for a check that did not run the code."""
    status, trials = check.get("status"), check.get("trials")
    if status not in (Status.PASS, Status.INCORRECT):
        return FAIL if ran_code(check) else None
    if trials is None:
        return UNRECORDED
    if trials and max(trials) > t:
        return FAIL
    if status == Status.PASS:
        return PASS
    n_trials = check.get("n_trials") or 0
    return PASS if n_trials and len(trials) >= n_trials else UNKNOWN


def worst_trial(check: dict) -> float | None:
    """The task's smallest passing tolerance over the trials it ran (None: no record)."""
    trials = check.get("trials")
    return max(trials) if trials else None


def pass_counts(checks: dict[str, dict], t: float) -> dict[str, int]:
    """How many checks pass, fail, are unknown or unrecorded at ``t`` (checks that ran code)."""
    counts = dict.fromkeys((PASS, FAIL, UNKNOWN, UNRECORDED), 0)
    for check in checks.values():
        v = verdict_at(check, t)
        if v is not None:
            counts[v] += 1
    return counts


def rate_text(counts: dict[str, int]) -> str:
    """``pass/pool (x %)``; :data:`NOT_RECORDED` when no check of the pool has a record."""
    pool = sum(counts.values())
    if pool and counts[UNRECORDED] == pool:
        return NOT_RECORDED
    if not pool:
        return NA
    text = f"{counts[PASS]}/{pool} ({counts[PASS] / pool:.1%})"
    open_ = [f"{counts[k]} {w}" for k, w in ((UNKNOWN, "not known"), (UNRECORDED, "not recorded")) if counts[k]]
    return text + (f"; {', '.join(open_)}" if open_ else "")


def pass_only_looser(checks: dict[str, dict], looser: float, stricter: float) -> list[str]:
    """Tasks that pass at ``looser`` and fail at ``stricter``, in task order."""
    return sorted(tid for tid, c in checks.items() if verdict_at(c, looser) == PASS and verdict_at(c, stricter) == FAIL)


def any_record(checks: dict[str, dict]) -> bool:
    """Whether any check recorded its trials (else every rate is :data:`NOT_RECORDED`)."""
    return any(c.get("trials") is not None for c in checks.values())


def pass_rate(checks: dict[str, dict], t: float) -> str:
    """The pass rate at ``t`` as the tables write it (:func:`rate_text`), :data:`NOT_RECORDED`
    when no check recorded its trials."""
    return rate_text(pass_counts(checks, t)) if any_record(checks) else NOT_RECORDED


def _tol(t: float) -> str:
    return f"{t:g}"


def summary_section(checks: dict[str, dict], paper: tuple[float, float] | None, tolerances) -> str:
    """summary.md's section: the check's verdict at the paper's tolerance, then the pass rate at
    each configured tolerance from the recorded trials, and how many pass only at the looser
    ('' without checks)."""
    if not checks:
        return ""
    where = f" (atol {_tol(paper[0])}, rtol {_tol(paper[1])})" if paper else ""
    verdicts = [c["status"] for c in checks.values() if ran_code(c)]
    passed = sum(s == Status.PASS for s in verdicts)
    paper_rate = f"{passed}/{len(verdicts)} ({passed / len(verdicts):.1%})" if verdicts else NA
    rows = [[f"the paper's check{where}: the verdict", paper_rate]]
    recorded = any_record(checks)
    rows += [
        [f"atol = rtol = {_tol(t)}, from the recorded trials", pass_rate(checks, t)]
        for t in sorted(tolerances, reverse=True)
    ]
    lines = [
        "## Correctness at other tolerances",
        "",
        "Each check records, per correctness trial, the smallest tolerance t at which "
        "`allclose(atol=t, rtol=t)` passes; a task passes at t when all its trials do. The verdict "
        "and the scores keep the paper's tolerance. Pool: the tasks whose check ran their code. "
        "*Not known*: the check stopped at its first failing trial, and the trials it did not run "
        "decide the looser tolerance.",
        "",
        md_table(rows, ["Tolerance", "Pass"], ["left", "right"]),
        "",
    ]
    for loose, strict in _pairs(tolerances):
        n = len(pass_only_looser(checks, loose, strict))
        if recorded:
            lines += [f"{n} task(s) pass at {_tol(loose)} but not at {_tol(strict)} (named in per_task.md).", ""]
    return "\n".join(lines).rstrip() + "\n"


def _pairs(tolerances) -> list[tuple[float, float]]:
    """(loosest, each stricter one)."""
    ts = sorted(set(tolerances), reverse=True)
    return [(ts[0], t) for t in ts[1:]]


def per_task_section(checks: dict[str, dict], tolerances) -> str:
    """per_task.md's section: the tasks that pass only at the looser tolerance, with the
    smallest tolerance at which they pass ('' without checks)."""
    if not checks:
        return ""
    lines = ["## Tasks that pass only at the looser tolerance", ""]
    if not any_record(checks):
        return "\n".join(lines + ["Not recorded (needs a check run).", ""])
    for loose, strict in _pairs(tolerances):
        tids = pass_only_looser(checks, loose, strict)
        lines += [f"Pass at atol = rtol = {_tol(loose)}, fail at {_tol(strict)}: {len(tids)} task(s).", ""]
        if tids:
            rows = [[tid, f"{worst_trial(checks[tid]):.3g}"] for tid in tids]
            lines += [md_table(rows, ["Task", "Smallest passing tolerance"], ["left", "right"]), ""]
    return "\n".join(lines).rstrip() + "\n"


def sections(check_paths, paper, tolerances) -> tuple[str, str]:
    """What summary.md and per_task.md append (each '' without checks, else led by a blank
    line): :func:`summary_section` and :func:`per_task_section` of the checks at ``check_paths``."""
    checks = load_checks(check_paths)
    tolerances = list(tolerances or [])
    summary, per_task = summary_section(checks, paper, tolerances), per_task_section(checks, tolerances)
    return (f"\n{summary}" if summary else ""), (f"\n{per_task}" if per_task else "")
