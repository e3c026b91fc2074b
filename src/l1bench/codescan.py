"""Static scan of the custom code (CPU, no code runs): constructs that make a result depend on
the run rather than on the code.

``SELF_TIMED``: the custom code times itself (CUDA events with ``enable_timing``,
``elapsed_time``, the host's clocks) and, as the h100 release's cases do, picks its code path
from what it measured. What it then computes, and how fast, depends on the timing noise of the
run that loads it: L1_T001 picks a float16 matmul when that timed faster on its first call and
float32 otherwise, so its check passed in every design-4 run on H200s (the float16 path's
first-call mismatch flagged as ``OUTPUT_MISMATCH``) and failed (max abs diff 0.103) in three of
four design-7 runs on H200 and H100 (session 15, results/h100/RUN_NOTES.md). The flag is for
review: the verdict and score stay what the run measured, but a second run may not agree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: What counts as the code timing itself, by name (the matched text is reported).
SELF_TIMING = re.compile(
    r"enable_timing\s*=\s*True|\.elapsed_time\s*\(|\btime\.(?:perf_counter|perf_counter_ns|time|monotonic|"
    r"monotonic_ns|process_time)\s*\(|\bbenchmark\.Timer\s*\(|\bdo_bench\s*\("
)


def _without_comments(code: str) -> str:
    """The code without its ``#`` comment lines and trailing ``  #`` comments (a comment that
    mentions timing is not timing). Strings and docstrings are kept: code can time itself
    inside one (``exec``)."""
    out = []
    for line in code.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("#"):
            continue
        out.append(line.split("  #", 1)[0])
    return "\n".join(out)


def self_timing(code: str | None) -> list[str]:
    """The distinct self-timing constructs in ``code`` (sorted; empty when none or no code)."""
    if not code:
        return []
    return sorted({re.sub(r"\s+", "", m.group(0)) for m in SELF_TIMING.finditer(_without_comments(code))})


def scan_tasks(meta_paths) -> dict[str, dict]:
    """For each task folder (its ``meta.json`` path; the custom snippet beside it, as
    ``split_release`` writes it), the constructs found: ``{tid: {"self_timed": [...]}}`` for the
    tasks with any. A task without custom code has none."""
    out: dict[str, dict] = {}
    for meta_path in meta_paths:
        meta_path = Path(meta_path)
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        entry = (meta.get("snippets") or {}).get("custom") or {}
        code_file = meta_path.parent / entry.get("file", "custom.py")
        if not entry or not code_file.is_file():
            continue
        found = self_timing(code_file.read_text(errors="replace"))
        if found:
            out[meta.get("tid") or meta_path.parent.name] = {"self_timed": found}
    return out
