"""The report ``results/{device}/README.md``: environment (provenance), outcome, findings
generated from the results, links to the tables and figures.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ..results import AGREEMENT, Status
from ..timing import stalls
from .conventions import MISSING_AS_ONE, NA, _mode_label, status_class
from .markdown import _status_table, fmt, md_escape, md_table, timing_version_sentence, what_was_timed_lines
from .stats import _modes, _protocols, _without_stalls, on_cpu, stall_sensitivity, status_counts, summary_table


def _most_common(values) -> str | None:
    vals = [v for v in values if isinstance(v, str) and v]
    if not vals:
        return None
    counts = Counter(vals).most_common()
    first = counts[0][0]
    return first if len(counts) == 1 else f"{first} (+{len(counts) - 1} other value(s))"


def provenance_from_df(df) -> dict:
    """Device, GPU, driver, CUDA, torch (most common) and the time span of the runs."""
    if df.empty:
        return {}
    started = sorted(s for s in df["started"].dropna() if isinstance(s, str))
    finished = sorted(s for s in df["finished"].dropna() if isinstance(s, str))
    return {
        "device": _most_common(df["device"]),
        "gpu": _most_common(df["gpu"]),
        "driver": _most_common(df["driver"]),
        "cuda": _most_common(df["cuda"]),
        "torch": _most_common(df["torch"]),
        "python": _most_common(df["python"]),
        "first_started": started[0] if started else None,
        "last_finished": finished[-1] if finished else (started[-1] if started else None),
    }


def _robust_outliers(df, mode: str, below: bool) -> pd.DataFrame:
    """Paper results of ``mode`` below ½ (or above 2×) of published both as measured and
    without their stalled pairs, largest disagreement first."""
    g = df[(df["protocol"] == "paper") & (df["mode"] == mode) & (df["status"] == Status.OK) & (df["published"] > 0)]
    g = g[g["measured"].notna()]
    pub = g["published"].astype(float)
    # the ratio is computed before the selection: assigning a Series to an empty frame would
    # give the frame the Series' index (rows of NaN)
    g = g.assign(_r=g["measured"].astype(float) / pub, _clean=_without_stalls(g) / pub)
    keep = ((g["_r"] < 0.5) & (g["_clean"] < 0.5)) if below else ((g["_r"] > 2) & (g["_clean"] > 2))
    return g[keep].sort_values("_r", ascending=below)


#: What a list of tasks says when its selection holds none.
NO_TASK = "no task in this selection"


def _task_list(rows, limit: int = 10) -> str:
    """``tid published× → measured× (flags)`` for the first ``limit`` rows, or :data:`NO_TASK`."""
    if rows.empty:
        return NO_TASK
    items = [
        f"{r.tid} {fmt(r.published)}× → {fmt(r.measured)}×"
        + (f" ({md_escape(r.flags, 60)})" if isinstance(r.flags, str) and r.flags else "")
        for r in rows.head(limit).itertuples(index=False)
    ]
    more = len(rows) - limit
    return "; ".join(items) + (f"; and {more} more (per_task.md)" if more > 0 else "")


def render_findings(df) -> list[str]:
    """The report's findings, generated from the results: which published speedups hold, which
    do not, and which tasks fail the checks (with the reason of each)."""
    if df.empty:
        return []
    lines = ["## Findings (generated from the results)", ""]
    sens = stall_sensitivity(df)
    if not sens.empty:
        lines += [
            f"**Which published speedups hold** (paper protocol; |measured/published − 1| ≤ {AGREEMENT:.0%}; "
            f"in brackets: with each score taken without its stalled calls, `{stalls.FLAG}`). "
            f"Measured on {_most_common(df['gpu']) or ('the CPU' if on_cpu(df) else 'this GPU')}, published on the "
            "release's GPU:",
            "",
        ]
        for r in sens.itertuples(index=False):
            lines.append(
                f"* {_mode_label(r.mode)}: {r.measured_agree} of {r.compared} ({r.without_agree}); "
                f"below ½ {r.measured_below_half} ({r.without_below_half}), above 2× {r.measured_above_double} "
                f"({r.without_above_double}); median measured/published {fmt(r.measured_median)}"
            )
        lines.append("")
    out_lines = []
    for mode in _modes(df):
        for below, side in ((True, "below ½"), (False, "above 2×")):
            out_lines.append(f"* {_mode_label(mode)}, {side}: {_task_list(_robust_outliers(df, mode, below))}")
    if out_lines:
        lines += ["**Which do not hold** (paper protocol, below ½ or above 2× of published also without "
                  "stalled calls; flags in brackets):", "", *out_lines, ""]
    checks = df.drop_duplicates("tid")
    checks = checks[checks["check_status"].notna() & ~checks["check_status"].isin([Status.PASS, Status.NO_CODE])]
    if len(checks):
        lines += ["**Tasks that fail the checks** (every mode carries the check's status):", ""]
        for r in checks.sort_values(["level", "task"]).itertuples(index=False):
            reason = str(r.reason or "").removeprefix("check: ")
            lines.append(f"* {r.tid} — {r.check_status}: {md_escape(reason, 200)}")
        lines.append("")
    cls = df["status"].map(status_class)
    one_mode = df[(cls == "failed") & (df["check_status"] == Status.PASS)]
    if len(one_mode):
        lines += ["**Failures in one mode** (the check passed):", ""]
        for r in one_mode.sort_values(["level", "task"]).itertuples(index=False):
            lines.append(f"* {r.tid}, {_mode_label(r.mode)} ({r.protocol}) — {r.status}: {md_escape(r.reason, 200)}")
        lines.append("")
    return lines


_ENV_LABELS = {
    "device": "Release device",
    "gpu": "GPU",
    "driver": "Driver",
    "cuda": "CUDA",
    "torch": "PyTorch",
    "python": "Python",
    "first_started": "First run started",
    "last_finished": "Last run finished",
}


def _environment_lines(prov: dict, generated: str) -> list[str]:
    """The report's environment table: the known provenance keys, then the others."""
    rows = [[_ENV_LABELS[k], md_escape(prov.get(k)) or NA] for k in _ENV_LABELS]
    rows += [[md_escape(k), md_escape(v)] for k, v in prov.items() if k not in _ENV_LABELS]
    rows.append(["Report generated", generated])
    return [md_table(rows, ["", ""]), ""]


