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

#: Environment variable naming the CPU reserved for the lock holder's thread ("" or unset: none).
#: Workers run everything else on the other CPUs (:func:`reserve_timing_cpus`), so CPU-heavy
#: work of other jobs (model construction, torch.compile, builds) never preempts the thread
#: that launches the timed kernels: on a loaded machine the launch overhead of small kernels
#: is then the same as on an idle one.
TIMING_CPU_ENV = "L1BENCH_TIMING_CPU"

#: Environment variable listing the timing CPUs the *workflow* reserved (comma-separated, one
#: per device): set by :func:`keep_workflow_off_timing_cpus` in the Snakemake process, which
#: then runs on the other CPUs, and so does every process it starts (job scripts, workers,
#: compilers). Workers take their plan from it instead of computing one from their own mask.
RESERVED_ENV = "L1BENCH_TIMING_CPUS"


#: Timing CPUs of the visible devices, in device order, as :func:`reserve_timing_cpus` planned them.
_TIMING_PLAN: list[int] = []


def core_plan(cpus, n_devices: int, min_cpus: int = 4, siblings=None) -> tuple[list[int], set[int]]:
    """(timing CPU of each device's lock, CPUs for everything else).

    One CPU per device is reserved, counted from the highest: device 0 gets the last CPU,
    device 1 the one before, and so on. Where a CPU shares its core with others (SMT siblings,
    ``siblings(cpu)``, default: the kernel's topology), a timing CPU's siblings are left idle
    too: work on a sibling slows the thread that launches the timed kernels. With fewer than
    ``min_cpus`` CPUs, or fewer than two CPUs per device left for the rest, nothing is
    reserved: ([], cpus).
    """
    ordered = sorted(cpus)
    if n_devices < 1 or len(ordered) < max(min_cpus, 2 * n_devices):
        return [], set(ordered)
    siblings = siblings or thread_siblings
    timing: list[int] = []
    idle: set[int] = set()
    for cpu in reversed(ordered):
        if len(timing) == n_devices:
            break
        if cpu in idle:
            continue
        timing.append(cpu)
        idle |= (set(siblings(cpu)) & set(ordered)) - {cpu}
    rest = set(ordered) - set(timing) - idle
    if len(timing) < n_devices or len(rest) < max(n_devices, min_cpus - n_devices):
        # too few cores to leave the siblings idle: reserve the timing CPUs alone
        timing = [ordered[-1 - i] for i in range(n_devices)]
        rest = set(ordered) - set(timing)
    return timing, rest


