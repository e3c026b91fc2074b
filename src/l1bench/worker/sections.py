"""GPU sections: everything about holding the GPU lock.

:func:`exclusive` is a section (the device lock under ``no_grad``, no garbage collection, the
device synchronised and its cached memory handed back before release); the job's first section
places it on whichever visible GPU is free (:func:`claim_gpu`) and starts CUDA there
(:func:`open_device`). :func:`phase` records the wall time of a step in ``stats["phases"]``.

Design 5 (opt-in, ``job["shared_sections"]``): :func:`shared` is a section for GPU work that is
not timed (CUDA's start, the reference warm-up, correctness trials, placing models): several
jobs may hold one at once, none while an exclusive one is held, and its holder stays off the
timing CPU; :func:`exclusive` then takes the lock exclusive through the turnstile (writer
preference, :class:`l1bench.gpulock.DeviceLock`). Without the flag both are today's exclusive
section.

Design 6 (opt-in, ``job["cuda_start_outside_lock"]``): :func:`start_cuda_outside_lock` starts
CUDA as the first section begins, before its lock is taken, one job at a time per GPU.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

from l1bench import gpulock, timingcpus
from l1bench.snippet import InfraError, short
from l1bench.worker import lockprofile


@contextlib.contextmanager
def phase(stats: dict, name: str):
    """Accumulate the wall time of a step into ``stats["phases"][name]`` and the GPU-lock time
    it held into ``stats["phases_locked"][name]`` (seconds; a step's wall also counts the
    waits for the lock after a pause, its lock time does not). Exclusive sections only: the
    time a step held a shared section (design 5) goes to ``stats["phases_shared"][name]``
    (steps that held one only; absent without shared sections)."""
    t0, held0 = time.perf_counter(), gpulock.DeviceLock.held_so_far(stats)
    shared0 = gpulock.DeviceLock.held_so_far(stats, shared=True)
    try:
        with lockprofile.step(name):  # opt-in: where the step's lock time goes
            yield
    finally:
        phases = stats.setdefault("phases", {})
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 4)
        locked = stats.setdefault("phases_locked", {})
        locked[name] = round(locked.get(name, 0.0) + gpulock.DeviceLock.held_so_far(stats) - held0, 4)
        in_shared = gpulock.DeviceLock.held_so_far(stats, shared=True) - shared0
        if in_shared > 0:
            held_shared = stats.setdefault("phases_shared", {})
            held_shared[name] = round(held_shared.get(name, 0.0) + in_shared, 4)


#: Where the job started CUDA (``stats["cuda_started"]``).
STARTED_INSIDE = "inside the GPU lock"
STARTED_OUTSIDE = "outside the GPU lock"  # design 6
#: Design 6 with several GPUs visible: started inside the lock after all (which GPU the job
#: gets is decided as it takes a GPU lock). Recorded before the start: :func:`open_device` does it.
STARTED_INSIDE_SEVERAL = "inside the GPU lock (several GPUs)"
#: Where CUDA was started when it already runs as a job's first section opens: set by a task
#: worker (design 7, :mod:`l1bench.worker.serve`) for its later steps; None: by the snippets.
CUDA_STARTED_BEFORE: str | None = None


def _start_cuda(device: str) -> None:
    """Start CUDA on ``device``: the driver (cuInit), the context, a first allocation and the
    cuBLAS handle. No usable device is an InfraError (the run broke, not the task)."""
    import torch

    index = int(device.split(":")[1]) if ":" in device else 0
    try:
        torch.cuda.set_device(index)
        torch.empty(1, device=device)
    except Exception as err:  # no usable device: the run broke, not the task
        raise InfraError(f"CUDA could not start on {device}: {short(err, 200)}") from err
    try:
        torch.cuda.current_blas_handle()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass


def open_device(device: str, stats: dict) -> None:
    """Start CUDA on ``device``, inside the GPU lock: the driver (cuInit), the context and the
    cuBLAS handle. They run no kernel, but they are calls into the GPU's resource manager,
    which serialises every process's calls: made outside the lock, they delayed the device
    allocations in other jobs' timed calls (the first timed pair of an outer trial allocates
    its outputs). Inside the lock the thread runs on the timing CPU: ~0.1 s. A no-op once
    CUDA is running (design 6: :func:`start_cuda_outside_lock` started it)."""
    import torch

    # a place recorded means CUDA has started, but design 6's fallback (to be started here)
    if not device.startswith("cuda") or stats.get("cuda_started", STARTED_INSIDE_SEVERAL) != STARTED_INSIDE_SEVERAL:
        return
    if torch.cuda.is_initialized():  # by the snippets' own code (at import, in __init__)
        stats.setdefault("cuda_started", CUDA_STARTED_BEFORE or "before the first GPU section")
        return
    stats.setdefault("cuda_started", STARTED_INSIDE)
    with phase(stats, "cuda_init (locked)"):
        _start_cuda(device)
        # the driver's threads, started from this (pinned) thread, leave the timing CPU now:
        # they would otherwise compete with it through the section's timed calls
        lock = gpulock.DeviceLock.current
        stats["driver_threads_moved"] = lock.move_other_threads_off() if lock is not None else 0


def start_cuda_outside_lock(device: str, job: dict, stats: dict) -> None:
    """Design 6 (opt-in, ``job["cuda_start_outside_lock"]``): start CUDA before the job's first
    GPU section, outside the GPU lock, so the ~0.25 s of cuInit, context and cuBLAS handle no
    longer hold it; one job at a time per GPU (:func:`l1bench.gpulock.start_lock`), so the
    waiting jobs never call into the driver's resource manager all at once, and not on the
    timing CPU (this process is not pinned here; the driver's threads are moved off it anyway).
    A timed section of another job then runs beside at most one CUDA start; design 4's
    re-timing of a first pair slowed in the driver is what catches one it delayed.

    Records ``cuda_started``, ``start_lock_wait_s`` (also counted in ``lock_wait_s``: the runner
    does not count it against the timeout) and the phase ``cuda_init (start lock)``;
    :func:`open_device` is then a no-op. Without the flag, on the CPU, or where CUDA already
    runs, nothing; with several GPUs visible (the GPU is chosen as its lock is taken) CUDA
    starts inside the lock as without the flag (``STARTED_INSIDE_SEVERAL``)."""
    if not job.get("cuda_start_outside_lock") or not device.startswith("cuda") or "cuda_started" in stats:
        return
    import torch

    if torch.cuda.is_initialized():  # the snippets' own code did: open_device says so
        return
    ids = job.get("gpu_ids") or ["0"]
    if len(ids) > 1:
        stats["cuda_started"] = STARTED_INSIDE_SEVERAL
        return
    with gpulock.start_lock(f"cuda:{ids[0]}", job.get("lock_dir"), stats) as waited:
        stats["start_lock_wait_s"] = round(waited, 4)
        stats["cuda_started"] = STARTED_OUTSIDE
        with phase(stats, "cuda_init (start lock)"):
            _start_cuda(device)
            try:
                torch.cuda.synchronize(device)
            except Exception as err:
                raise InfraError(f"CUDA could not start on {device}: {short(err, 200)}") from err
            stats["driver_threads_moved"] = _driver_threads_off_timing_cpu()


def _driver_threads_off_timing_cpu() -> int:
    """Move threads of this (unpinned) process that are on the GPU's timing CPU off it, as a
    shared section's release does (:meth:`l1bench.gpulock.DeviceLock._release`); how many."""
    cpu = os.environ.get(timingcpus.TIMING_CPU_ENV) or timingcpus.timing_cpu_of(0)
    if cpu is None or not hasattr(os, "sched_getaffinity"):
        return 0
    return timingcpus.unpin_threads(cpu, os.sched_getaffinity(0))


def claim_gpu(job: dict, stats: dict, before_pause, mode: str | None = None):
    """The job's first GPU section: the lock of whichever visible GPU is free first, held.

    CUDA then starts with only that GPU visible (``CUDA_VISIBLE_DEVICES``), so ``cuda:0`` is it
    and no context is made on the others. Where CUDA already runs (a snippet started it at
    import), every GPU is visible and ``cuda:0`` is the first one: that one is taken.
    """
    import torch

    ids = job.get("gpu_ids") or ["0"]
    order = [0] if torch.cuda.is_initialized() else list(range(len(ids)))
    i, lock = gpulock.claim_free_device(
        [f"cuda:{ids[k]}" for k in order],
        job.get("lock_dir"),
        stats,
        before_pause,
        [timingcpus.timing_cpu_of(k) for k in order],
        mode=mode,
    )
    index = order[i]
    job["lock_device"] = lock.device
    stats["gpu_id"] = ids[index]
    if not torch.cuda.is_initialized() and len(ids) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
    return lock


def lock_mode(job: dict, shared: bool) -> str | None:
    """The lock mode of a section: None (the plain exclusive lock) without shared sections;
    with them (design 5) ``"shared"`` or ``"exclusive"`` (through the turnstile)."""
    if not job.get("shared_sections"):
        return None
    return gpulock.SHARED if shared else gpulock.EXCLUSIVE


def shared(device: str, job: dict, stats: dict):
    """A section for GPU work that is not timed: shared with other jobs' shared sections in
    design 5 (``job["shared_sections"]``), else :func:`exclusive` itself. Everything else is
    :func:`exclusive`'s (no_grad, no GC, the device synchronised and its cache emptied before
    release), except that its holder is not pinned to the timing CPU."""
    return exclusive(device, job, stats, shared=True)


@contextlib.contextmanager
def exclusive(device: str, job: dict, stats: dict, shared: bool = False):
    """The device lock, under no_grad; the device is synchronised and cached device memory
    handed back before release.

    Kernels are launched asynchronously: without the synchronisation, work launched at the end
    of a section (a warm-up, eager code before a recompilation) could still be running when
    the next job's timed calls start; for the same reason the device is synchronised before the
    lock is paused for CPU work inside a section (a compile, an extension build). Up to one
    worker per core waits for the lock at once: memory a waiting worker's caching allocator
    still holds from its last section is memory the lock holder cannot have.

    ``shared=True`` (design 5 only, see :func:`shared`): the lock taken shared.
    """
    import torch

    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else None
    mode = lock_mode(job, shared)
    with contextlib.ExitStack() as held:
        if device.startswith("cuda") and "lock_device" not in job:
            start_cuda_outside_lock(device, job, stats)  # design 6 only
            held.push(claim_gpu(job, stats, sync, mode).__exit__)  # placed: any free GPU
        else:
            held.enter_context(
                gpulock.device_lock(job.get("lock_device", device), job.get("lock_dir"), stats, sync, mode)
            )
        held.enter_context(torch.no_grad())
        open_device(device, stats)
        # No garbage collection inside a section: a full collection over torch's own objects
        # (milliseconds) would otherwise land in a timed call now and then.
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()
            if device.startswith("cuda"):
                try:
                    torch.cuda.synchronize(device)
                finally:
                    torch.cuda.empty_cache()
