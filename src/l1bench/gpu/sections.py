"""GPU sections: everything about holding the GPU lock.

:func:`exclusive` is a section (the device lock under ``no_grad``, no garbage collection, the
device synchronised and its cached memory handed back before release); the job's first section
places it on whichever visible GPU is free (:func:`claim_gpu`) and starts CUDA there
(:func:`open_device`). :func:`phase` records the wall time of a step in ``stats["phases"]``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time

from l1bench.gpu import gpulock, timingcpus
from l1bench.snippet import InfraError, short


@contextlib.contextmanager
def phase(stats: dict, name: str):
    """Accumulate the wall time of a step into ``stats["phases"][name]`` (seconds)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        phases = stats.setdefault("phases", {})
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 4)


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
    """Start CUDA on ``device`` inside the GPU lock (a no-op where it runs already): the
    driver, the context and the cuBLAS handle are calls into the GPU's resource manager, which
    serialises every process's calls; made outside the lock they delayed other jobs' timed
    device allocations."""
    import torch

    if not device.startswith("cuda") or torch.cuda.is_initialized():
        return
    with phase(stats, "cuda_init (locked)"):
        _start_cuda(device)
        # the driver's threads, started from this (pinned) thread, leave the timing CPU now
        lock = gpulock.DeviceLock.current
        if lock is not None:
            lock.move_other_threads_off()


def claim_gpu(job: dict, stats: dict, before_pause):
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
    )
    index = order[i]
    job["lock_device"] = lock.device
    stats["gpu_id"] = ids[index]
    if not torch.cuda.is_initialized() and len(ids) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
    return lock


@contextlib.contextmanager
def exclusive(device: str, job: dict, stats: dict, keep_cache: bool = False):
    """The device lock, under no_grad and without garbage collection; the device synchronised and
    (unless ``keep_cache``) its cached memory handed back before release, so that no work of this
    section runs into the next holder's timed calls and a waiting worker holds no memory the
    holder needs. ``keep_cache``: the paper protocol's sections between the outer trials of one
    step, whose blocks the next trial reuses as the published harness's trials reuse theirs.
    """
    import torch

    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else None
    with contextlib.ExitStack() as held:
        if device.startswith("cuda") and "lock_device" not in job:
            held.push(claim_gpu(job, stats, sync).__exit__)  # placed: any free GPU
        else:
            held.enter_context(
                gpulock.device_lock(job.get("lock_device", device), job.get("lock_dir"), stats, sync)
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
                    if not keep_cache:
                        torch.cuda.empty_cache()
