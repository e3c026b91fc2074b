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
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from . import results, stalls
from .release import MODES, parse_task_id
from .results import AGREEMENT, Flag, Status

# --------------------------------------------------------------------------- conventions

#: Per mode: do tasks without a score count as 1.0x in the statistics?
#: The CUDA-L1 README does so for default, torch_compile and
#: torch_compile_reduce_overhead (a task that failed falls back to the reference:
#: speedup 1.0, mean/percentiles/geomean over all tasks), but averages only the
#: scored tasks for cuda_graph (its Speedup column reads e.g. "147/229"). The
#: README has no cudnn row; we choose the cuda_graph convention for cudnn because
#: it, too, compares against a separate baseline snippet that may be absent.
MISSING_AS_ONE = {
    "default": True,
    "torch_compile": True,
    "torch_compile_reduce_overhead": True,
    "cuda_graph": False,
    "cudnn": False,
}

#: Display names, as in the CUDA-L1 README.
MODE_LABELS = {
    "default": "Default",
    "torch_compile": "Torch Compile",
    "torch_compile_reduce_overhead": "Torch Compile RO",
    "cuda_graph": "CUDA Graph",
    "cudnn": "cuDNN",
}

#: Known timing protocols, in display order (others sort after, alphabetically).
PROTOCOLS = ("paper", "strict")

#: Rows of a summary table, in order.
STAT_ROWS = ("Mean", "Max", "75%", "50%", "25%", "Success", "Speedup", "GeoMean")

#: A score above this counts as a speedup (README: ">1.01x out of total").
SPEEDUP_THRESHOLD = 1.01

#: Statuses meaning "ran and failed" (the custom code or the baseline; or broke in every
#: attempt: the worker crashed or timed out) and "not attempted, by design": l1bench.results.
FAILED_STATUSES = results.FAILED_STATUSES
NOT_RUN_STATUSES = results.NOT_RUN_STATUSES
#: Status of a task/mode with meta but no time file.
MISSING = "missing"

COLUMNS = [
    "device",
    "level",
    "task",
    "tid",
    "mode",
    "protocol",
    "status",
    "reason",
    "published",
    "measured",
    "std",
    "n_timings",
    "ratio",
    "flags",
    "check_status",
    "gpu",
    "driver",
    "cuda",
    "torch",
    "started",
    # extras beyond the brief, useful when reading scores.csv
    "code_status",
    "ci95_lo",
    "ci95_hi",
    "finished",
    "python",
    # paper protocol: timed calls stretched by a host-side stall (l1bench.stalls) and the score
    # without the pairs that hold one (the measured score itself is the harness's, unchanged)
    "stalled_calls",
    "score_without_stalls",
    # how timed sections were kept clean (worker.TIMING_DESIGN; 1 = before the isolation work)
    "timing_design",
]

NA = "–"  # shown for a missing number


# --------------------------------------------------------------------------- loading