def thread_siblings(cpu: int, sysfs: str = "/sys") -> set[int]:
    """The CPUs sharing ``cpu``'s core (itself included; {cpu} where the kernel does not say)."""
    try:
        text = Path(sysfs, f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text()
        return _parse_cpu_list(text) or {cpu}
    except (OSError, ValueError):
        return {cpu}


def reserve_timing_cpus(n_devices: int, device_index: int | None) -> int | None:
    """Keep this process off the devices' timing CPUs; return (and export) this device's one.

    Called once at worker start, before threads are created (they inherit the mask). Build
    workers pass ``device_index=None``: they only keep clear of the timing CPUs.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    timing, rest = reserved_plan(os.sched_getaffinity(0)) or core_plan(os.sched_getaffinity(0), n_devices)
    if not timing or not rest:
        return None
    _TIMING_PLAN[:] = timing
    _set_process_affinity(rest)
    if device_index is None or device_index >= len(timing):
        return None
    os.environ[TIMING_CPU_ENV] = str(timing[device_index])
    return timing[device_index]


def reserved_plan(cpus) -> tuple[list[int], set[int]] | None:
    """The workflow's plan (:data:`RESERVED_ENV`) as (timing CPUs, the others of ``cpus``), or
    None when the workflow reserved none."""
    try:
        timing = [int(c) for c in os.environ.get(RESERVED_ENV, "").split(",") if c.strip()]
    except ValueError:
        return None
    return (timing, set(cpus) - set(timing)) if timing else None


def visible_gpu_count(proc_gpus: str = "/proc/driver/nvidia/gpus") -> int:
    """NVIDIA GPUs this machine's jobs will see, without starting CUDA or calling into the
    driver: ``CUDA_VISIBLE_DEVICES`` when set, else the driver's /proc entries, else
    ``nvidia-smi -L``; 0 when none says."""
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        return 0 if not ids or ids[0].startswith("-") else len(ids)
    try:
        return len([d for d in os.listdir(proc_gpus) if ":" in d])
    except OSError:
        pass
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _set_process_affinity(cpus: set[int]) -> None:
    """Every thread of this process onto ``cpus`` (threads started later inherit it)."""
    tids = [0]
    with contextlib.suppress(OSError):
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(tid, cpus)


def unpin_threads(cpu, restore: set[int], task_dir: str = "/proc/self/task", keep: int | None = None) -> int:
    """Move every thread of this process that may run on ``cpu`` (the timing CPU) onto
    ``restore``, except the thread ``keep``; returns how many were moved. Called as the lock is
    released: a thread started by the lock holder inherits its single-CPU mask and would
    otherwise keep running on the timing CPU after the section, into the next holder's timed
    calls. Also right after the lock holder started CUDA (the driver's own threads)."""
    try:
        cpu = int(cpu)
        tids = [int(t) for t in os.listdir(task_dir)]
    except (OSError, ValueError):
        return 0
    moved = 0
    for tid in tids:
        if tid == keep:
            continue
        try:
            if cpu in os.sched_getaffinity(tid):
                os.sched_setaffinity(tid, restore)
                moved += 1
        except OSError:  # a thread that just ended
            continue
    return moved


#: Environment switch (set it to 1; needs root): also move every other thread of the machine,
#: the movable kernel threads, unbound kernel work queues and interrupts off the timing CPUs
#: (:func:`isolate_system`), as the kernel's ``isolcpus`` would. For dedicated or lent GPU
#: machines; the workflow records what was moved.
ISOLATE_SYSTEM_ENV = "L1BENCH_ISOLATE_SYSTEM"
#: Set by the workflow after :func:`isolate_system`: its report (JSON), recorded on results.
ISOLATED_ENV = "L1BENCH_SYSTEM_ISOLATED"


def _cpu_mask_hex(cpus) -> str:
    """A CPU set as the kernel's comma-separated 32-bit hex words (``/sys`` and ``/proc/irq``)."""
    bits = sum(1 << c for c in cpus)
    words = []
    while True:
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            break
    return ",".join(reversed(words))


def isolate_system(timing: list[int], proc: str = "/proc", sysfs: str = "/sys") -> dict:
    """Keep everything but the lock holders off the timing CPUs, machine-wide (root only).

    The workflow keeps its own processes off the timing CPUs; this also moves every other
    process's threads, the kernel threads that may move (unbound ones: ``kswapd``, ``jbd2``,
    ``khugepaged``...), the unbound work queues (writeback, for example) and the interrupts.
    Per-CPU kernel threads stay (they cannot move). Left as it is on a machine where this
    process is not root. Returns counts of what was moved and what could not be.
    """
    report = {"root": os.geteuid() == 0 if hasattr(os, "geteuid") else False, "timing_cpus": list(timing)}
    if not report["root"] or not timing:
        return report
    allowed = set(os.sched_getaffinity(0)) | set(timing)
    rest = allowed - set(timing)
    try:
        online = _parse_cpu_list(Path(sysfs, "devices/system/cpu/online").read_text())
        rest = (online or allowed) - set(timing)
    except OSError:
        pass
    mine = os.getpid()
    moved = kept = 0
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        if int(pid) == mine:
            continue
        try:
            tids = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                cpus = os.sched_getaffinity(int(tid))
                if not cpus & set(timing):
                    continue
                left = cpus - set(timing)
                os.sched_setaffinity(int(tid), left or rest)
                moved += 1
            except OSError:  # a per-CPU kernel thread (or one that just ended)
                kept += 1
    report["threads_moved"], report["threads_kept"] = moved, kept
    mask = _cpu_mask_hex(rest)
    report["workqueue"] = _write_quietly(Path(sysfs, "devices/virtual/workqueue/cpumask"), mask)
    irqs = [d for d in Path(proc, "irq").glob("*") if d.name.isdigit()] if Path(proc, "irq").is_dir() else []
    report["irqs_moved"] = sum(_write_quietly(d / "smp_affinity", mask) for d in irqs)
    report["irqs"] = len(irqs)
    _write_quietly(Path(proc, "irq/default_smp_affinity"), mask)
    return report


def _write_quietly(path: Path, text: str) -> bool:
    try:
        path.write_text(text + "\n")
        return True
    except OSError:
        return False


def _parse_cpu_list(text: str) -> set[int]:
    """``0-3,8`` -> {0, 1, 2, 3, 8}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def keep_workflow_off_timing_cpus(n_devices: int) -> list[int]:
    """In the workflow's own process: reserve one timing CPU per device and move this process
    (and so everything it will start) onto the other CPUs; returns the timing CPUs ([] when
    the machine is too small or has no devices; then nothing changes).

    Only the lock holder's timing thread is moved onto its device's timing CPU later, so no
    job's start-up (interpreter, imports), no Snakemake bookkeeping and no compiler can be
    scheduled there while a job times its calls. Workers alone keeping off it (their own
    :func:`reserve_timing_cpus`) left these processes free to land on it: on the H200 run
    timed 0.03 ms calls were then and then stretched to 4 or 8 ms, most often when the other
    CPUs were saturated.
    """
    if not hasattr(os, "sched_setaffinity"):
        return []
    already = reserved_plan(os.sched_getaffinity(0))
    if already:  # a parent workflow already did: keep its plan, and its mask for this process
        _set_process_affinity(already[1])
        return already[0]
    timing, rest = core_plan(os.sched_getaffinity(0), n_devices)
    if not timing:
        return []
    _set_process_affinity(rest)
    os.environ[RESERVED_ENV] = ",".join(map(str, timing))
    if os.environ.get(ISOLATE_SYSTEM_ENV, "") not in ("", "0"):
        report = isolate_system(timing)
        os.environ[ISOLATED_ENV] = json.dumps(report, sort_keys=True)
    return timing


def _pin_to_timing_cpu():
    """Move the calling thread onto the reserved timing CPU; returns the mask to restore."""
    cpu = os.environ.get(TIMING_CPU_ENV, "")
    if not cpu or not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {int(cpu)})
    except (OSError, ValueError):
        return None
    return before


def _report(waited_s: float, waiting_since: float | None, holding_since: float | None = None) -> None:
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"waited_s": waited_s, "waiting_since": waiting_since, "holding_since": holding_since}, fh)
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
        lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
        lock_dir.mkdir(parents=True, exist_ok=True)
        gpu = physical_gpu_name(device.split(":", 1)[1] if ":" in device else "0")
        name = "cpu" if device == "cpu" else "gpu" + "".join(c if c.isalnum() else "-" for c in gpu)
        self.device = device
        self.path = lock_dir / f"l1bench-{name}.lock"
        self.stats = {} if stats is None else stats
        self._fh = None
        self._since = None
        self._restore = None
        self.before_pause = before_pause

    def _acquire(self) -> None:
        t0 = time.perf_counter()
        _report(self.stats.get("lock_wait_s", 0.0), time.time())
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        self._took(t0)

    def _took(self, t0: float) -> None:
        """Bookkeeping once the flock is held (waited since ``t0``)."""
        self._since = time.perf_counter()
        self.stats["lock_wait_s"] = self.stats.get("lock_wait_s", 0.0) + (self._since - t0)
        _report(self.stats["lock_wait_s"], None, time.time())
        self._restore = _pin_to_timing_cpu()
        DeviceLock.current = self

    def try_enter(self) -> bool:
        """Take the lock if it is free now (then as :meth:`__enter__`); False if it is held."""
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        except BaseException:
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
            unpin_threads(os.environ.get(TIMING_CPU_ENV, ""), self._restore)
            self._restore = None
        held = time.perf_counter() - self._since
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        _report(self.stats.get("lock_wait_s", 0.0), None)
        self.stats["lock_held_s"] = self.stats.get("lock_held_s", 0.0) + held

    @staticmethod
    def held_so_far(stats: dict) -> float:
        """Seconds of lock held recorded in ``stats`` plus the open stretch of the lock held
        now, if it records into the same ``stats``: read at both ends of a step, the
        difference is the lock time the step took (waits and pauses inside it excluded)."""
        held = stats.get("lock_held_s", 0.0)
        lock = DeviceLock.current
        if lock is not None and lock.stats is stats and lock._since is not None:
            held += time.perf_counter() - lock._since
        return held

    def move_other_threads_off(self) -> int:
        """Move the threads this process started while holding the lock (all but the calling
        one) off the timing CPU now, not only at release."""
        if self._restore is None:
            return 0
        import threading

        return unpin_threads(os.environ.get(TIMING_CPU_ENV, ""), self._restore, keep=threading.get_native_id())

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
    device: str, lock_dir: str | os.PathLike | None = None, stats: dict | None = None, before_pause=None
) -> DeviceLock:
    """The exclusive lock of ``device`` (a context manager; see :class:`DeviceLock`)."""
    return DeviceLock(device, lock_dir, stats, before_pause)


def claim_free_device(
    devices: list[str], lock_dir=None, stats: dict | None = None, before_pause=None, timing_cpus=None,
    poll_s: float = 0.005,
) -> tuple[int, DeviceLock]:
    """Take the lock of whichever of ``devices`` is free first: (its index, the held lock).

    A job's first GPU section places it: on a machine with several GPUs it takes any free one
    instead of queueing for one picked in advance, so no GPU idles while jobs wait. Later
    sections of the job take that same GPU's lock (its models live there). ``timing_cpus[i]``
    is the timing CPU of ``devices[i]`` (exported for :func:`_pin_to_timing_cpu`). Waiting time
    is reported like a blocking wait (not counted against the job's timeout).
    """
    stats = {} if stats is None else stats
    locks = [DeviceLock(d, lock_dir, stats, before_pause) for d in devices]
    if len(locks) == 1:  # nothing to choose: wait in the lock's queue
        if timing_cpus and timing_cpus[0] is not None:
            os.environ[TIMING_CPU_ENV] = str(timing_cpus[0])
        return 0, locks[0].__enter__()
    t0 = time.perf_counter()
    _report(stats.get("lock_wait_s", 0.0), time.time())
    while True:
        for i, lock in enumerate(locks):
            if timing_cpus and timing_cpus[i] is not None:
                os.environ[TIMING_CPU_ENV] = str(timing_cpus[i])
            if lock.try_enter():
                # the wait before the first try counts too
                stats["lock_wait_s"] = stats.get("lock_wait_s", 0.0) + (lock._since - t0)
                _report(stats["lock_wait_s"], None, time.time())
                return i, lock
        time.sleep(poll_s)


def timing_cpu_of(index: int) -> int | None:
    """The timing CPU of visible device ``index`` (None when none was reserved)."""
    return _TIMING_PLAN[index] if 0 <= index < len(_TIMING_PLAN) else None


def physical_gpu_name(gpu_id: str, proc_gpus: str = "/proc/driver/nvidia/gpus") -> str:
    """A GPU's UUID for ``gpu_id`` as ``CUDA_VISIBLE_DEVICES`` names it (an index, or a UUID),
    from the driver's /proc entries (no call into the driver), so that two runs naming one GPU
    differently still share its lock; ``gpu_id`` itself where /proc does not say. Indices are
    taken in PCI bus order (CUDA's order for identical GPUs)."""
    if gpu_id.startswith("GPU-") or not gpu_id.isdigit():
        return gpu_id
    try:
        buses = sorted(d for d in os.listdir(proc_gpus) if ":" in d)
        text = Path(proc_gpus, buses[int(gpu_id)], "information").read_text()
    except (OSError, IndexError):
        return gpu_id
    for line in text.splitlines():
        if line.startswith("GPU UUID:"):
            return line.split(":", 1)[1].strip() or gpu_id
    return gpu_id


def visible_gpu_ids(proc_gpus: str = "/proc/driver/nvidia/gpus") -> list[str]:
    """The GPUs this process may use, named as ``CUDA_VISIBLE_DEVICES`` names them (indices or
    UUIDs), without starting CUDA: that variable when set, else 0 .. n-1."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        return [] if not ids or ids[0].startswith("-") else ids
    return [str(i) for i in range(visible_gpu_count(proc_gpus))]
