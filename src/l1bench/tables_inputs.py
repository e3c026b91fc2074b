"""What the tables were made from: a digest of their inputs' contents and parameters.

The aggregate writes :data:`RECORD` beside the tables (:func:`write_record`); the workflow
compares it, read-only, with the digest of the inputs as they are now
(:meth:`l1bench.staleness.Judge.tables_reason`), so file dates alone (a fresh clone) never
re-render tables that match their inputs, and any change of an input's content, a new or a
missing input, or another parameter does.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from l1bench.io import atomic_write_text
from l1bench.mintolerance import table_param

#: The record beside the tables (an output of aggregate_results).
RECORD = "tables_inputs.json"


def table_params(device: str, ceiling, tolerances) -> dict:
    """The parameters that shape the tables besides their inputs, recorded with them: the
    device, the speedup ceiling (config ``detectors.speedup_ceiling``) and the correctness
    tolerances (config ``tolerances``; none while they are the default)."""
    return {"device": device, "ceiling": ceiling} | table_param(tolerances)


def digest_contents(res: str | Path, contents: Iterable[tuple[str, bytes]], params: dict) -> str:
    """sha256 of the parameters and of each (path, content): the path relative to ``res``."""
    h = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode())
    for rel, data in sorted((os.path.relpath(p, res), data) for p, data in contents):
        h.update(rel.encode() + b"\0")
        h.update(data)
        h.update(b"\0")
    return h.hexdigest()


def digest(res: str | Path, paths, params: dict) -> str:
    """:func:`digest_contents` of the files ``paths`` as they are on disk."""
    return digest_contents(res, ((p, Path(p).read_bytes()) for p in paths), params)


def write_record(path: str | Path, res: str | Path, paths, params: dict) -> str:
    paths = list(paths)
    sha = digest(res, paths, params)
    record = {
        "about": "what the tables beside this file were made from (l1bench.tables_inputs)",
        "inputs": len(paths),
        "params": params,
        "sha256": sha,
    }
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return sha
