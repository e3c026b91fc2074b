"""An exclusive, cross-process lock per device, held only around GPU work.

Snakemake may run several evaluation jobs at once (``resources: gpu`` in the
profile). Their CPU-side work (interpreter start, imports, loading extensions,
``torch.compile`` code generation) overlaps freely, but every section that runs
kernels (correctness trials, warm-up, timed calls) holds this lock, so no two
measurements ever share a GPU. The time spent waiting is reported, and is not counted against a job's timeout
(a hanging task holds the lock until its own timeout kills it).

Opt-in (``timing.shared_sections``, timing design 5): sections that time nothing take the lock
*shared* (``mode="shared"``: several jobs at once, none while an exclusive section is held, not
pinned to the timing CPU), the timed ones *exclusive* through a turnstile (``mode="exclusive"``):
every gated taker passes the turnstile (a second flock) to take the lock, and an exclusive taker
holds it while it waits, so a stream of shared takers cannot starve it. At most
``L1BENCH_SHARED_SLOTS`` (default 4) shared sections are held at once per GPU: each holds one of
that many slot flocks, so untimed work of many jobs (correctness trials of large models) cannot
fill the GPU's memory together. Without a mode the lock is exactly the plain exclusive flock of
design 4.

Opt-in (``timing.cuda_start_outside_lock``, timing design 6): :func:`start_lock` is a second
flock per GPU, held (unpinned, outside the GPU lock) while one job at a time starts CUDA.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from l1bench import gpus, timingcpus

# Re-exported for rules/common.smk, which calls gpulock.keep_workflow_off_timing_cpus and
# gpulock.visible_gpu_count (defined in timingcpus and gpus); nothing else is re-exported.
from l1bench.gpus import visible_gpu_count as visible_gpu_count
from l1bench.timingcpus import keep_workflow_off_timing_cpus as keep_workflow_off_timing_cpus

#: Environment variable naming a file where the lock reports its waiting (read by the runner,
#: which does not count time spent waiting for another job's GPU section against the timeout).
STATUS_ENV = "L1BENCH_LOCK_STATUS"


#: Lock modes (``DeviceLock(mode=...)``); None: the plain exclusive lock (no turnstile).
SHARED, EXCLUSIVE = "shared", "exclusive"

#: How many shared sections one GPU admits at once (design 5); a whole number >= 1.
SHARED_SLOTS_ENV = "L1BENCH_SHARED_SLOTS"
DEFAULT_SHARED_SLOTS = 4


def shared_slots() -> int:
    """The number of shared sections a GPU admits at once: ``L1BENCH_SHARED_SLOTS`` or 4."""
    raw = os.environ.get(SHARED_SLOTS_ENV, "").strip()
    if not raw:
        return DEFAULT_SHARED_SLOTS
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{SHARED_SLOTS_ENV}={raw!r}: expected a whole number of at least 1")
    return n


def _report(
    waited_s: float, waiting_since: float | None, holding_since: float | None = None, mode: str | None = None
) -> None:
    """Write the status file: waits (both modes) and the section held now (both modes: a hung
    shared section keeps every exclusive taker waiting, so it is cut short as long)."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    status = {"waited_s": waited_s, "waiting_since": waiting_since, "holding_since": holding_since}
    if mode is not None:  # gated sections only: the status of a plain lock is as it always was
        status["mode"] = mode
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

    ``mode`` (design 5): ``"shared"`` takes the flock shared through the turnstile (its holder
    stays off the timing CPU; its time goes to ``lock_shared_s``, its waits to ``lock_wait_s``);
    ``"exclusive"`` takes it exclusive through the turnstile, holding the turnstile while it
    waits (writer preference). None (default): the plain exclusive flock, no turnstile.
    """

    #: The lock this process holds now (None when none): what :meth:`pause_current` pauses.
    current: DeviceLock | None = None
    #: True inside :meth:`no_pause` (timed calls): the lock is then never let go of.
    unpausable: bool = False

    def __init__(self, device: str, lock_dir=None, stats: dict | None = None, before_pause=None, mode=None):
        lock_dir = _made_lock_dir(lock_dir)
        name = lock_name(device)
        self.device = device
        self.path = lock_dir / f"l1bench-{name}.lock"
        if mode not in (None, SHARED, EXCLUSIVE):
            raise ValueError(f"unknown lock mode {mode!r}")
        self.mode = mode
        self.shared = mode == SHARED
        #: the turnstile of the gated modes (shared takers pass it, an exclusive waiter holds it)
        self.gate = lock_dir / f"l1bench-{name}.gate"
        #: the shared sections' slots (``<name>.slot0``...): one held per shared section
        self.slot_stem = lock_dir / f"l1bench-{name}.slot"
        self.stats = {} if stats is None else stats
        self._fh = None
        self._slot = None
        self._since = None
        self._restore = None
        self.before_pause = before_pause

    def _acquire(self) -> None:
        t0 = time.perf_counter()
        _report(self.stats.get("lock_wait_s", 0.0), time.time(), None, self.mode)
        if self.mode is None:
            fcntl.flock(self._fh, fcntl.LOCK_EX)
        else:
            self._take_gated(blocking=True)
        self._took(t0)

    def _take_gated(self, blocking: bool) -> None:
        """Take the flock in this lock's mode through the turnstile: hold the turnstile while
        waiting for the lock, let go of it once the lock is held. An exclusive waiter thus
        keeps every later taker (shared or exclusive) out until it has had its section; a
        shared taker waits there only while an exclusive section is held or waited for.
        Non-blocking: BlockingIOError when either is taken."""
        nb = 0 if blocking else fcntl.LOCK_NB
        if self.shared:
            self._take_slot(blocking)
        try:
            with open(self.gate, "a+") as gate:  # closing it lets go of the turnstile
                fcntl.flock(gate, fcntl.LOCK_EX | nb)
                fcntl.flock(self._fh, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | nb)
        except BaseException:
            self._drop_slot()
            raise

    def _take_slot(self, blocking: bool, poll_s: float = 0.02) -> None:
        """Hold one of the GPU's :func:`shared_slots` slot flocks (a shared section's place),
        trying them from one picked by the process id; blocking: poll until one is free (the
        waiter holds nothing meanwhile, so it keeps no exclusive taker waiting)."""
        n = shared_slots()
        self.stats["shared_slots"] = n
        first = os.getpid() % n
        while True:
            for k in range(n):
                fh = try_flock(f"{self.slot_stem}{(first + k) % n}")
                if fh is not None:
                    self._slot = fh
                    return
            if not blocking:
                raise BlockingIOError(f"all {n} shared slots of {self.device} are held")
            time.sleep(poll_s)

    def _drop_slot(self) -> None:
        if self._slot is not None:
            self._slot.close()  # closing lets go of the flock
            self._slot = None

    def _took(self, t0: float) -> None:
        """Bookkeeping once the flock is held (waited since ``t0``)."""
        self._since = time.perf_counter()
        self.stats["lock_wait_s"] = self.stats.get("lock_wait_s", 0.0) + (self._since - t0)
        _report(self.stats["lock_wait_s"], None, time.time(), self.mode)
        # only the exclusive holder runs on the timing CPU: shared holders stay off it
        self._restore = None if self.shared else timingcpus._pin_to_timing_cpu()
        DeviceLock.current = self

    def try_enter(self) -> bool:
        """Take the lock if it is free now (then as :meth:`__enter__`); False if it is held."""
        fh = open(self.path, "a+")
        try:
            if self.mode is None:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                self._fh = fh
                self._take_gated(blocking=False)
        except BlockingIOError:
            self._fh = None
            fh.close()
            return False
        except BaseException:
            self._fh = None
            fh.close()
            raise
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
        elif self.shared and os.environ.get(timingcpus.TIMING_CPU_ENV) and hasattr(os, "sched_getaffinity"):
            # not pinned, so its threads started off the timing CPU; any that got there go too
            timingcpus.unpin_threads(os.environ[timingcpus.TIMING_CPU_ENV], os.sched_getaffinity(0))
        held = time.perf_counter() - self._since
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._drop_slot()
        _report(self.stats.get("lock_wait_s", 0.0), None, None, self.mode)
        key = "lock_shared_s" if self.shared else "lock_held_s"
        self.stats[key] = self.stats.get(key, 0.0) + held

    @staticmethod
    def held_so_far(stats: dict, shared: bool = False) -> float:
        """Seconds of lock held recorded in ``stats`` plus the open stretch of the lock held
        now, if it records into the same ``stats``: read at both ends of a step, the
        difference is the lock time the step took (waits and pauses inside it excluded).
        Exclusive sections only (``lock_held_s``); ``shared=True``: shared ones only
        (``lock_shared_s``)."""
        held = stats.get("lock_shared_s" if shared else "lock_held_s", 0.0)
        lock = DeviceLock.current
        if lock is not None and lock.stats is stats and lock._since is not None and lock.shared == shared:
            held += time.perf_counter() - lock._since
        return held

    def move_other_threads_off(self) -> int:
        """Move the threads this process started while holding the lock (all but the calling
        one) off the timing CPU now, not only at release."""
        if self._restore is None:
            return 0
        import threading

        return timingcpus.unpin_threads(
            os.environ.get(timingcpus.TIMING_CPU_ENV, ""), self._restore, keep=threading.get_native_id()
        )

    def idle(self) -> bool:
        """Whether nobody holds the lock now, in either mode (a probe: it may change at once)."""
        with open(self.path, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    def fileno(self) -> int:
        """The lock file's descriptor (while held)."""
        return self._fh.fileno()

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
    device: str, lock_dir: str | os.PathLike | None = None, stats: dict | None = None, before_pause=None,
    mode: str | None = None,
) -> DeviceLock:
    """The lock of ``device`` (a context manager; see :class:`DeviceLock`): exclusive, or in
    ``mode`` (design 5: ``"shared"``/``"exclusive"`` through the turnstile)."""
    return DeviceLock(device, lock_dir, stats, before_pause, mode)


