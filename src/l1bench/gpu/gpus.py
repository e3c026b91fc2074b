"""GPU discovery without starting CUDA or calling into the driver: how many GPUs the jobs
will see (:func:`visible_gpu_count`), their names as ``CUDA_VISIBLE_DEVICES`` gives them
(:func:`visible_gpu_ids`), and a GPU's UUID for its lock's name (:func:`physical_gpu_name`).
"""

from __future__ import annotations

import os
from pathlib import Path


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
