"""Markdown: number formatting, table cells and tables, and the ``summary.md`` and
``per_task.md`` pages.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from tabulate import tabulate

from ..results import AGREEMENT, Flag, Status
from ..timing import TIMING_VERSION, hostclock, stalls
from .conventions import (
    CONVENTION_SOURCES,
    MISSING,
    MISSING_AS_ONE,
    NA,
    SPEEDUP_THRESHOLD,
    STAT_ROWS,
    TIMED_GROUPS,
    _mode_key,
    _mode_label,
    status_class,
)
from .stats import (
    _levels,
    _modes,
    _protocols,
    _select,
    flag_counts,
    machine_counts,
    on_cpu,
    stall_sensitivity,
    status_counts,
    summary_table,
    timed_stats,
    timing_version_counts,
)


def convention_note(mode: str) -> str:
    source = CONVENTION_SOURCES.get(mode, "CUDA-L1 README")
    if MISSING_AS_ONE.get(mode, False):
        return (
            f"Convention ({source}): tasks without a score count as 1.00 in Mean, "
            "percentiles and GeoMean; Speedup is out of all tasks."
        )
    return f"Convention ({source}): only tasks with a score are averaged; Speedup is out of the scored tasks."


def _coverage_note(df, mode, protocol) -> str:
    """Sentence on tasks left out (missing) and tasks scored in the release but without code."""
    sel = _select(df, mode, protocol)
    notes = []
    n_missing = int((sel["status"] == MISSING).sum())
    if n_missing:
        notes.append(f"{n_missing} task(s) without a result file are left out of both columns.")
    kept = sel[sel["status"] != MISSING]
    no_code = kept["status"].eq(Status.NO_CODE) | kept["code_status"].eq(Status.NO_CODE)
    n_pub_no_code = int((no_code & kept["published"].notna()).sum())
    if n_pub_no_code:
        notes.append(
            f"{n_pub_no_code} task(s) have a published score but no released code; "
            "they are scored in the published column only."
        )
    return (" " + " ".join(notes)) if notes else ""


def fmt(x, digits: int = 2) -> str:
    """2-decimal number, or a dash for None/NaN; strings pass through."""
    if x is None or (isinstance(x, str) and not x):
        return NA
    if isinstance(x, str):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return NA if not math.isfinite(f) else f"{f:.{digits}f}"


def md_escape(text, limit: int | None = 160) -> str:
    """Make free text safe inside a GitHub table cell."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ""
    s = " ".join(str(text).split()).replace("|", "\\|")
    if limit and len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def md_table(rows, headers, colalign=None) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True, colalign=colalign)


def _status_table(df) -> str:
    counts = status_counts(df)
    headers = [
        "Protocol",
        "Mode",
        "Measured",
        "Failed",
        "Not run",
        "Missing",
        "Total",
        f"Within ±{AGREEMENT:.0%}",
        "< ½ published",
        "> 2× published",
        "Median measured/published",
    ]
    rows = [
        [
            r.protocol,
            _mode_label(r.mode),
            r.measured,
            r.failed,
            r.not_run,
            r.missing,
            r.total,
            f"{r.within}/{r.compared}",
            f"{r.below_half}/{r.compared}",
            f"{r.above_double}/{r.compared}",
            fmt(r.median_ratio),
        ]
        for r in counts.itertuples()
    ]
    return md_table([[str(c) for c in row] for row in rows], headers, ["left", "left"] + ["right"] * 9)


def _stall_table(df) -> str:
    sens = stall_sensitivity(df)
    if sens.empty:
        return ""
    headers = ["Mode", "Compared", "With stalled calls", f"Within ±{AGREEMENT:.0%}", "< ½", "> 2×", "Median ratio"]
    rows = [
        [_mode_label(r.mode), r.compared, r.stalled,
         f"{r.measured_agree} → {r.without_agree}", f"{r.measured_below_half} → {r.without_below_half}",
         f"{r.measured_above_double} → {r.without_above_double}", f"{fmt(r.measured_median)} → {fmt(r.without_median)}"]
        for r in sens.itertuples(index=False)
    ]
    return md_table(rows, headers, ["left"] + ["right"] * (len(headers) - 1))