def _read_json(path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _num(val) -> float:
    """Finite float or NaN."""
    if val is None or isinstance(val, bool):
        return math.nan
    try:
        f = float(val)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def _append_flag(df: pd.DataFrame, rows, name: str) -> pd.DataFrame:
    """A copy of ``df`` with flag ``name`` appended on the selected rows."""
    df = df.copy()
    flags = df["flags"].fillna("").astype(str)
    df.loc[rows, "flags"] = [f if name in f.split(";") else ";".join(filter(None, [f, name])) for f in flags[rows]]
    return df


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
    rows = df["tid"].isin(tids) & (df["status"] != Status.NO_CODE) & (df["status"] != MISSING)
    return _append_flag(df, rows, Flag.EXTENSION_BUILD_FAILED)  # rows that have it are left as they are


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


def add_scan_flags(df: pd.DataFrame, scan: dict) -> pd.DataFrame:
    """DEGENERATE_TASK on every row of a task whose reference output is constant or zero."""
    bad = {tid for tid, r in scan.items() if r.get("verdict") in ("zero", "constant")}
    if df.empty or not bad:
        return df
    return _append_flag(df, df["tid"].isin(bad), Flag.DEGENERATE_TASK)


def _flag_names(*flag_lists) -> str:
    names: list[str] = []
    for flags in flag_lists:
        for f in flags or ():
            name = f.get("flag") if isinstance(f, dict) else str(f)
            if name and name not in names:
                names.append(str(name))
    return ";".join(names)


def _combo_from_path(path) -> tuple[str, str, str] | None:
    """(protocol, mode, tid) from ``.../time/{protocol}/{mode}/{tid}.json``."""
    parts = Path(path).parts
    if len(parts) >= 4 and parts[-4] == "time" and parts[-1].endswith(".json"):
        return parts[-3], parts[-2], Path(parts[-1]).stem
    return None


def _protocol_key(p) -> tuple:
    return (PROTOCOLS.index(p), "") if p in PROTOCOLS else (len(PROTOCOLS), str(p))


def _mode_key(m) -> tuple:
    return (MODES.index(m), "") if m in MODES else (len(MODES), str(m))


def load_results(meta_paths, check_paths, time_paths, modes=None, protocols=None) -> pd.DataFrame:
    """Tidy table, one row per task x mode x protocol (see :data:`COLUMNS`).

    Tasks come from the meta files. The (protocol, mode) combinations come from
    the time files (their content, else their path ``time/{protocol}/{mode}/``;
    a listed path that does not exist still declares its combination), or from
    ``modes`` x ``protocols`` when given (time files outside those are ignored);
    with no time information at all, protocol "paper" x all :data:`MODES`. A task with meta but no time file for a
    combination gets status ``"missing"``. ``measured`` is the score of an
    ``"ok"`` result, else NaN; ``ratio`` is measured / published.
    """
    metas: dict[str, dict] = {}
    for p in meta_paths:
        m = _read_json(p)
        if m is None:
            continue
        tid = m.get("tid") or Path(p).parent.name
        metas[tid] = m

    checks: dict[str, dict] = {}
    for p in check_paths:
        c = _read_json(p)
        if c is None:
            continue
        checks[c.get("tid") or Path(p).stem] = c

    times: dict[tuple[str, str, str], dict] = {}
    combos: set[tuple[str, str]] = set()
    for p in time_paths:
        from_path = _combo_from_path(p)
        t = _read_json(p)
        if t is None:
            if from_path:
                combos.add(from_path[:2])
            continue
        proto = t.get("protocol") or (from_path[0] if from_path else "paper")
        mode = t.get("mode") or (from_path[1] if from_path else "default")
        tid = t.get("tid") or (from_path[2] if from_path else Path(p).stem)
        combos.add((proto, mode))
        times[(proto, mode, tid)] = t

    if modes is not None or protocols is not None:
        ms = list(modes) if modes is not None else sorted({m for _, m in combos}, key=_mode_key)
        ps = list(protocols) if protocols is not None else sorted({p for p, _ in combos}, key=_protocol_key)
        combos = {(p, m) for p in ps for m in ms}

    if not combos and metas:  # nothing timed at all: every task is missing in every mode
        combos = {("paper", m) for m in MODES}

    tids = set(metas) | {tid for (p, m, tid) in times if (p, m) in combos}
    rows = []
    for proto, mode in combos:
        for tid in tids:
            meta = metas.get(tid, {})
            t = times.get((proto, mode, tid))
            if t is None and not meta:
                continue  # a time file of another combination only
            rows.append(_row(tid, mode, proto, meta, checks.get(tid, {}), t))

    df = pd.DataFrame(rows, columns=COLUMNS)
    if df.empty:
        return df
    df["_p"] = df["protocol"].map(_protocol_key)
    df["_m"] = df["mode"].map(_mode_key)
    df = df.sort_values(["device", "_p", "_m", "level", "task"], na_position="last", kind="stable")
    df = df.drop(columns=["_p", "_m"]).reset_index(drop=True)
    df["level"] = df["level"].astype("Int64")
    df["task"] = df["task"].astype("Int64")
    df["n_timings"] = df["n_timings"].astype("Int64")
    df["stalled_calls"] = df["stalled_calls"].astype("Int64")
    return df


def _row(tid, mode, proto, meta: dict, check: dict, t: dict | None) -> dict:
    level, task = meta.get("level"), meta.get("task")
    if t is not None:
        level = level if level is not None else t.get("level")
        task = task if task is not None else t.get("task")
    if level is None or task is None:
        try:
            level, task = parse_task_id(tid)
        except (ValueError, IndexError):
            pass
    published = _num((meta.get("published") or {}).get(mode))
    if t is None:
        t = {}
        status, reason = MISSING, "no time result"
    else:
        status = t.get("status") or "unknown"
        reason = t.get("reason") or ""
    score = _num(t.get("score"))
    measured = score if status == Status.OK else math.nan
    ratio = measured / published if published > 0 and not math.isnan(measured) else math.nan
    prov = t.get("provenance") or {}
    strict = t.get("strict") or {}
    ci = strict.get("ci95") if isinstance(strict, dict) else None
    ci = ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
    n_timings = t.get("n_timings")
    stall = None
    if status == Status.OK and proto == "paper":
        stall = stalls.rescore(t.get("ref_ms") or [], t.get("custom_ms") or [])
    stall_flag = stalls.outlier_flag(t | {"protocol": proto}) if stall and stall["stalled_calls"] else None
    return {
        "device": meta.get("device"),
        "level": level,
        "task": task,
        "tid": tid,
        "mode": mode,
        "protocol": proto,
        "status": status,
        "reason": reason,
        "published": published,
        "measured": measured,
        "std": _num(t.get("score_std")),
        "n_timings": n_timings if isinstance(n_timings, int) and not isinstance(n_timings, bool) else None,
        "ratio": ratio,
        "flags": _flag_names(t.get("flags"), check.get("flags"), [stalls.FLAG] if stall_flag else []),
        "check_status": check.get("status"),
        "gpu": prov.get("gpu"),
        "driver": prov.get("driver"),
        "cuda": prov.get("cuda"),
        "torch": prov.get("torch"),
        "started": prov.get("started"),
        "code_status": meta.get("code_status"),
        "ci95_lo": _num(ci[0]),
        "ci95_hi": _num(ci[1]),
        "finished": prov.get("finished"),
        "python": prov.get("python"),
        "stalled_calls": stall["stalled_calls"] if stall else None,
        "score_without_stalls": _num(stall["score_without"]) if stall and stall["stalled_calls"] else math.nan,
        "timing_design": (t.get("timing_design") or 1) if status == Status.OK else None,
    }


# --------------------------------------------------------------------------- statistics


def summary_stats(scores, n_total: int | None = None, fill_missing_as_one: bool = True) -> dict:
    """README-style statistics of per-task scores (NaN/None = task without a score).

    ``n_total`` is the number of tasks (default: ``len(scores)``); tasks absent
    from ``scores`` count as unscored. With ``fill_missing_as_one`` every
    unscored task counts as 1.0 and the statistics run over all ``n_total``
    tasks; otherwise only scored tasks are used. Percentiles: numpy, linear
    interpolation. ``Success`` = scored / total; ``Speedup`` = tasks above 1.01
    out of the tasks the statistics run over (README: "147/229" for CUDA Graph).
    Returns the keys of :data:`STAT_ROWS` (floats, NaN when there is nothing to
    average; Success/Speedup as "n/total" strings).
    """
    arr = pd.to_numeric(pd.Series(scores, dtype="object"), errors="coerce").to_numpy(dtype=float)
    scored = arr[np.isfinite(arr)]
    n_total = len(arr) if n_total is None else int(n_total)
    if n_total < len(scored):
        raise ValueError(f"n_total={n_total} is smaller than the {len(scored)} scored tasks")
    values = np.concatenate([scored, np.ones(n_total - len(scored))]) if fill_missing_as_one else scored
    out = dict.fromkeys(STAT_ROWS, math.nan)
    if len(values):
        p75, p50, p25 = np.percentile(values, [75, 50, 25], method="linear")
        out.update(
            {
                "Mean": float(values.mean()),
                "Max": float(values.max()),
                "75%": float(p75),
                "50%": float(p50),
                "25%": float(p25),
                "GeoMean": float(np.exp(np.log(values).mean())) if (values > 0).all() else math.nan,
            }
        )
    out["Success"] = f"{len(scored)}/{n_total}"
    out["Speedup"] = f"{int((values > SPEEDUP_THRESHOLD).sum())}/{len(values)}"
    return {k: out[k] for k in STAT_ROWS}


def _levels(df) -> list[int]:
    return sorted(int(x) for x in pd.unique(df["level"].dropna()))


def _protocols(df) -> list[str]:
    return sorted(pd.unique(df["protocol"].dropna()), key=_protocol_key)


def _modes(df) -> list[str]:
    return sorted(pd.unique(df["mode"].dropna()), key=_mode_key)


def _select(df, mode, protocol=None) -> pd.DataFrame:
    sel = df[df["mode"] == mode]
    if protocol is not None:
        sel = sel[sel["protocol"] == protocol]
    return sel.drop_duplicates("tid")


def summary_table(
    df, mode: str, protocol: str | None, published: bool, levels=None, exclude_missing: bool = True
) -> pd.DataFrame:
    """Statistics (rows :data:`STAT_ROWS`) per level ("L1", ...) and "All".

    ``published`` picks the published scores instead of the measured ones, over
    the same tasks. With ``exclude_missing`` (default) tasks whose result file is
    missing (not yet run) are left out of both, so published and measured always
    cover the same task set; failed and not-run tasks stay in (they are tasks
    without a score). The missing-score convention is ``MISSING_AS_ONE[mode]``.
    """
    sel = _select(df, mode, protocol)
    if exclude_missing:
        sel = sel[sel["status"] != MISSING]
    col = "published" if published else "measured"
    fill = MISSING_AS_ONE.get(mode, False)
    levels = _levels(df) if levels is None else list(levels)
    out = {}
    for lv in levels:
        part = sel[sel["level"] == lv]
        out[f"L{lv}"] = summary_stats(part[col], len(part), fill)
    out["All"] = summary_stats(sel[col], len(sel), fill)
    return pd.DataFrame(out, index=list(STAT_ROWS))


def convention_note(mode: str) -> str:
    if MISSING_AS_ONE.get(mode, False):
        return (
            "Convention (CUDA-L1 README): tasks without a score count as 1.00 in Mean, "
            "percentiles and GeoMean; Speedup is out of all tasks."
        )
    extra = (
        " (README convention for CUDA Graph, applied to cuDNN by choice)"
        if mode == "cudnn"
        else " (CUDA-L1 README)"
    )
    return f"Convention{extra}: only tasks with a score are averaged; Speedup is out of the scored tasks."


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


def status_class(status) -> str:
    """'measured', 'failed', 'not_run' or 'missing'."""
    if status == Status.OK:
        return "measured"
    if status == MISSING:
        return "missing"
    if status in NOT_RUN_STATUSES:
        return "not_run"
    return "failed"


#: |measured/published - 1| within this counts as agreeing with the published score
#: (l1bench.results.AGREEMENT).


def ratio_stats(ratio, tol: float = AGREEMENT) -> dict:
    """Of measured/published ratios: how many, within ``tol`` of 1, below ½, above 2×, median."""
    r = pd.Series(ratio, dtype=float).dropna()
    return {
        "compared": len(r),
        "within": int(((r - 1).abs() <= tol).sum()),
        "below_half": int((r < 0.5).sum()),
        "above_double": int((r > 2.0).sum()),
        "median_ratio": float(r.median()) if len(r) else math.nan,
    }


def status_counts(df) -> pd.DataFrame:
    """Per protocol x mode: measured / failed / not_run / missing / total,
    plus tasks below half / above double their published score and the median ratio."""
    rows = []
    for proto in _protocols(df):
        for mode in _modes(df):
            sel = df[(df["protocol"] == proto) & (df["mode"] == mode)]
            if sel.empty:
                continue
            cls = sel["status"].map(status_class)
            # an "ok" row without a usable score is counted as failed
            cls = cls.where(~((cls == "measured") & sel["measured"].isna()), "failed")
            stats = ratio_stats(sel["ratio"])
            del stats["within"]
            rows.append(
                {
                    "protocol": proto,
                    "mode": mode,
                    "measured": int((cls == "measured").sum()),
                    "failed": int((cls == "failed").sum()),
                    "not_run": int((cls == "not_run").sum()),
                    "missing": int((cls == "missing").sum()),
                    "total": len(sel),
                }
                | stats
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- markdown


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


def _mode_label(mode) -> str:
    return MODE_LABELS.get(mode, str(mode))


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
            f"{r.below_half}/{r.compared}",
            f"{r.above_double}/{r.compared}",
            fmt(r.median_ratio),
        ]
        for r in counts.itertuples()
    ]
    return md_table([[str(c) for c in row] for row in rows], headers, ["left", "left"] + ["right"] * 8)


