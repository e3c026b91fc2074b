"""Idle task workers and the GPU's memory. An idle task worker holds its CUDA context, GPU memory
no step uses: at most so many wait idle per GPU (:class:`IdleTokens`), and a job that takes its
run's every GPU slot asks its run's idle workers to leave (:data:`ALONE_FILE`,
:func:`asked_to_leave`; :func:`l1bench.pool.client.gpu_alone` asks and waits).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from l1bench import lifeline

#: :data:`AUTO` bound: idle task workers may hold this share of their GPU's memory, at
#: :data:`IDLE_WORKER_MIB` each (an idle worker held 714-852 MiB on an H100, torch 2.11, CUDA 13;
#: unbounded, 45 idle workers held ~35 GB of its 80 GB and steps ran out of memory: 2026-12-05).
IDLE_MEMORY_SHARE = 0.20
IDLE_WORKER_MIB = 850
#: The ``max_idle`` that asks for :func:`auto_idle_bound` (the job side's default).
AUTO = -1


def auto_idle_bound(total_mib: float, share: float = IDLE_MEMORY_SHARE, per_worker_mib: float = IDLE_WORKER_MIB) -> int:
    """How many task workers may wait idle on a GPU of ``total_mib`` MiB: those whose contexts
    fit in ``share`` of it, at least 1 (an 80 GB H100: 19; a 141 GB H200: 33)."""
    return max(1, int(share * float(total_mib) // per_worker_mib))


def gpu_total_mib() -> float | None:
    """Total memory of this process's current GPU in MiB, None where CUDA has not started (the
    bound is asked after a step: a step on the GPU has started it)."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**20


#: The file in the task workers' folder (``results/<device>/tmp/task-workers``) by which a job
#: that takes its run's every GPU slot (a retry after running out of GPU memory beside other
#: jobs: :func:`l1bench.plan.gpu_slots`) asks the run's idle task workers to leave, so that their
#: CUDA contexts free the GPU's memory for it (:func:`l1bench.pool.client.gpu_alone` writes it).
ALONE_FILE = "gpu-alone"


def asked_to_leave(home) -> bool:
    """Whether a job has asked the idle task workers of ``home`` to leave: :data:`ALONE_FILE`
    names a process that still runs (a file left by a killed job asks nothing)."""
    try:
        token = json.loads((Path(home) / ALONE_FILE).read_text())["token"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(token, str) and token.split(":")[0].isdigit() and lifeline.alive(token)


def idle_token_stem(lock_dir, device: str | None) -> Path:
    """The idle tokens' path of ``device``'s GPU (``None``: every GPU's, as a glob) without the
    token's number: ``<lock_dir>/l1bench-<gpu>.idle``, beside the GPU's lock files."""
    from l1bench.gpu.gpulock import _made_lock_dir, lock_name

    return _made_lock_dir(lock_dir) / f"l1bench-{'*' if device is None else lock_name(device)}.idle"


def idle_tokens_held(lock_dir=None) -> int:
    """How many idle tokens (:class:`IdleTokens`, every GPU's, in ``lock_dir``) a process holds:
    the idle workers bounded by them. Tokens that cannot be opened (another user's) are not
    counted; a free one is held only for the moment of the test."""
    from l1bench.gpu.gpulock import try_flock

    stem = idle_token_stem(lock_dir, None)
    held = 0
    for path in sorted(stem.parent.glob(f"{stem.name}*")):
        try:
            fh = try_flock(path)
        except OSError:
            continue
        if fh is None:
            held += 1
        else:
            fh.close()
    return held


class IdleTokens:
    """At most ``n`` task workers wait idle at once per GPU of this machine (``n`` 0: no bound;
    :data:`AUTO`: :func:`auto_idle_bound` of the GPU's memory, decided after the first step).
    An idle worker holds one of ``n`` token files (``l1bench-<gpu>.idle<k>`` beside the GPU's
    lock files) under an exclusive flock, and gives it back when a step comes; a worker that
    finds none free after its step exits instead of waiting. The flock goes with the process,
    so a killed worker frees its token."""

    def __init__(self, n: int, total_mib=gpu_total_mib):
        self.n = AUTO if int(n) < 0 else int(n)
        self._total_mib = total_mib
        self._fh = None

    def bound(self) -> int:
        """The bound in force (0: none); :data:`AUTO` turns into a number once the GPU is known
        (no GPU: no bound)."""
        if self.n == AUTO:
            total = self._total_mib()
            if total is None:
                return 0
            self.n = auto_idle_bound(total)
        return self.n

    def take(self, lock_dir, device: str | None) -> bool:
        """Hold a free token of ``device``'s GPU (``lock_dir``: the GPU lock's folder, None for
        the default); True when one was free or there is no bound."""
        if not self.bound() or self._fh is not None:
            return True
        from l1bench.gpu.gpulock import try_flock

        stem = idle_token_stem(lock_dir, device or "cpu")
        for k in range(self.n):
            try:
                self._fh = try_flock(f"{stem}{k}")
            except OSError:  # not ours to open (another user's token file): not free
                continue
            if self._fh is not None:
                return True
        return False

    def give_back(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file lets go of its flock
            self._fh = None

    def keep_until_exit(self) -> None:
        """Hold the token (if held) until this process has ended: a leaving worker still holds its CUDA
        context for a while after :func:`serve` returns. A duplicated descriptor is closed, and the
        flock let go, only by the kernel as the process exits.
        """
        if self._fh is not None:
            os.dup(self._fh.fileno())
