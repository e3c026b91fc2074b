"""An exclusive, cross-process flock per device, held around every section that runs kernels, so no
two measurements share a GPU while CPU work overlaps freely. Waiting time is reported to the
runner and not counted against a job's timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from l1bench.gpu import gpus, timingcpus

# Re-exported for l1bench.hooks, which calls gpulock.keep_workflow_off_timing_cpus and
# gpulock.visible_gpu_count (defined in timingcpus and gpus); nothing else is re-exported.
from l1bench.gpu.gpus import visible_gpu_count as visible_gpu_count
from l1bench.gpu.timingcpus import keep_workflow_off_timing_cpus as keep_workflow_off_timing_cpus

#: Environment variable naming a file where the lock reports its waiting (read by the runner,
#: which does not count time spent waiting for another job's GPU section against the timeout).
STATUS_ENV = "L1BENCH_LOCK_STATUS"


def _report(waited_s: float, waiting_since: float | None, holding_since: float | None = None) -> None:
    """Write the status file: the waits so far, and since when the lock is waited for or held."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    status = {"waited_s": waited_s, "waiting_since": waiting_since, "holding_since": holding_since}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(status, fh)
    os.replace(tmp, path)


def held_seconds(status_path, now: float | None = None) -> float:
    """Seconds the worker has held the lock in its current GPU section (0 when not holding)."""
    try:
        since = json.loads(Path(status_path).read_text()).get("holding_since")
    except (OSError, ValueError):
        return 0.0
    if not since:
        return 0.0
    return max(0.0, (time.time() if now is None else now) - since)


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


def _made_lock_dir(lock_dir) -> Path:
    """``lock_dir`` (default: :func:`default_lock_dir`), created if missing."""
    lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    return lock_dir