def flag_counts(df) -> tuple[list[tuple[str, str]], dict[str, dict]]:
    """(protocol x mode combinations, {flag: {combination: tasks, "any": tasks}}), flags
    ordered by the number of tasks carrying them in any combination."""
    combos = sorted({(r.protocol, r.mode) for r in df.itertuples(index=False)},
                    key=lambda c: (_protocol_key(c[0]), _mode_key(c[1]))) if len(df) else []
    tasks: dict[str, dict] = {}
    flag_lists = df["flags"].fillna("").astype(str).str.split(";") if len(df) else []
    for r, fl in zip(df.itertuples(index=False), flag_lists, strict=False):
        for flag in filter(None, fl):
            t = tasks.setdefault(flag, {"any": set()})
            t.setdefault((r.protocol, r.mode), set()).add(r.tid)
            t["any"].add(r.tid)
    counts = {f: {k: len(v) for k, v in t.items()} for f, t in tasks.items()}
    return combos, dict(sorted(counts.items(), key=lambda kv: (-kv[1]["any"], kv[0])))


def _without_stalls(g: pd.DataFrame) -> pd.Series:
    """Each row's score without its stalled pairs, or the measured score where none stalled."""
    return g["score_without_stalls"].where(g["score_without_stalls"].notna(), g["measured"]).astype(float)


