"""Tables that match their inputs are not made again because of file dates alone.

Snakemake decides by modification times whether the tables (``aggregate_results``) are out of
date. On a fresh clone the times say nothing: git writes the committed results after the
committed tables, and the task folders are split anew, so every clone would re-render
tables that are already right (and a dry run would always plan it). The aggregate therefore
records a digest of exactly what it read (:data:`RECORD`: the contents of its inputs and the
parameters that shape the tables); before the DAG is built, :func:`mark_current` compares the
inputs now with that record and, when they are the same, sets the tables' times to now (what
``snakemake --touch`` does by hand). Any change of an input's content, a new or a missing
input, or another parameter leaves the times alone, and Snakemake re-renders as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from l1bench.io import atomic_write_text

#: The record beside the tables (an output of aggregate_results).
RECORD = "tables_inputs.json"


def digest(res: str | Path, paths, params: dict) -> str:
    """sha256 of the parameters and of each input's path (relative to ``res``) and content."""
    h = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode())
    for rel, path in sorted((os.path.relpath(p, res), p) for p in paths):
        h.update(rel.encode() + b"\0")
        h.update(Path(path).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def write_record(path: str | Path, res: str | Path, paths, params: dict) -> str:
    paths = list(paths)
    sha = digest(res, paths, params)
    record = {
        "about": "what the tables beside this file were made from (l1bench.freshness)",
        "inputs": len(paths),
        "params": params,
        "sha256": sha,
    }
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return sha


def _mtime(path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def mark_current(record: str | Path, res: str | Path, paths, params: dict, outputs, followers=()) -> bool:
    """Set the times of ``outputs`` (the tables, figures, report and ``record``) to now when
    every one exists, some input is newer than one of them, and the inputs' digest equals the
    record's; then also each of ``followers`` ({output: [inputs other than the tables]}, e.g.
    slice reports) that is not older than those other inputs. Returns whether it did.
    """
    paths, outputs = list(paths), list(outputs)
    out_times = [_mtime(p) for p in outputs]
    in_times = [_mtime(p) for p in paths]
    if None in out_times or None in in_times:
        return False
    if not in_times or max(in_times) <= min(out_times):
        return False  # nothing newer: Snakemake leaves the tables alone anyway
    try:
        recorded = json.loads(Path(record).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        return False
    if recorded != digest(res, paths, params):
        return False
    now = time.time()
    for path in outputs:
        os.utime(path, (now, now))
    later = now + 0.001
    for path, other_inputs in dict(followers).items():
        mtime = _mtime(path)
        if mtime is not None and all((_mtime(p) or float("inf")) <= mtime for p in other_inputs):
            os.utime(path, (later, later))
    return True
