"""Loading: the per-task JSON files (``meta.json``, ``check/{tid}.json``,
``time/{protocol}/{mode}/{tid}.json``) into one tidy table (:data:`~.conventions.COLUMNS`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ..modes import NAMES
from ..release import parse_task_id
from ..results import Flag, Status, timing_version
from ..timing import hostclock, stalls
from .conventions import COLUMNS, MISSING, _mode_key, _protocol_key


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


def load_results(meta_paths, check_paths, time_paths, modes=None, protocols=None) -> pd.DataFrame:
    """Tidy table, one row per task x mode x protocol (see :data:`COLUMNS`).

    Tasks come from the meta files. The (protocol, mode) combinations come from
    the time files (their content, else their path ``time/{protocol}/{mode}/``;
    a listed path that does not exist still declares its combination), or from
    ``modes`` x ``protocols`` when given (time files outside those are ignored);
    with no time information at all, protocol "paper" x every mode (l1bench.modes). A task
    with meta but no time file for a combination gets status ``"missing"``. ``measured`` is the score of an
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
        combos = {("paper", m) for m in NAMES}

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
    sides = hostclock.host_bound_sides(t) if status == Status.OK and proto == "paper" else None
    host_bound = bool(sides)
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
        "flags": _flag_names(t.get("flags"), check.get("flags"), [stalls.FLAG] if stall_flag else [],
                             [Flag.HOST_BOUND] if host_bound else []),
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
        "timing_version": timing_version(t) if status == Status.OK else None,
        "host_bound": math.nan if sides is None else float(host_bound),
        "timed": None,  # what the custom code ran: annotate.add_timed
        "host": prov.get("host"),
        "gpu_uuid": prov.get("gpu_uuid"),
    }