def stall_sensitivity(df) -> pd.DataFrame:
    """Per paper mode: agreement with the published scores as measured, and with each score
    taken without its stalled pairs (``score_without_stalls``; scores without stalls as measured)."""
    rows = []
    sel = df[(df["protocol"] == "paper") & (df["status"] == Status.OK)] if len(df) else df
    for mode in _modes(sel) if len(sel) else []:
        g = sel[(sel["mode"] == mode) & (sel["published"] > 0) & sel["measured"].notna()]
        if g.empty:
            continue
        row = {"mode": mode, "compared": len(g), "stalled": int((g["stalled_calls"].fillna(0) > 0).sum())}
        for key, score in (("measured", g["measured"]), ("without", _without_stalls(g))):
            st = ratio_stats(score.astype(float) / g["published"].astype(float))
            row |= {
                f"{key}_agree": st["within"],
                f"{key}_below_half": st["below_half"],
                f"{key}_above_double": st["above_double"],
                f"{key}_median": st["median_ratio"],
            }
        rows.append(row)
    return pd.DataFrame(rows)


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


def _flag_table(df) -> str:
    combos, counts = flag_counts(df)
    if not counts:
        return "No flags."
    headers = ["Flag"] + [f"{_mode_label(m)} ({p})" for p, m in combos] + ["Tasks, any"]
    rows = [[f"`{flag}`"] + [c.get(k, 0) for k in combos] + [c["any"]] for flag, c in counts.items()]
    return md_table(rows, headers, ["left"] + ["right"] * (len(headers) - 1))


