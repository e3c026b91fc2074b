"""An exclusive, cross-process lock per device, held only around GPU work.

Snakemake may run several evaluation jobs at once (``resources: gpu`` in the
profile). Their CPU-side work (interpreter start, imports, loading extensions,
``torch.compile`` code generation) overlaps freely, but every section that runs
kernels (correctness trials, warm-up, timed calls) holds this lock, so no two
measurements ever share a GPU. The time spent waiting is reported.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path


def default_lock_dir() -> Path:
    return Path(os.environ.get("L1BENCH_LOCK_DIR") or os.environ.get("TMPDIR") or "/tmp")


@contextlib.contextmanager
def device_lock(device: str, lock_dir: str | os.PathLike | None = None, stats: dict | None = None):
    """Hold an exclusive flock named after ``device`` ("cuda:0" -> gpu0.lock, "cpu" -> cpu.lock).

    ``stats`` (if given) accumulates ``lock_wait_s`` and ``lock_held_s``.
    """
    lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    name = "cpu" if device == "cpu" else "gpu" + (device.split(":")[1] if ":" in device else "0")
    path = lock_dir / f"l1bench-{name}.lock"
    t0 = time.perf_counter()
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        t1 = time.perf_counter()
        try:
            yield
        finally:
            t2 = time.perf_counter()
            fcntl.flock(fh, fcntl.LOCK_UN)
            if stats is not None:
                stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + (t1 - t0)
                stats["lock_held_s"] = stats.get("lock_held_s", 0.0) + (t2 - t1)