def _host_bound_note(df) -> str:
    """The ``HOST_BOUND`` flag's clause of the flags' sentence, where a row carries it (tables of
    results timed before launches were recorded have none, and no clause)."""
    if not len(df) or not df["flags"].fillna("").astype(str).str.split(";").map(lambda f: Flag.HOST_BOUND in f).any():
        return ""
    return (f", `{Flag.HOST_BOUND}`: a side's median launch is at least {hostclock.HOST_BOUND_SHARE:.0%} of its "
            "median timed call, so the paper score measures the host's CPU as much as the GPU and moves with "
            "the host's speed between runs; a published score of such a task also carries the random order of "
            "its timed pairs (on an H100: one run's order swings it with a standard deviation of up to 14 %, "
            "docs/protocols.md)")


def _flag_table(df) -> str:
    combos, counts = flag_counts(df)
    if not counts:
        return "No flags."
    headers = ["Flag"] + [f"{_mode_label(m)} ({p})" for p, m in combos] + ["Tasks, any"]
    rows = [[f"`{flag}`"] + [c.get(k, 0) for k in combos] + [c["any"]] for flag, c in counts.items()]
    return md_table(rows, headers, ["left"] + ["right"] * (len(headers) - 1))


def timing_version_sentence(df) -> str:
    """How many scores each timing version made and on which GPU(s), and whether they are current
    (made by the workflow's :data:`TIMING_VERSION`) or stale; empty without a score."""
    counts = timing_version_counts(df)
    total = sum(n for _, n, _ in counts)
    if not total:
        return ""
    at = lambda v: "no timing version recorded" if v is None else f"timing version {v}"  # noqa: E731
    if len(counts) == 1:
        what = f"{total:,} scores, all at {at(counts[0][0])} ({counts[0][2]})"
    else:
        what = f"{total:,} scores: " + ", ".join(
            f"{n:,}{'' if i else f' of {total:,}'} at {at(v)} ({gpus})" for i, (v, n, gpus) in enumerate(counts))
    stale = sum(n for v, n, _ in counts if v != TIMING_VERSION)
    if not stale:
        return f"{what}: the workflow's current timing version."
    which = "these scores are" if stale == total else f"the {stale:,} of another version are"
    return (f"{what}. The workflow's current timing version is {TIMING_VERSION}: {which} stale, made by an "
            "earlier protocol, and shown as measured until they are timed again.")


def timing_version_caption(df) -> str:
    """The figures' second title line: the scores of each timing version and their GPUs, and, where
    a version is not the workflow's :data:`TIMING_VERSION`, that it is stale; empty without a score."""
    counts = timing_version_counts(df)
    at = lambda v: "no timing version" if v is None else f"timing version {v}"  # noqa: E731
    text = "; ".join(f"{n:,} scores at {at(v)}, {g}{'' if v == TIMING_VERSION else ' (stale)'}" for v, n, g in counts)
    stale = any(v != TIMING_VERSION for v, _, _ in counts)
    return f"{text}; current timing version {TIMING_VERSION}" if stale else text


#: Where the share of scores within :data:`AGREEMENT` of two groups (of this many compared scores
#: or more) differs by this much or more, the tables say that agreement differs by group.
GROUP_GAP, GROUP_MIN = 0.10, 5


def _timed_cell(g: dict, scores: int, unrecorded: int, group: str) -> str:
    if group == "host_bound" and unrecorded == scores:
        return "not recorded"
    cell = f"{g['scores']} ({g['scores'] / scores:.0%})"
    if g["scores"]:
        cell += f": median {fmt(g['median_ratio'])}, {g['within']}/{g['compared']} within ±{AGREEMENT:.0%}"
    return cell + (f"; not recorded for {unrecorded}" if group == "host_bound" and unrecorded else "")