def claim_free_device(
    devices: list[str], lock_dir=None, stats: dict | None = None, before_pause=None, timing_cpus=None,
    poll_s: float = 0.005, mode: str | None = None,
) -> tuple[int, DeviceLock]:
    """Take the lock of whichever of ``devices`` is free first: (its index, the held lock).

    A job's first GPU section places it: on a machine with several GPUs it takes any free one
    instead of queueing for one picked in advance, so no GPU idles while jobs wait. Later
    sections of the job take that same GPU's lock (its models live there). ``timing_cpus[i]``
    is the timing CPU of ``devices[i]`` (exported for :func:`_pin_to_timing_cpu`). Waiting time
    is reported like a blocking wait (not counted against the job's timeout). A shared section
    (``mode="shared"``) is placed on a GPU nobody holds if there is one, else on any that admits it.
    """
    stats = {} if stats is None else stats
    locks = [DeviceLock(d, lock_dir, stats, before_pause, mode) for d in devices]
    if len(locks) == 1:  # nothing to choose: wait in the lock's queue
        if timing_cpus and timing_cpus[0] is not None:
            os.environ[timingcpus.TIMING_CPU_ENV] = str(timing_cpus[0])
        return 0, locks[0].__enter__()
    t0 = time.perf_counter()
    _report(stats.get("lock_wait_s", 0.0), time.time())
    while True:
        idle = [i for i, lock in enumerate(locks) if lock.idle()] if mode == SHARED else []
        for i, lock in sorted(enumerate(locks), key=lambda il: il[0] not in idle):
            if timing_cpus and timing_cpus[i] is not None:
                os.environ[timingcpus.TIMING_CPU_ENV] = str(timing_cpus[i])
            if lock.try_enter():
                # the wait before the first try counts too
                stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + (lock._since - t0)
                _report(stats["lock_wait_s"], None, time.time())
                return i, lock
        time.sleep(poll_s)


