"""A task selection (e.g. the 41-task h100 slice) measured next to published, from the per-task
result table (``scores.csv``): per protocol and mode the statuses and the share of tasks whose
measured score is within a tolerance of the published one, then per task its check status,
each paper mode, strict default and every detector flag. The rule ``slice_report`` runs it:

    python -m l1bench.aggregate.slices results/h100/scores.csv config/slices/h100_slice41.yaml \
        --out results/h100/slices/h100_slice41.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from l1bench import release as rel
from l1bench.aggregate.conventions import MODE_LABELS, NA
from l1bench.aggregate.markdown import fmt as _fmt
from l1bench.aggregate.markdown import md_table
from l1bench.aggregate.stats import ratio_stats
from l1bench.io import write_page
from l1bench.modes import NAMES
from l1bench.results import AGREEMENT, Status


def tid_of(task: str) -> str:
    """``"1/19"`` or ``"L1_T019"`` → ``"L1_T019"``; anything else is a clear error."""
    try:
        return rel.task_id(*rel.parse_task_selector(task))
    except rel.ReleaseError as err:
        raise ValueError(str(err)) from None


def load_task_list(path) -> list[str]:
    """Task ids from a YAML file with a ``tasks:`` list (the workflow's slice configs)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data.get("tasks"), list):
        raise ValueError(f"{path}: no 'tasks:' list")
    return [tid_of(t) for t in data["tasks"]]


def _num(x) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _flags(value) -> list[str]:
    if not isinstance(value, str) or not value.strip():
        return []
    return [f.strip() for f in value.replace(";", ",").split(",") if f.strip()]


def agreement(df: pd.DataFrame, tol: float = AGREEMENT) -> pd.DataFrame:
    """Per protocol and mode: tasks with a measured and a published score, how many agree
    within ``tol`` (|measured/published − 1| ≤ tol), their share and the median ratio."""
    rows = []
    for (protocol, mode), g in df.groupby(["protocol", "mode"], sort=False):
        both = g[(g["status"] == Status.OK) & g["published"].notna() & g["measured"].notna()]
        st = ratio_stats(both["measured"] / both["published"], tol)
        rows.append(
            {
                "protocol": protocol,
                "mode": mode,
                "compared": st["compared"],
                "within": st["within"],
                "share": st["within"] / st["compared"] if st["compared"] else None,
                "median_ratio": st["median_ratio"] if st["compared"] else None,
            }
        )
    return pd.DataFrame(rows, columns=["protocol", "mode", "compared", "within", "share", "median_ratio"])


def _cell(row) -> str:
    """One mode of one task: ``measured (published)`` or the status."""
    if row is None:
        return "missing"
    if row["status"] == Status.OK:
        return f"{_fmt(row['measured'])} ({_fmt(row['published'])})"
    return str(row["status"])


def slice_rows(df: pd.DataFrame, tids: list[str]) -> list[list[str]]:
    """Per task: check status, each paper mode, strict default, and every flag seen."""
    by_key = {(r["tid"], r["protocol"], r["mode"]): r for r in df.to_dict("records")}
    rows = []
    for tid in tids:
        any_row = next((by_key[k] for k in by_key if k[0] == tid), None)
        if any_row is None:
            rows.append([tid, "missing"] + ["missing"] * (len(NAMES) + 1) + [""])
            continue
        check = any_row.get("check_status")
        check = any_row.get("code_status") if not isinstance(check, str) else check
        cells = [_cell(by_key.get((tid, "paper", m))) for m in NAMES]
        strict = by_key.get((tid, "strict", "default"))
        flags: list[str] = []
        for k, r in by_key.items():
            if k[0] == tid:
                flags += [f for f in _flags(r.get("flags")) if f not in flags]
        rows.append([tid, str(check), *cells, _cell(strict) if strict else NA, ", ".join(flags)])
    return rows


def slice_report(df: pd.DataFrame, tids: list[str], tol: float = AGREEMENT, title: str = "") -> str:
    """Markdown: agreement per mode on the selection, then the per-task matrix."""
    sel = df[df["tid"].isin(tids)]
    missing = sorted(set(tids) - set(sel["tid"]))
    statuses = sel.groupby(["protocol", "mode"])["status"].value_counts().unstack(fill_value=0)
    lines = [f"# {title or 'Task selection'}: measured next to published", ""]
    lines += [
        f"{len(tids)} tasks. Cells: measured (published) speedup, or the result's status. "
        f"Agreement: |measured/published − 1| ≤ {tol:.0%} among tasks with both scores.",
        "",
    ]
    ag = agreement(sel, tol)
    rows = []
    for r in ag.itertuples():
        st = statuses.loc[(r.protocol, r.mode)] if (r.protocol, r.mode) in statuses.index else {}
        counts = ", ".join(f"{k} {int(v)}" for k, v in st.items() if v) if len(st) else ""
        share = NA if r.share is None else f"{r.share:.0%}"
        label = MODE_LABELS.get(r.mode, r.mode)
        rows.append([r.protocol, label, counts, f"{r.within}/{r.compared}", share, _fmt(r.median_ratio)])
    lines.append(md_table(rows, ["Protocol", "Mode", "Statuses", "Within tol.", "Share", "Median measured/published"]))
    lines += ["", "## Per task", ""]
    headers = ["Task", "Check", *(MODE_LABELS[m] for m in NAMES), "Strict default", "Flags"]
    lines.append(md_table(slice_rows(sel, tids), headers))
    if missing:
        lines += ["", f"No result at all for: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scores", help="scores.csv written by aggregate_results")
    ap.add_argument("tasks", help="YAML file with a tasks: list")
    ap.add_argument("--tol", type=float, default=AGREEMENT)
    ap.add_argument("--title", default="")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    try:
        df = pd.read_csv(args.scores)
        text = slice_report(df, load_task_list(args.tasks), args.tol, args.title or Path(args.tasks).stem)
    except (OSError, ValueError, KeyError) as err:
        print(f"slices: {err}", file=sys.stderr)
        return 2
    write_page(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