def try_flock(path):
    """The file ``path`` opened and held under an exclusive flock, or None when another holds
    it. Closing the file lets go of the flock (so does the process's end)."""
    fh = open(path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


def lock_name(device: str) -> str:
    """The stem of a device's lock files after ``l1bench-``: "cpu", or "gpu" and the GPU's
    physical name ("cuda:0" -> "gpu0", or "gpuGPU-<uuid>" where the driver's /proc says)."""
    gpu = gpus.physical_gpu_name(device.split(":", 1)[1] if ":" in device else "0")
    return "cpu" if device == "cpu" else "gpu" + "".join(c if c.isalnum() else "-" for c in gpu)


class DeviceLock:
    """An exclusive flock named after a device ("cuda:0" -> gpu0.lock, "cpu" -> cpu.lock).

    Use as a context manager. ``stats`` accumulates ``lock_wait_s`` and ``lock_held_s``.
    While held, the calling thread runs on the reserved timing CPU (if any). :meth:`paused`
    lets go of the lock for a stretch of CPU-only work inside a GPU section (torch.compile
    code generation) and takes it back afterwards.
    """

    #: The lock this process holds now (None when none): what :meth:`pause_current` pauses.
    current: DeviceLock | None = None
    #: True inside :meth:`no_pause` (timed calls): the lock is then never let go of.
    unpausable: bool = False

    def __init__(self, device: str, lock_dir=None, stats: dict | None = None, before_pause=None):
        self.device = device
        self.path = _made_lock_dir(lock_dir) / f"l1bench-{lock_name(device)}.lock"
        self.stats = {} if stats is None else stats
        self._fh = None
        self._since = None
        self._restore = None
        self.before_pause = before_pause

    def _acquire(self) -> None:
        t0 = time.perf_counter()
        _report(self.stats.get("lock_wait_s", 0.0), time.time(), None)
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        self._took(t0)

    def _took(self, t0: float) -> None:
        """Bookkeeping once the flock is held (waited since ``t0``)."""
        self._since = time.perf_counter()
        self.stats["lock_wait_s"] = self.stats.get("lock_wait_s", 0.0) + (self._since - t0)
        _report(self.stats["lock_wait_s"], None, time.time())
        self._restore = timingcpus._pin_to_timing_cpu()
        DeviceLock.current = self

    def try_enter(self) -> bool:
        """Take the lock if it is free now (then as :meth:`__enter__`); False if it is held."""
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        self._fh = fh
        self._took(time.perf_counter())
        return True

    def _release(self) -> None:
        DeviceLock.current = None
        if self._restore is not None:
            os.sched_setaffinity(0, self._restore)
            # Threads started inside the section inherited the timing CPU: move them off, or
            # they would run there during the next holder's timed calls.
            timingcpus.unpin_threads(os.environ.get(timingcpus.TIMING_CPU_ENV, ""), self._restore)
            self._restore = None
        held = time.perf_counter() - self._since
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        _report(self.stats.get("lock_wait_s", 0.0), None, None)
        self.stats["lock_held_s"] = self.stats.get("lock_held_s", 0.0) + held

    def move_other_threads_off(self) -> int:
        """Move the threads this process started while holding the lock (all but the calling
        one) off the timing CPU now, not only at release."""
        if self._restore is None:
            return 0
        import threading

        return timingcpus.unpin_threads(
            os.environ.get(timingcpus.TIMING_CPU_ENV, ""), self._restore, keep=threading.get_native_id()
        )

    def __enter__(self) -> DeviceLock:
        self._fh = open(self.path, "a+")
        try:
            self._acquire()
        except BaseException:
            self._fh.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._release()
        finally:
            self._fh.close()

    @contextlib.contextmanager
    def paused(self):
        """Release the lock for the body (CPU-only work), then wait for it again. Work this
        process left on the device is finished first (``before_pause``): none of it may run
        into another holder's section."""
        if self.before_pause is not None:
            self.before_pause()
        self._release()
        self.stats["lock_paused_n"] = self.stats.get("lock_paused_n", 0) + 1
        try:
            yield
        finally:
            self._acquire()

    @staticmethod
    def pause_current():
        """:meth:`paused` of the lock held now, or a no-op context when none is held or inside
        :meth:`no_pause`."""
        lock = DeviceLock.current
        if lock is None or DeviceLock.unpausable:
            return contextlib.nullcontext()
        return lock.paused()

    @staticmethod
    @contextlib.contextmanager
    def no_pause():
        """Keep the lock through the body even where CPU work would let go of it (a compile or
        an extension build inside a timed call: another job's kernels would then be timed
        with it)."""
        before = DeviceLock.unpausable
        DeviceLock.unpausable = True
        try:
            yield
        finally:
            DeviceLock.unpausable = before


def device_lock(
    device: str, lock_dir: str | os.PathLike | None = None, stats: dict | None = None, before_pause=None
) -> DeviceLock:
    """The lock of ``device`` (a context manager; see :class:`DeviceLock`)."""
    return DeviceLock(device, lock_dir, stats, before_pause)


def claim_free_device(
    devices: list[str], lock_dir=None, stats: dict | None = None, before_pause=None, timing_cpus=None,
    poll_s: float = 0.005,
) -> tuple[int, DeviceLock]:
    """Take the lock of whichever of ``devices`` is free first: (its index, the held lock), so that no
    GPU idles while jobs wait. ``timing_cpus[i]``: the timing CPU of ``devices[i]``. Waiting time is
    reported like a blocking wait.
    """
    stats = {} if stats is None else stats
    locks = [DeviceLock(d, lock_dir, stats, before_pause) for d in devices]
    if len(locks) == 1:  # nothing to choose: wait in the lock's queue
        if timing_cpus and timing_cpus[0] is not None:
            os.environ[timingcpus.TIMING_CPU_ENV] = str(timing_cpus[0])
        return 0, locks[0].__enter__()
    t0 = time.perf_counter()
    _report(stats.get("lock_wait_s", 0.0), time.time())
    while True:
        for i, lock in enumerate(locks):
            if timing_cpus and timing_cpus[i] is not None:
                os.environ[timingcpus.TIMING_CPU_ENV] = str(timing_cpus[i])
            if lock.try_enter():
                # the wait before the first try counts too
                stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + (lock._since - t0)
                _report(stats["lock_wait_s"], None, time.time())
                return i, lock
        time.sleep(poll_s)