@contextlib.contextmanager
def start_lock(device: str, lock_dir=None, stats: dict | None = None):
    """Design 6 (opt-in, ``timing.cuda_start_outside_lock``): the flock ``l1bench-<name>.start``
    beside the device's lock, held while one process starts CUDA on the device outside the GPU
    lock, so that the jobs waiting for the GPU never start their drivers all at once. Blocking,
    exclusive, independent of the GPU lock (either may be held without the other) and not
    pinned to the timing CPU. Yields the seconds waited for it.

    The runner sees it as it sees the GPU lock (the status file): the wait is not counted
    against the job's timeout (another job's start is not this task's time), and a start held
    longer than a GPU section may be is cut short as a hung section is. So the wait goes into
    ``stats["lock_wait_s"]`` too (the status file's running total of waits)."""
    stats = {} if stats is None else stats
    path = _made_lock_dir(lock_dir) / f"l1bench-{lock_name(device)}.start"
    with open(path, "a+") as fh:  # closing it lets go of the flock
        t0 = time.perf_counter()
        _report(stats.get("lock_wait_s", 0.0), time.time())
        fcntl.flock(fh, fcntl.LOCK_EX)
        waited = time.perf_counter() - t0
        stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + waited
        _report(stats["lock_wait_s"], None, time.time())
        try:
            yield waited
        finally:
            _report(stats["lock_wait_s"], None, None)
