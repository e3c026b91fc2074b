"""An exclusive, cross-process lock per device, held only around GPU work.

Snakemake may run several evaluation jobs at once (``resources: gpu`` in the
profile). Their CPU-side work (interpreter start, imports, loading extensions,
``torch.compile`` code generation) overlaps freely, but every section that runs
kernels (correctness trials, warm-up, timed calls) holds this lock, so no two
measurements ever share a GPU. The time spent waiting is reported, and is not counted against a job's timeout
(a hanging task holds the lock until its own timeout kills it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

#: Environment variable naming a file where the lock reports its waiting (read by the runner,
#: which does not count time spent waiting for another job's GPU section against the timeout).
STATUS_ENV = "L1BENCH_LOCK_STATUS"


def _report(waited_s: float, waiting_since: float | None) -> None:
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"waited_s": waited_s, "waiting_since": waiting_since}, fh)
    os.replace(tmp, path)


def waited_seconds(status_path, now: float | None = None) -> float:
    """Seconds a worker has spent waiting for the lock so far, from its status file."""
    try:
        st = json.loads(Path(status_path).read_text())
    except (OSError, ValueError):
        return 0.0
    now = time.time() if now is None else now
    extra = now - st["waiting_since"] if st.get("waiting_since") else 0.0
    return float(st.get("waited_s", 0.0)) + max(0.0, extra)


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
    stats = {} if stats is None else stats
    t0 = time.perf_counter()
    with open(path, "a+") as fh:
        _report(stats.get("lock_wait_s", 0.0), time.time())
        fcntl.flock(fh, fcntl.LOCK_EX)
        t1 = time.perf_counter()
        stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + (t1 - t0)
        _report(stats["lock_wait_s"], None)
        try:
            yield
        finally:
            t2 = time.perf_counter()
            fcntl.flock(fh, fcntl.LOCK_UN)
            stats["lock_held_s"] = stats.get("lock_held_s", 0.0) + (t2 - t1)