def _agreement_gaps(rows) -> list[str]:
    """A line per protocol x mode whose groups' agreement differs (:data:`GROUP_GAP`)."""
    out = []
    for r in rows:
        groups = {k: g for k, g in r["groups"].items() if k and g["compared"]}
        big = [g["within"] / g["compared"] for g in groups.values() if g["compared"] >= GROUP_MIN]
        if len(big) >= 2 and max(big) - min(big) >= GROUP_GAP:
            ranked = sorted(groups.items(), key=lambda kv: -kv[1]["within"] / kv[1]["compared"])
            out.append(f"* {_mode_label(r['mode'])} ({r['protocol']}): " + ", ".join(
                f"{TIMED_GROUPS[k]} {g['within'] / g['compared']:.0%} ({g['within']}/{g['compared']})"
                for k, g in ranked))
    return out


def what_was_timed_lines(df) -> list[str]:
    """``## What was timed``: per protocol and mode, the share of the scores in each group of
    :data:`TIMED_GROUPS` and published against measured for each apart (:func:`timed_stats`)."""
    rows = timed_stats(df)
    if not rows:
        return []
    table = [[r["protocol"], _mode_label(r["mode"]), r["scores"],
              *(_timed_cell(r["groups"][k], r["scores"], r["unrecorded"], k) for k in TIMED_GROUPS)] for r in rows]
    unknown = sum(r["groups"][""]["scores"] for r in rows)
    gaps = _agreement_gaps(rows)
    return [
        "## What was timed", "",
        "Which code each score times, per protocol and mode: how many scores (share of the mode's), and for each "
        f"group apart the median measured/published and how many of those with a published score are within "
        f"±{AGREEMENT:.0%} of it.", "",
        md_table(table, ["Protocol", "Mode", "Scores", *TIMED_GROUPS.values()], ["left", "left"] + ["right"] * 5), "",
        f"*{TIMED_GROUPS['kernel']}*: the custom code builds a C++/CUDA extension (`torch.utils.cpp_extension`) "
        f"and it built. *{TIMED_GROUPS['host_bound']}* (`{Flag.HOST_BOUND}`), whatever code ran: a side's median "
        f"launch is at least {hostclock.HOST_BOUND_SHARE:.0%} of its median timed call, so the score measures the "
        "host as much as the GPU; *not recorded* where the results record no launches (timing versions before "
        f"launches were recorded, the strict protocol). *{TIMED_GROUPS['fallback']}* "
        f"(`{Flag.EXTENSION_BUILD_FAILED}`): the extension does not build and the code's own PyTorch path ran. "
        f"*{TIMED_GROUPS['pytorch']}*: custom code that builds no extension runs PyTorch operators, CUDA-L1's "
        "rewrite as written, not counted as a fallback (a few carry CUDA source for another loader, such as CuPy, "
        "which the code scan does not follow). Each score is in one group, host-bound first."
        + (f" {unknown} score(s) whose custom code was not scanned are in none." if unknown else ""), "",
        f"Where the share within ±{AGREEMENT:.0%} of two groups (of {GROUP_MIN} compared scores or more) is "
        f"{GROUP_GAP * 100:.0f} points apart or more, agreement differs by what was timed: "
        + ("in these modes (each group's share, highest first)." if gaps else "in no mode here."),
        *(["", *gaps] if gaps else []), "",
    ]


def machines_lines(df) -> list[str]:
    """summary.md's section: how many machines each protocol and mode's scores came from."""
    unknown = "none (CPU)" if on_cpu(df) else "not recorded"
    rows = [[p, _mode_label(m), n, gpus or unknown, none, hosts] for p, m, n, gpus, none, hosts in machine_counts(df)]
    if not rows:
        return []
    return ["## Machines", "", "The machines each protocol and mode's scores were timed on: GPUs told apart by "
            "their UUID (recorded by each result from version 0.5.0 on), and the hosts' names.", "",
            md_table(rows, ["Protocol", "Mode", "Scores", "GPUs (by UUID)", "Scores without a GPU UUID", "Hosts"],
                     ["left", "left", "right", "right", "right", "left"]), ""]


