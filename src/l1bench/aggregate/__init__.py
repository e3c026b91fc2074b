"""Aggregate per-task results into tables, statistics, figures and a report.

Pure functions over the JSON files written by the earlier stages (``meta.json``
per task, ``check/{tid}.json``, ``time/{protocol}/{mode}/{tid}.json``). CPU only;
matplotlib is imported lazily (Agg backend) inside the figure functions.

Statistics follow the CUDA-L1 README (see :data:`MISSING_AS_ONE`). Verified
against the published release files: with this convention and numpy's linear
percentiles, the README's mean row is reproduced for every GPU and mode
(h100: 3.85 / 2.74 / 2.77 / 2.23), and the A100 table's Torch Compile, Torch
Compile RO and CUDA Graph rows (mean, max, quartiles, Speedup counts, all levels)
match exactly. The A100 *Default* row (3.12x, max 120x) does not match the
released ``a100.json`` (2.97x, max 110.8x).

Layers, in pipeline order; each submodule imports only from the ones above it:

* :mod:`.conventions` — vocabulary: columns, status groups, mode labels, mode/protocol order, ``NA``,
  statistic rows, the missing-score convention (``MISSING_AS_ONE``).
* :mod:`.load` — the JSON result files into one tidy table (``load_results``).
* :mod:`.annotate` — flags added by the tables (ceiling, reference scan, code scan, extension failures) or
  withdrawn, and what each score's code ran (``timed``).
* :mod:`.stats` — summary statistics, status counts, ratios, flag counts, stall sensitivity, timing versions,
  what was timed.
* :mod:`.markdown` — formatting and the ``summary.md`` / ``per_task.md`` pages.
* :mod:`.report` — the device README (findings, provenance) and ``relpath``.
* :mod:`.figures` — the matplotlib figures, their numbers the tables' (``annotations``).
* :mod:`.tables` — one device's tables, figures and report from its results (``make_tables``, the
  job of ``scripts/aggregate_results.py``).

This module re-exports the names used outside the package (the tests); other code imports from
the submodule that defines a name.
"""

from .annotate import (
    add_ceiling_flags,
    add_code_flags,
    add_extension_flags,
    add_scan_flags,
    add_spread_flags,
    add_timed,
    withdraw_flags,
)
from .conventions import MISSING_AS_ONE, STAT_ROWS
from .figures import annotations, plot_measured_vs_published, plot_ratio_hist
from .load import load_results
from .markdown import render_per_task_markdown, render_summary_markdown
from .report import provenance_from_df, relpath, render_findings, render_report
from .stats import stall_sensitivity, status_counts, summary_stats, summary_table

__all__ = [
    "MISSING_AS_ONE",
    "STAT_ROWS",
    "add_ceiling_flags",
    "add_code_flags",
    "add_extension_flags",
    "add_scan_flags",
    "add_spread_flags",
    "add_timed",
    "annotations",
    "load_results",
    "plot_measured_vs_published",
    "plot_ratio_hist",
    "provenance_from_df",
    "relpath",
    "render_findings",
    "render_per_task_markdown",
    "render_report",
    "render_summary_markdown",
    "stall_sensitivity",
    "status_counts",
    "summary_stats",
    "summary_table",
    "withdraw_flags",
]
