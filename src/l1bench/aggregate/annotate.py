"""Annotation: flags the tables add to a loaded table (ceiling, reference scan, extension build
failures) and flags they withdraw (curation files). The raw result files keep theirs.
"""

from __future__ import annotations

import pandas as pd

from ..results import Flag, Status
from .conventions import MISSING


def _append_flag(df: pd.DataFrame, rows, name: str) -> pd.DataFrame:
    """A copy of ``df`` with flag ``name`` appended on the selected rows."""
    df = df.copy()
    flags = df["flags"].fillna("").astype(str)
    df.loc[rows, "flags"] = [f if name in f.split(";") else ";".join(filter(None, [f, name])) for f in flags[rows]]
    return df


def _rows_with_code(df: pd.DataFrame, tids) -> pd.Series:
    """The rows of tasks ``tids`` that ran code (not ``no_code``, not missing)."""
    return df["tid"].isin(tids) & (df["status"] != Status.NO_CODE) & (df["status"] != MISSING)


def add_ceiling_flags(df: pd.DataFrame, ceiling: float | None) -> pd.DataFrame:
    """Flag measured speedups above ``ceiling`` for review (SPEEDUP_CEILING)."""
    if ceiling is None or df.empty or "measured" not in df:
        return df
    return _append_flag(df, pd.to_numeric(df["measured"], errors="coerce") > ceiling, Flag.SPEEDUP_CEILING)


def add_extension_flags(df: pd.DataFrame, annotations: dict) -> pd.DataFrame:
    """EXTENSION_BUILD_FAILED on every row (with code) of a task listed in ``annotations``
    (``{"tasks": {tid: {...}}}``, e.g. ``extension_failures.json``) that lacks it."""
    tids = set((annotations or {}).get("tasks", {}))
    if df.empty or not tids:
        return df
    # rows that have it are left as they are
    return _append_flag(df, _rows_with_code(df, tids), Flag.EXTENSION_BUILD_FAILED)


def withdraw_flags(df: pd.DataFrame, withdrawn: dict) -> pd.DataFrame:
    """Leave out flags listed in ``withdrawn`` (``{"tasks": {tid: {flag: reason}}}``, e.g.
    ``withdrawn_flags.json``): flags a later detector fix showed to be false on results made
    before it. The raw result files keep them."""
    tasks = (withdrawn or {}).get("tasks", {})
    if df.empty or not tasks:
        return df
    df = df.copy()
    flags = df["flags"].fillna("").astype(str)
    for i in df.index[df["tid"].isin(tasks)]:
        drop = set(tasks[df.at[i, "tid"]])
        df.at[i, "flags"] = ";".join(f for f in flags[i].split(";") if f and f not in drop)
    return df


def add_code_flags(df: pd.DataFrame, scan: dict) -> pd.DataFrame:
    """SELF_TIMED on every row (with code) of a task whose custom code times itself
    (``{tid: {"self_timed": [...]}}``, :func:`l1bench.codescan.scan_tasks`)."""
    tids = {tid for tid, found in (scan or {}).items() if found.get("self_timed")}
    if df.empty or not tids:
        return df
    return _append_flag(df, _rows_with_code(df, tids), Flag.SELF_TIMED)


#: Pairs of repeated runs in which a task's score must have moved beyond the tolerance for
#: ``RUN_SPREAD`` (one pair could be chance).
RUN_SPREAD_MIN_PAIRS = 2


def add_spread_flags(df: pd.DataFrame, note: dict, min_pairs: int = RUN_SPREAD_MIN_PAIRS) -> pd.DataFrame:
    """RUN_SPREAD on the rows of the note's mode and protocol (``run_spread.json``,
    made by the lab's ``l1lab spread spreads``) of each task whose score moved beyond the tolerance in
    ``min_pairs`` pairs of repeated runs or more."""
    tids = {tid for tid, t in ((note or {}).get("tasks") or {}).items() if t.get("over", 0) >= min_pairs}
    if df.empty or not tids:
        return df
    rows = df["tid"].isin(tids) & (df["mode"] == note.get("mode", "default"))
    if "protocol" in df:
        rows &= df["protocol"] == note.get("protocol", "paper")
    return _append_flag(df, rows, Flag.RUN_SPREAD)


def add_scan_flags(df: pd.DataFrame, scan: dict) -> pd.DataFrame:
    """DEGENERATE_TASK on every row of a task whose reference output is constant or zero."""
    bad = {tid for tid, r in scan.items() if r.get("verdict") in ("zero", "constant")}
    if df.empty or not bad:
        return df
    return _append_flag(df, df["tid"].isin(bad), Flag.DEGENERATE_TASK)


def add_timed(df: pd.DataFrame, extension: dict[str, bool]) -> pd.DataFrame:
    """The ``timed`` column of each score (the others: empty): what its custom code ran, by its
    flags once final and ``extension`` (``{tid: builds an extension}``, of the tasks whose code was
    scanned: :func:`l1bench.codescan.extension_tasks`): ``fallback`` (EXTENSION_BUILD_FAILED),
    ``kernel`` (its extension built), ``pytorch`` (it builds none); empty where it was not scanned."""
    if df.empty:
        return df
    failed = df["flags"].fillna("").astype(str).str.split(";").map(lambda f: Flag.EXTENSION_BUILD_FAILED in f)
    code = df["tid"].map(lambda tid: {True: "kernel", False: "pytorch"}.get(extension.get(tid)))
    timed = code.where(~failed, "fallback")
    return df.assign(timed=timed.where(df["status"] == Status.OK, None))
