"""One device's tables, figures and report from its results (the rule ``aggregate_results``).

``scripts/aggregate_results.py`` passes the rule's named inputs and outputs and its parameters to
:func:`make_tables`; what the tables were made from is recorded beside them
(:mod:`l1bench.tables_inputs`, with :func:`l1bench.tables_inputs.table_params`).

Inputs (each a list of paths): ``meta`` (the tasks' meta.json), ``check``, ``time``, and, where
present, ``scan`` (reference scans), ``extension_failures``, ``run_spread`` and
``withdrawn_flags`` (curation notes); ``stale`` (the marker that made a run re-render them) is
not read. Outputs: ``csv``, ``summary``, ``per_task``, ``scatter``, ``ratios``, ``report``,
``extensions`` and, where given, ``record``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from l1bench import codescan, extensions, tables_inputs
from l1bench.io import atomic_path, atomic_write_text

from . import tolerance, transfer
from .annotate import (
    add_ceiling_flags,
    add_code_flags,
    add_extension_flags,
    add_scan_flags,
    add_spread_flags,
    add_timed,
    withdraw_flags,
)
from .figures import plot_measured_vs_published, plot_ratio_hist
from .load import load_results
from .markdown import render_per_task_markdown, render_summary_markdown, timing_version_caption
from .report import provenance_from_df, relpath, render_report
from .stats import status_counts

log = logging.getLogger("aggregate")

#: Hand-written notes beside the generated report, linked when present.
NOTES = {
    "Custom extensions that do not build (extension_failures.md)": "extension_failures.md",
}
#: Curation notes among the inputs, and how each annotates the table.
CURATION = (
    ("extension_failures", add_extension_flags),
    ("run_spread", add_spread_flags),
    ("withdrawn_flags", withdraw_flags),
)


def as_list(x) -> list:
    """A named input as a list of paths (None: none; one path: one)."""
    if x is None:
        return []
    if isinstance(x, (str, Path)):
        return [x]
    return list(x)


def _json(path) -> dict:
    return json.loads(Path(path).read_text())


def scores(inputs: Mapping, device: str, ceiling=None) -> pd.DataFrame:
    """Every score of the results, one row per task × mode × protocol, with every flag."""
    meta = as_list(inputs.get("meta"))
    df = add_ceiling_flags(load_results(meta, as_list(inputs.get("check")), as_list(inputs.get("time"))), ceiling)
    for scan in as_list(inputs.get("scan")):
        df = add_scan_flags(df, _json(scan))
    df = add_code_flags(df, codescan.scan_tasks(meta))  # the custom snippets beside meta.json
    for name, annotate in CURATION:
        for note in as_list(inputs.get(name)):
            df = annotate(df, _json(note))
    df = add_timed(df, codescan.extension_tasks(meta))  # what each score's code ran, its flags final
    if len(df) and "device" in df:
        df["device"] = df["device"].fillna(device)
    return df


def report_text(df: pd.DataFrame, out: Mapping, device: str, note: str | None, slices: Iterable[str]) -> str:
    """The device's report (README.md): provenance, figures, the tables and notes beside it."""
    report_dir = Path(out["report"]).parent
    # the configured slice reports, and any other beside the tables (made by an earlier run)
    slices = list(slices or [])
    slices += sorted(p.stem for p in (report_dir / "slices").glob("*.md") if p.stem not in slices)
    rel = lambda p: relpath(p, report_dir)  # noqa: E731
    prov = {"device": device, **{k: v for k, v in provenance_from_df(df).items() if k != "device"}}
    prov |= {"transfer": note} if note else {}
    return render_report(
        df,
        prov,
        figures=[
            (rel(out["scatter"]), "Measured vs published speedup per task"),
            (rel(out["ratios"]), "Distribution of measured / published"),
        ],
        tables={
            "Summary statistics, published next to measured (summary.md)": rel(out["summary"]),
            "Per-task results, largest disagreements first (per_task.md)": rel(out["per_task"]),
            "All scores, one row per task × mode × protocol (scores.csv)": rel(out["csv"]),
            **{f"Task selection {name} (slices/{name}.md)": f"slices/{name}.md" for name in slices},
            **{text: name for text, name in NOTES.items() if (report_dir / name).is_file()},
        },
    )


def make_tables(
    inputs: Mapping,
    out: Mapping,
    device: str,
    ceiling=None,
    slices: Iterable[str] = (),
    tolerances=None,
    paper_tolerance=None,
) -> pd.DataFrame:
    """Write the device's tables, figures and report (``out``: the outputs by name) from its
    results (``inputs``: lists of paths by name); ``ceiling``: config detectors.speedup_ceiling;
    ``slices``: the configured slice reports; ``tolerances``: the correctness tolerances of the
    pass-rate tables; ``paper_tolerance``: the paper protocol's (atol, rtol). Returns the scores."""
    check = as_list(inputs.get("check"))
    log.info("device %s: %d meta, %d check, %d time files", device, len(as_list(inputs.get("meta"))),
             len(check), len(as_list(inputs.get("time"))))
    df = scores(inputs, device, ceiling)
    log.info("loaded %d rows (%d tasks)", len(df), df["tid"].nunique() if len(df) else 0)
    with atomic_path(out["csv"]) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    tol_summary, tol_per_task = tolerance.sections(check, paper_tolerance, tolerances)
    note = transfer.tree_transfer_note(device, df)  # published on one GPU, measured on another
    atomic_write_text(out["summary"], render_summary_markdown(df, note) + tol_summary)
    atomic_write_text(out["per_task"], render_per_task_markdown(df) + tol_per_task)
    caption = timing_version_caption(df)  # both figures' second title line
    plot_measured_vs_published(df, out["scatter"], caption=caption)
    plot_ratio_hist(df, out["ratios"], caption=caption)
    report_dir = Path(out["report"]).parent
    notes = as_list(inputs.get("extension_failures"))
    atomic_write_text(out["extensions"], extensions.render(report_dir, device, notes[0] if notes else None))
    atomic_write_text(out["report"], report_text(df, out, device, note, slices))
    if out.get("record"):
        # what the tables read (not the stale marker that made this run re-render them)
        read = [p for name, paths in inputs.items() if name != "stale" for p in as_list(paths)]
        params = tables_inputs.table_params(device, ceiling, tolerances)
        tables_inputs.write_record(out["record"], report_dir, read, params)
    counts = status_counts(df)
    if len(counts):
        tot = counts[["measured", "failed", "not_run", "missing"]].sum()
        log.info("measured %d, failed %d, not run %d, missing %d", *tot.tolist())
    log.info("wrote %s", ", ".join(str(p) for p in out.values()))
    return df
