"""Timing CPUs: one CPU per device kept free of everything but the GPU lock holder's thread.

The workflow reserves them (:func:`keep_workflow_off_timing_cpus`) and keeps itself and every
process it starts on the other CPUs; workers take that plan (:func:`reserve_timing_cpus`), and
the lock (:mod:`l1bench.gpu.gpulock`) moves its holder's thread onto its device's timing CPU for a
GPU section (:func:`_pin_to_timing_cpu`) and the threads started there off it again
(:func:`unpin_threads`). With root, :func:`isolate_system` also moves the rest of the machine off.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Environment variable naming the CPU reserved for the lock holder's thread ("" or unset: none):
#: no other job's CPU work (model construction, torch.compile, builds) preempts the thread that
#: launches the timed kernels.
TIMING_CPU_ENV = "L1BENCH_TIMING_CPU"

#: Environment variable listing the timing CPUs the workflow reserved (one per device,
#: :func:`keep_workflow_off_timing_cpus`); workers take their plan from it.
RESERVED_ENV = "L1BENCH_TIMING_CPUS"


#: Timing CPUs of the visible devices, in device order, as :func:`reserve_timing_cpus` planned them.
_TIMING_PLAN: list[int] = []


def core_plan(cpus, n_devices: int, min_cpus: int = 4, siblings=None) -> tuple[list[int], set[int]]:
    """(timing CPU of each device's lock, CPUs for everything else): one CPU per device from the highest
    down, their SMT siblings left idle where there are enough cores; nothing reserved, ([], cpus),
    with fewer than ``min_cpus`` CPUs or fewer than two per device.
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
    """In the workflow's own process: reserve one timing CPU per device and move this process (and so
    everything it starts) onto the other CPUs; returns the timing CPUs ([] on a machine too small,
    or without devices). No job's start-up, Snakemake bookkeeping or compiler then runs where a lock
    holder times its calls (on the H200, timed 0.03 ms calls were otherwise stretched to 4 or 8 ms).
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


def timing_cpu_of(index: int) -> int | None:
    """The timing CPU of visible device ``index`` (None when none was reserved)."""
    return _TIMING_PLAN[index] if 0 <= index < len(_TIMING_PLAN) else None