def _mean_speedup_rows(df) -> list[list]:
    """Per protocol and mode: mean and geometric mean speedup, published and measured."""
    rows = []
    for proto in _protocols(df):
        for mode in _modes(df):
            if df[(df["protocol"] == proto) & (df["mode"] == mode)].empty:
                continue
            pub = summary_table(df, mode, proto, published=True, levels=[])
            meas = summary_table(df, mode, proto, published=False, levels=[])
            conv = "no score = 1.0" if MISSING_AS_ONE.get(mode, False) else "scored only"
            rows.append(
                [
                    proto,
                    _mode_label(mode),
                    fmt(pub.at["Mean", "All"]),
                    fmt(meas.at["Mean", "All"]),
                    fmt(pub.at["GeoMean", "All"]),
                    fmt(meas.at["GeoMean", "All"]),
                    conv,
                ]
            )
    return rows


def _outcome_lines(df) -> list[str]:
    """The report's outcome: counts by status, then the mean speedups."""
    if not len(df):
        return ["## Outcome", "", "No results.", ""]
    counts = status_counts(df)
    tot = counts[["measured", "failed", "not_run", "missing", "total"]].sum()
    headers = ["Protocol", "Mode", "Mean published", "Mean measured", "GeoMean published", "GeoMean measured"]
    return [
        "## Outcome",
        "",
        f"Over all protocol × mode combinations: **{tot['measured']} measured**, "
        f"**{tot['failed']} failed**, {tot['not_run']} not run (e.g. no released code), "
        f"**{tot['missing']} missing** of {tot['total']}.",
        "",
        _status_table(df),
        "",
        "Mean speedup over all tasks (published → measured):",
        "",
        md_table(
            _mean_speedup_rows(df),
            [*headers, "Convention"],
            ["left", "left", "right", "right", "right", "right", "left"],
        ),
        "",
    ]


def _files_lines(figures: list, tables: dict) -> list[str]:
    """Links to the tables, then the figures with their captions."""
    lines = ["## Files", ""]
    lines += [f"- [{text}]({rel})" for text, rel in (tables or {}).items()]
    lines.append("")
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            rel, caption = fig if isinstance(fig, (tuple, list)) else (fig, Path(fig).stem.replace("_", " "))
            lines += [f"**{caption}**", "", f"![{caption}]({rel})", ""]
    return lines


def render_report(df, provenance: dict, figures: list, tables: dict) -> str:
    """``results/{device}/README.md``.

    ``provenance``: keys such as device, gpu, driver, cuda, torch, python,
    first_started, last_finished, generated (others are listed as well).
    ``figures``: relative paths, or (relative path, caption) pairs.
    ``tables``: link text -> relative path (e.g. {"Per-task scores (CSV)": "scores.csv"}).
    """
    prov = dict(provenance or {})
    device = prov.get("device") or (_most_common(df["device"]) if len(df) else None) or "unknown device"
    generated = prov.pop("generated", None) or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    transfer = prov.pop("transfer", None)  # where published and where measured, when they differ
    n_tasks = df["tid"].nunique() if len(df) else 0
    modes = ", ".join(_mode_label(m) for m in _modes(df)) if len(df) else "none"
    protocols = ", ".join(_protocols(df)) if len(df) else "none"
    lines = [
        f"# CUDA-L1 re-measurement: {device}",
        "",
        f"The CUDA-L1 kernels released for **{device}** were re-timed against their KernelBench "
        f"reference programs: {n_tasks} tasks, modes {modes}, timing protocol(s) {protocols}. "
        "Each measured speedup (reference time / CUDA-L1 time) is compared with the published one.",
        "",
        *([f"**{transfer[0].upper()}{transfer[1:]}.**", ""] if transfer else []),
        *([f"**{timing}**", ""] if (timing := timing_version_sentence(df)) else []),
        *what_was_timed_lines(df),
        "## Environment",
        "",
    ]
    lines += _environment_lines(prov, generated)
    lines += _outcome_lines(df)
    lines += render_findings(df)
    lines += _files_lines(figures, tables)
    return "\n".join(lines).rstrip() + "\n"


def relpath(target, start_dir) -> str:
    """POSIX relative path from ``start_dir`` to ``target`` (for Markdown links)."""
    return Path(os.path.relpath(Path(target), Path(start_dir))).as_posix()
