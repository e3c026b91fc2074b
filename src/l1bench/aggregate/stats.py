"""Statistics over a loaded table: README-style summary statistics, status counts, agreement
with the published scores, flag counts, stall sensitivity and timing versions.

The statistics follow the CUDA-L1 README (:data:`~.conventions.MISSING_AS_ONE`; numpy's linear
percentiles).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..results import AGREEMENT, Status
from .conventions import (
    MISSING,
    MISSING_AS_ONE,
    NA,
    SPEEDUP_THRESHOLD,
    STAT_ROWS,
    TIMED_GROUPS,
    _mode_key,
    _protocol_key,
    status_class,
)


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
    """Per protocol x mode: measured / failed / not_run / missing / total, plus of the tasks with
    both scores (compared) those within :data:`AGREEMENT`, below half and above double their
    published score, and the median ratio: the tables' and the figures' numbers alike."""
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


def on_cpu(df) -> bool:
    """Whether the results are the CPU demo's (device ``demo``: its jobs run on the CPU)."""
    return set(df.get("device", ())) == {"demo"}


def timing_version_counts(df) -> list[tuple[int | None, int, str]]:
    """(timing version, scores, the GPUs that made them) for the scored time results, newest
    version first (None: a score that records no version, last)."""
    if "timing_version" not in df or not len(df):
        return []
    ok = df[df["status"] == Status.OK]
    pairs = [(None if pd.isna(v) else int(v), g) for v, g in zip(ok["timing_version"], ok["gpu"], strict=True)]
    out = []
    for v in sorted({v for v, _ in pairs}, key=lambda v: 1 if v is None else -v):
        gpus = sorted({g for w, g in pairs if w == v and isinstance(g, str) and g})
        out.append((v, sum(w == v for w, _ in pairs), ", ".join(gpus) or ("CPU" if on_cpu(df) else "no GPU recorded")))
    return out


def machine_counts(df) -> list[tuple[str, str, int, int, int, str]]:
    """Per protocol x mode with scores: (protocol, mode, scores, GPUs told apart by their UUID,
    scores whose result records no GPU UUID, the hosts' names)."""
    out = []
    for proto in _protocols(df):
        for mode in _modes(df):
            ok = df[(df["protocol"] == proto) & (df["mode"] == mode) & (df["status"] == Status.OK)]
            if ok.empty:
                continue
            uuids, hosts = (ok.get(c, pd.Series(None, index=ok.index, dtype=object)) for c in ("gpu_uuid", "host"))
            out.append((proto, mode, len(ok), uuids.dropna().nunique(), int(uuids.isna().sum()),
                        ", ".join(sorted(hosts.dropna().astype(str).unique())) or NA))
    return out


def timed_group(df) -> pd.Series:
    """Each row's group of :data:`~.conventions.TIMED_GROUPS`: ``host_bound`` where its timed
    calls are (``host_bound`` column), else its ``timed`` column (empty where not a score)."""
    timed = df.get("timed", pd.Series(None, index=df.index, dtype=object)).fillna("").astype(str)
    return timed.where(~(_host_bound(df) == 1) | (timed == ""), "host_bound")


def _host_bound(df) -> pd.Series:
    """The ``host_bound`` column as numbers (NaN: not recorded; tables made before it: none is)."""
    return pd.to_numeric(df.get("host_bound", pd.Series(math.nan, index=df.index)), errors="coerce")


def timed_stats(df) -> list[dict]:
    """Per protocol x mode with a score: ``scores`` (as :func:`status_counts` counts them),
    ``unrecorded`` (scores whose result records no launches: host-bound or not is not known)
    and ``groups``: per :data:`~.conventions.TIMED_GROUPS` its ``scores`` and :func:`ratio_stats`."""
    ok = df[(df["status"] == Status.OK) & df["measured"].notna()] if len(df) else df
    group = timed_group(ok) if len(ok) else pd.Series(dtype=str)
    rows = []
    for proto in _protocols(ok) if len(ok) else []:
        for mode in _modes(ok):
            sel = (ok["protocol"] == proto) & (ok["mode"] == mode)
            if not sel.any():
                continue
            groups = {g: {"scores": int((sel & (group == g)).sum())} | ratio_stats(ok.loc[sel & (group == g), "ratio"])
                      for g in [*TIMED_GROUPS, ""]}
            unrecorded = int(_host_bound(ok[sel]).isna().sum())
            rows.append({"protocol": proto, "mode": mode, "scores": int(sel.sum()), "unrecorded": unrecorded,
                         "groups": groups})
    return rows