def timing_design_counts(df) -> dict:
    """{design: measured results} over the scored time results (``timing_design`` column)."""
    if "timing_design" not in df:
        return {}
    designs = df.loc[df["status"] == Status.OK, "timing_design"].dropna().astype(int)
    return {int(k): int(v) for k, v in designs.value_counts().sort_index().items()}


def timing_design_lines(df) -> list[str]:
    """Say how many scores were timed before the timing-isolation work (design 1), when any were."""
    counts = timing_design_counts(df)
    if not counts:
        return []
    old = counts.get(1, 0)
    parts = ", ".join(f"design {k}: {v}" for k, v in counts.items())
    return [
        f"Measured scores by the timing design that made them ({parts}). Design 1 is the design before "
        "the timing-isolation work: other jobs' start-up, driver calls and threads could reach its timed "
        f"calls; **{old} of {sum(counts.values())} scores are still from it** until they are timed again "
        "(`timing_design` in scores.csv; RUN_NOTES says what each design changed)."
        if old
        else f"Measured scores by the timing design that made them ({parts}).",
    ]


def render_summary_markdown(df) -> str:
    """Per protocol and mode: published next to measured, per level and overall."""
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
        "(`SPEEDUP_CEILING`, `DEGENERATE_TASK` from the CPU scan, `EXTENSION_BUILD_FAILED`, "
        f"`{stalls.FLAG}`: timed calls stalled by the host changed a paper score by more than "
        f"{stalls.TOLERANCE:.0%} or caused its early stop; `score_without_stalls` in scores.csv). "
        "A flag is for review: the score stays what the protocol measured.",
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
    design_lines = timing_design_lines(df)
    if design_lines:
        lines += ["### Timing design", "", *design_lines, ""]
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
    ]
    headers = [
        "Task",
        "Mode",
        "Published",
        "Measured",
        "± std",
        "Ratio",
        "Status",
        "Check",
        "Flags",
        "Reason",
    ]
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