def render_summary_markdown(df, note: str | None = None) -> str:
    """Per protocol and mode: published next to measured, per level and overall. ``note``: a
    sentence under the first paragraph (where the release was published and measured)."""
    lines = ["# Summary: measured vs published speedups", ""]
    if df.empty:
        return "\n".join(lines + ["No results.", ""])
    devices = ", ".join(str(d) for d in pd.unique(df["device"].dropna())) or "unknown device"
    n_tasks = df["tid"].nunique()
    lines += [
        f"Device: **{devices}**, {n_tasks} tasks. Speedup = reference time / CUDA-L1 time (×). "
        f"*Published* = the release's score; *measured* = this run. Success = tasks with a score; "
        f"Speedup = tasks above {SPEEDUP_THRESHOLD}×. Percentiles use linear interpolation.",
        "",
        *([f"**{note[0].upper()}{note[1:]}.**", ""] if note else []),
        *([f"**{timing}**", ""] if (timing := timing_version_sentence(df)) else []),
        *what_was_timed_lines(df),
        *machines_lines(df),
        "## Task counts",
        "",
        "*Failed* = ran but did not produce a valid score (compile/load/runtime error, incorrect output, "
        "lazy or missing `ModelNew`, broken baseline); *not run* = no code in the release, no baseline, "
        "unsupported or skipped; *missing* = no result file. The last columns compare tasks with both scores.",
        "",
        _status_table(df),
        "",
        "## Flags",
        "",
        "Tasks carrying each flag of the checks (detectors), the timing stage and the tables "
        "(`SPEEDUP_CEILING`, `DEGENERATE_TASK` from the CPU scan, `SELF_TIMED` from the custom code: it times "
        "itself and may pick its path from that, so a second run may not agree, `RUN_SPREAD`: in repeated runs of "
        "the same code its default score moved more than 15 % in two pairs or more, `EXTENSION_BUILD_FAILED`, "
        f"`{stalls.FLAG}`: timed calls stalled by the host changed a paper score by more than "
        f"{stalls.TOLERANCE:.0%} or caused its early stop; `score_without_stalls` in scores.csv"
        + _host_bound_note(df)
        + "). A flag is for review: the score stays what the protocol measured.",
        "",
        _flag_table(df),
        "",
    ]
    stall_table = _stall_table(df)
    if stall_table:
        lines += [
            "### Paper scores without stalled calls",
            "",
            "Measured/published as measured → with each score taken without the timed pairs that hold "
            f"a stalled call (`{stalls.FLAG}`; early-stopped results only have the trials that ran). "
            "A sensitivity check of the harness's mean-of-means formula, not a replacement score.",
            "",
            stall_table,
            "",
        ]
    levels = _levels(df)
    for proto in _protocols(df):
        lines += [f"## Protocol: {proto}", ""]
        for mode in _modes(df):
            if df[(df["protocol"] == proto) & (df["mode"] == mode)].empty:
                continue
            pub = summary_table(df, mode, proto, published=True, levels=levels)
            meas = summary_table(df, mode, proto, published=False, levels=levels)
            headers = ["Statistic"]
            for col in pub.columns:
                name = "All" if col == "All" else f"Level {col[1:]}"
                headers += [f"{name} published", f"{name} measured"]
            rows = []
            for stat in STAT_ROWS:
                row = [stat]
                for col in pub.columns:
                    row += [fmt(pub.at[stat, col]), fmt(meas.at[stat, col])]
                rows.append(row)
            lines += [
                f"### {_mode_label(mode)} ({proto})",
                "",
                md_table(rows, headers, ["left"] + ["right"] * (len(headers) - 1)),
                "",
                f"<sub>{convention_note(mode)}{_coverage_note(df, mode, proto)}</sub>",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


_GROUP_ORDER = {"failed": 0, "measured": 1, "missing": 3, "not_run": 4}


def _per_task_order(df) -> pd.DataFrame:
    d = df.copy()
    cls = d["status"].map(status_class)
    group = cls.map(_GROUP_ORDER).astype(int)
    # measured but not comparable (no published score) after the comparable ones
    group = group.where(~((cls == "measured") & d["ratio"].isna()), 2)
    d["_g"] = group
    # failures: largest published claim first; measured: largest |log ratio| first
    dis = np.abs(np.log(d["ratio"].astype(float)))
    d["_dis"] = -dis.where(group != 0, d["published"].astype(float)).fillna(0.0)
    d["_m"] = d["mode"].map(_mode_key)
    return d.sort_values(["_g", "_dis", "level", "task", "_m"], kind="stable")


def render_per_task_markdown(df) -> str:
    """Every task x mode (per protocol): published, measured, ratio, status, flags.

    Order: failures first (largest published score first), then measured tasks by
    decreasing |log(measured/published)|,
    then measured without a published score, missing results, and not-run tasks
    (e.g. ``no_code``, listed with their published scores).
    """
    lines = ["# Per-task results", ""]
    if df.empty:
        return "\n".join(lines + ["No results.", ""])
    lines += [
        "Ratio = measured / published. Order: failures first (largest published score first), then the "
        "largest disagreements (|log ratio|), then measured tasks without a published score, missing "
        "results and tasks not run (e.g. `no_code`, with their published score). "
        "Check = status of the correctness check; Flags = warnings of the check and timing stages.",
        "",
        *([f"**{timing}**", ""] if (timing := timing_version_sentence(df)) else []),
    ]
    headers = ["Task", "Mode", "Published", "Measured", "± std", "Ratio", "Status", "Check", "Flags", "Reason"]
    align = ["left", "left", "right", "right", "right", "right", "left", "left", "left", "left"]
    for proto in _protocols(df):
        sel = _per_task_order(df[df["protocol"] == proto])
        rows = [
            [
                r.tid,
                _mode_label(r.mode),
                fmt(r.published),
                fmt(r.measured),
                fmt(r.std),
                fmt(r.ratio),
                md_escape(r.status),
                md_escape(r.check_status),
                md_escape(r.flags, 80),
                md_escape(r.reason),
            ]
            for r in sel.itertuples()
        ]
        lines += [f"## Protocol: {proto} ({len(rows)} rows)", "", md_table(rows, headers, align), ""]
    lines += protocol_comparison_lines(df)
    return "\n".join(lines).rstrip() + "\n"


def protocol_comparison_lines(df) -> list[str]:
    """Paper next to strict, task by task (only when both protocols were run).

    Rows with a flag or a strict/paper ratio outside [0.8, 1.25] come first.
    """
    if not {"paper", "strict"} <= set(df["protocol"]):
        return []
    key = ["tid", "mode"]
    paper = df[df["protocol"] == "paper"].set_index(key)
    strict = df[df["protocol"] == "strict"].set_index(key)
    both = pd.merge(paper, strict, left_index=True, right_index=True, how="outer", suffixes=("_paper", "_strict"))
    both["strict_over_paper"] = both["measured_strict"] / both["measured_paper"]
    flags = both[["flags_paper", "flags_strict"]].fillna("").astype(str)
    both["all_flags"] = [
        ";".join(sorted({f for part in row for f in part.split(";") if f})) for row in flags.itertuples(index=False)
    ]
    off = (both["strict_over_paper"] - 1).abs().fillna(0) > 0.2
    both["_order"] = ~((both["all_flags"] != "") | off)
    both = both.sort_values(["_order", "strict_over_paper"], na_position="last")
    rows = [
        [
            tid,
            _mode_label(mode),
            fmt(r.published_paper),
            fmt(r.measured_paper),
            fmt(r.measured_strict),
            f"[{fmt(r.ci95_lo_strict)}, {fmt(r.ci95_hi_strict)}]" if r.ci95_lo_strict == r.ci95_lo_strict else "–",
            fmt(r.strict_over_paper),
            md_escape(r.status_strict),
            md_escape(r.all_flags, 80),
        ]
        for (tid, mode), r in both.iterrows()
    ]
    headers = ["Task", "Mode", "Published", "Paper", "Strict (median)", "Strict 95% CI", "Strict / paper"]
    headers += ["Strict status", "Flags"]
    return [
        f"## Paper vs strict protocol ({len(rows)} rows)",
        "",
        "Flagged tasks and those whose strict score differs from the paper score by more than 20 % come first.",
        "",
        md_table(rows, headers, ["left", "left", "right", "right", "right", "left", "right", "left", "left"]),
        "",
    ]
