"""Static scan of the custom code (CPU, no code runs) for ``SELF_TIMED``: code that times itself
(CUDA events with ``enable_timing``, ``elapsed_time``, the host's clocks) and may pick its code
path from what it measured, so its verdict and score depend on the run's timing noise (L1_T001
picks a float16 matmul when that timed faster on its first call: its check passed in some runs
and failed in others, 2026-12, H100 and H200). The flag is for review; the result stays as measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .results import builds_extensions

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


def custom_codes(meta_paths):
    """(tid, custom code) of each task folder (its ``meta.json`` path; the custom snippet beside
    it, as ``split_release`` writes it) that has custom code."""
    for meta_path in meta_paths:
        meta_path = Path(meta_path)
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        entry = (meta.get("snippets") or {}).get("custom") or {}
        code_file = meta_path.parent / entry.get("file", "custom.py")
        if entry and code_file.is_file():
            yield meta.get("tid") or meta_path.parent.name, code_file.read_text(errors="replace")


def scan_tasks(meta_paths) -> dict[str, dict]:
    """For each task folder (:func:`custom_codes`), the constructs found: ``{tid: {"self_timed":
    [...]}}`` for the tasks with any. A task without custom code has none."""
    found = {tid: self_timing(code) for tid, code in custom_codes(meta_paths)}
    return {tid: {"self_timed": f} for tid, f in found.items() if f}


def extension_tasks(meta_paths) -> dict[str, bool]:
    """For each task folder with custom code (:func:`custom_codes`), whether the code builds a
    C++/CUDA extension (:func:`l1bench.results.builds_extensions`)."""
    return {tid: builds_extensions(code) for tid, code in custom_codes(meta_paths)}