# --------------------------------------------------------------------------- figures

_LEVEL_COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _panels(df):
    """Panel layout: one row per protocol, one column per mode present for it.

    Returns (rows, ncols) with rows = [(protocol, [mode, ...]), ...].
    """
    if df.empty:
        return [("paper", ["default"])], 1
    rows = []
    for proto in _protocols(df):
        present = set(df.loc[df["protocol"] == proto, "mode"])
        rows.append((proto, [m for m in _modes(df) if m in present]))
    return rows, max(len(ms) for _, ms in rows)


def _layout(plt, df, cell_w, cell_h, extra_h=0.0):
    rows, nc = _panels(df)
    nr = len(rows)
    fig, axes = plt.subplots(nr, nc, figsize=(cell_w * nc + 0.6, cell_h * nr + extra_h), squeeze=False)
    used = []
    for i, (proto, modes) in enumerate(rows):
        for j in range(nc):
            if j < len(modes):
                # x label where no used panel sits below
                bottom = i == nr - 1 or j >= len(rows[i + 1][1])
                used.append((axes[i][j], proto, modes[j], bottom, j == 0))
            else:
                axes[i][j].set_visible(False)
    return fig, used


def _save(fig, path):
    from .io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def _times_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:g}×")


def plot_measured_vs_published(df, path) -> Path:
    """Log-log scatter of measured vs published speedup; one panel per protocol x mode.

    Points are coloured by KernelBench level; failed tasks (published score, no
    measurement) are drawn as red crosses along the bottom edge.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogLocator

    fig, panels = _layout(plt, df, 3.5, 3.6, 0.5)
    if len(df):
        pub_all = df["published"].astype(float)
        meas_all = df["measured"].astype(float)
        vals = np.concatenate(
            [
                pub_all[np.isfinite(pub_all) & np.isfinite(meas_all)],
                meas_all[np.isfinite(pub_all) & np.isfinite(meas_all)],
            ]
        )
        vals = vals[vals > 0]
    else:
        vals = np.array([])
    lo = min(float(vals.min()) if len(vals) else 0.5, 0.5) / 1.5
    hi = max(float(vals.max()) if len(vals) else 2.0, 2.0) * 1.5
    floor = lo * 1.3  # where failed tasks are drawn
    xs = np.array([lo, hi])
    for ax, proto, mode, bottom, left in panels:
        sel = df[(df["protocol"] == proto) & (df["mode"] == mode)] if len(df) else df
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.plot(xs, xs, color="0.2", lw=1, zorder=2)
        ax.plot(xs, xs * 2, color="0.55", lw=0.8, ls=":", zorder=2)
        ax.plot(xs, xs / 2, color="0.55", lw=0.8, ls=":", zorder=2)
        n_ok = n_fail = 0
        if len(sel):
            pub = sel["published"].astype(float)
            meas = sel["measured"].astype(float)
            ok = np.isfinite(pub) & np.isfinite(meas)
            n_ok = int(ok.sum())
            for lv, color in _LEVEL_COLORS.items():
                m = ok & (sel["level"] == lv).fillna(False).to_numpy(dtype=bool)
                if m.any():
                    ax.scatter(pub[m], meas[m], s=13, alpha=0.65, color=color, edgecolors="none", zorder=3)
            failed = np.isfinite(pub) & ~np.isfinite(meas) & sel["status"].map(status_class).eq("failed")
            n_fail = int(failed.sum())
            if n_fail:
                ax.scatter(
                    pub[failed], np.full(n_fail, floor), marker="x", s=20, color="#d62728", lw=1, zorder=4
                )
        if not n_ok and not n_fail:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
        ax.set_title(f"{_mode_label(mode)} · {proto}\n{n_ok} compared, {n_fail} failed", fontsize=10)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10))
            axis.set_major_formatter(_times_formatter())
        ax.grid(True, which="major", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        if bottom:
            ax.set_xlabel("published speedup")
        if left:
            ax.set_ylabel("measured speedup")
    handles = [
        Line2D([], [], ls="", marker="o", color=c, label=f"level {lv}") for lv, c in _LEVEL_COLORS.items()
    ] + [
        Line2D([], [], ls="", marker="x", color="#d62728", label="failed (at bottom edge)"),
        Line2D([], [], color="0.2", lw=1, label="measured = published"),
        Line2D([], [], color="0.55", lw=0.8, ls=":", label="2× / ½×"),
    ]
    fig.suptitle("Measured vs published speedup per task (log–log)", fontsize=12)
    fig.tight_layout(h_pad=1.5)
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=len(handles),
        frameon=False,
        fontsize=9,
    )
    _save(fig, path)
    plt.close(fig)
    return Path(path)


def plot_ratio_hist(df, path, clip: float = 4.0) -> Path:
    """Histograms of log2(measured/published); one panel per protocol x mode.

    Ratios beyond 2**±clip are piled into the outermost bins.
    """
    plt = _pyplot()
    fig, panels = _layout(plt, df, 3.5, 2.9)
    bins = np.linspace(-clip, clip, int(clip * 2 * 6) + 1)  # 6 bins per factor of 2
    ticks = np.arange(-clip, clip + 1, 2 if clip > 3 else 1)
    tick_labels = [("1" if t == 0 else (f"{2**t:g}" if t > 0 else f"1/{2**-t:g}")) + "×" for t in ticks]
    for ax, proto, mode, bottom, left in panels:
        sel = df[(df["protocol"] == proto) & (df["mode"] == mode)] if len(df) else df
        r = sel["ratio"].astype(float).to_numpy() if len(sel) else np.array([])
        r = r[np.isfinite(r) & (r > 0)]
        lr = np.log2(r)
        if len(lr):
            ax.hist(np.clip(lr, -clip + 1e-9, clip - 1e-9), bins=bins, color="#4c72b0", alpha=0.9)
            med = float(np.median(lr))
            ax.axvline(med, color="#d62728", ls="--", lw=1.2)
            within = float(np.mean(np.abs(lr) <= np.log2(1.1)))
            n_out = int((np.abs(lr) >= clip).sum())
            text = f"n = {len(lr)}\nmedian {2**med:.2f}×\nwithin ±10%: {within:.0%}"
            if n_out:
                text += f"\nbeyond axis: {n_out}"
            ax.text(
                0.03,
                0.96,
                text,
                transform=ax.transAxes,
                va="top",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9},
            )
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.5")
        ax.axvline(0, color="0.2", lw=1)
        ax.set_xlim(-clip, clip)
        ax.set_xticks(ticks)
        ax.set_xticklabels(tick_labels)
        ax.set_title(f"{_mode_label(mode)} · {proto}", fontsize=10)
        ax.grid(True, axis="y", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        if bottom:
            ax.set_xlabel("measured / published (log scale)")
        if left:
            ax.set_ylabel("tasks")
    fig.suptitle(
        "Measured / published speedup per task (black: equal; red dashed: median)",
        fontsize=12,
    )
    fig.tight_layout(h_pad=1.2)
    _save(fig, path)
    plt.close(fig)
    return Path(path)


# --------------------------------------------------------------------------- report


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
    g = g[g["measured"].notna()].copy()
    clean = _without_stalls(g)
    pub = g["published"].astype(float)
    if below:
        keep = (g["measured"] < 0.5 * pub) & (clean < 0.5 * pub)
    else:
        keep = (g["measured"] > 2 * pub) & (clean > 2 * pub)
    g = g[keep].assign(_r=(g["measured"].astype(float) / pub))
    return g.sort_values("_r", ascending=below)


def _task_list(rows, limit: int = 10) -> str:
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
            f"Measured on {_most_common(df['gpu']) or 'this GPU'}, published on the release's GPU:",
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
        lo, hi = _robust_outliers(df, mode, True), _robust_outliers(df, mode, False)
        if len(lo):
            out_lines.append(f"* {_mode_label(mode)}, below ½: {_task_list(lo)}")
        if len(hi):
            out_lines.append(f"* {_mode_label(mode)}, above 2×: {_task_list(hi)}")
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
    lines = [f"# CUDA-L1 re-measurement: {device}", ""]
    n_tasks = df["tid"].nunique() if len(df) else 0
    modes = ", ".join(_mode_label(m) for m in _modes(df)) if len(df) else "none"
    protocols = ", ".join(_protocols(df)) if len(df) else "none"
    lines += [
        f"The CUDA-L1 kernels released for **{device}** were re-timed against their KernelBench "
        f"reference programs: {n_tasks} tasks, modes {modes}, timing protocol(s) {protocols}. "
        "Each measured speedup (reference time / CUDA-L1 time) is compared with the published one.",
        "",
        "## Environment",
        "",
    ]
    labels = {
        "device": "Release device",
        "gpu": "GPU",
        "driver": "Driver",
        "cuda": "CUDA",
        "torch": "PyTorch",
        "python": "Python",
        "first_started": "First run started",
        "last_finished": "Last run finished",
    }
    env_rows = [[labels[k], md_escape(prov.get(k)) or NA] for k in labels]
    env_rows += [[md_escape(k), md_escape(v)] for k, v in prov.items() if k not in labels]
    env_rows.append(["Report generated", generated])
    lines += [md_table(env_rows, ["", ""]), ""]

    lines += ["## Outcome", ""]
    if len(df):
        counts = status_counts(df)
        tot = counts[["measured", "failed", "not_run", "missing", "total"]].sum()
        lines += [
            f"Over all protocol × mode combinations: **{tot['measured']} measured**, "
            f"**{tot['failed']} failed**, {tot['not_run']} not run (e.g. no released code), "
            f"**{tot['missing']} missing** of {tot['total']}.",
            "",
            _status_table(df),
            "",
            "Mean speedup over all tasks (published → measured):",
            "",
        ]
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
        lines += [
            md_table(
                rows,
                [
                    "Protocol",
                    "Mode",
                    "Mean published",
                    "Mean measured",
                    "GeoMean published",
                    "GeoMean measured",
                    "Convention",
                ],
                ["left", "left", "right", "right", "right", "right", "left"],
            ),
            "",
        ]
    else:
        lines += ["No results.", ""]

    lines += render_findings(df)
    lines += ["## Files", ""]
    for text, rel in (tables or {}).items():
        lines.append(f"- [{text}]({rel})")
    lines.append("")
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            rel, caption = fig if isinstance(fig, (tuple, list)) else (fig, Path(fig).stem.replace("_", " "))
            lines += [f"**{caption}**", "", f"![{caption}]({rel})", ""]
    return "\n".join(lines).rstrip() + "\n"


def relpath(target, start_dir) -> str:
    """POSIX relative path from ``start_dir`` to ``target`` (for Markdown links)."""
    return Path(os.path.relpath(Path(target), Path(start_dir))).as_posix()
