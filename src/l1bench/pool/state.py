"""What a task worker (:mod:`l1bench.pool.server`) keeps between its task's steps, so that a
step runs as in a fresh process: torch's settings, bindings and process-wide modes as they were
at the start, the snippets' modules dropped after each step, and when it must retire instead.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from pathlib import Path

from l1bench import provenance

#: Steps one worker serves at most before it retires (a task has a check and at most four
#: eager time steps: paper default, cuda_graph, cudnn and strict default).
MAX_STEPS = 8

#: Prefix of snippet modules (:func:`l1bench.snippet.exec_source`), dropped after each step.
SNIPPET_MODULE_PREFIX = "l1snip_"


def watched_namespaces() -> dict:
    """The objects whose attributes a step must not replace: torch's top-level namespace and its
    functional, init, autograd, linalg, fft, special and cuda modules, the Tensor classes, and
    every ``torch.nn`` module class (a patched ``nn.Conv2d.forward`` reaches every reference)."""
    import torch
    import torch.nn.functional as F

    spaces = {
        "torch": torch,
        "torch.nn.functional": F,
        "torch.nn.init": torch.nn.init,
        "torch.autograd": torch.autograd,
        "torch.linalg": torch.linalg,
        "torch.fft": torch.fft,
        "torch.special": torch.special,
        "torch.cuda": torch.cuda,
        "torch.Tensor": torch.Tensor,
    }
    base = getattr(torch._C, "TensorBase", None) or getattr(torch._C, "_TensorBase", None)
    if base is not None:
        spaces["torch._C.TensorBase"] = base
    for name, cls in vars(torch.nn).items():
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            spaces[f"torch.nn.{name}"] = cls
    return spaces


def bindings(spaces: dict) -> dict:
    """``{"space.name": object}`` of every callable, class, property or static/class method
    bound in each space's own ``__dict__`` (the objects themselves: identity is compared)."""
    out = {}
    for label, space in spaces.items():
        try:
            items = list(vars(space).items())
        except TypeError:
            continue
        for name, value in items:
            if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                out[f"{label}.{name}"] = value
    return out


def replaced(before: dict, after: dict) -> list[str]:
    """Names of ``before`` (:func:`bindings`) that ``after`` binds to another object or no longer
    has. Names new in ``after`` do not count: torch binds some lazily."""
    return sorted(k for k, v in before.items() if after.get(k, replaced) is not v)


def torch_rewrapped(old, new, depth: int = 8) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old``: its code lives in torch's package and
    its ``__wrapped__`` chain reaches ``old``. Importing ``torch._dynamo`` wraps
    ``torch.manual_seed`` so (and using ``torch.compile`` ``nn.Module.__init__``): once per
    process, as in a fresh process whose snippet does the same. A snippet's own wrapper has its
    code in the snippet (``functools.wraps`` copies names, not code)."""
    import torch

    code = getattr(new, "__code__", None)
    if old is None or code is None:
        return False
    home = Path(torch.__file__).resolve().parent
    try:
        Path(code.co_filename).resolve().relative_to(home)
    except (ValueError, OSError):
        return False
    seen = new
    for _ in range(depth):
        seen = getattr(seen, "__wrapped__", None)
        if seen is None:
            return False
        if seen is old:
            return True
    return False


def process_modes() -> dict:
    """Process-wide modes that no setting restore puts back: grad mode, inference mode, anomaly
    detection and (torch >= 2.3) the default device."""
    import torch

    modes = {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "anomaly_enabled": torch.is_anomaly_enabled(),
    }
    if hasattr(torch, "get_default_device"):
        modes["default_device"] = str(torch.get_default_device())
    return modes


#: Variables the worker itself sets for a step (l1bench.worker.entry, gpu.sections.claim_gpu).
OWN_ENV = ("TORCH_EXTENSIONS_DIR", "CUDA_VISIBLE_DEVICES")
#: Prefixes of variables torch sets itself when a snippet imports its compiler (importing
#: torch._dynamo sets TORCHINDUCTOR_CACHE_DIR), and of the workflow's own.
OWN_PREFIXES = ("L1BENCH_", "TORCHINDUCTOR_", "TRITON_")


def environment() -> dict:
    """The process's environment, less what the worker and torch set themselves."""
    return {k: v for k, v in os.environ.items() if not k.startswith(OWN_PREFIXES) and k not in OWN_ENV}


def step_label(job: dict) -> str:
    """``check``, or ``time <protocol>/<mode>``."""
    if job.get("kind") == "time":
        return f"time {job.get('protocol')}/{job.get('mode')}"
    return str(job.get("kind"))


class TaskWorker:
    """The state of one task worker between steps: what it must find unchanged, and what ran."""

    def __init__(self, max_steps: int = MAX_STEPS):
        from l1bench.detectors import global_state as detectors

        self.max_steps = max_steps
        self.started = provenance.now_iso()
        self.steps: list[str] = []
        self.tid: str | None = None
        self.lock_device: str | None = None
        self.gpu_id: str | None = None
        self.settings = detectors.snapshot_global_state()
        self.modes = process_modes()
        self.environ = environment()
        self.namespaces = bindings(watched_namespaces())
        self.threads = set(threading.enumerate())

    def prepare(self, job: dict) -> None:
        """Before a step: the GPU this worker took in its first section (so the step takes the
        same GPU's lock)."""
        if self.tid is not None and job.get("tid") != self.tid:
            raise ValueError(f"task worker of {self.tid} was sent a step of {job.get('tid')}")
        self.tid = job.get("tid")
        if self.lock_device:
            job["lock_device"] = self.lock_device
        if self.steps:
            import torch

            if torch.cuda.is_initialized():  # each step's result records its own peaks (entry.gpu_memory)
                torch.cuda.reset_peak_memory_stats()

    def record(self, job: dict, res: dict) -> None:
        """After a step that made a result: what the result says about this worker."""
        self.lock_device = job.get("lock_device") or self.lock_device
        self.gpu_id = res.get("gpu_id") or self.gpu_id
        res.setdefault("provenance", {})["task_worker"] = {
            "pid": os.getpid(),
            "started": self.started,
            "step": len(self.steps) + 1,
            "earlier_steps": list(self.steps),
            "gpu_id": self.gpu_id,
        }
        self.steps.append(step_label(job))

    @staticmethod
    def drop_step() -> None:
        """After a step: its snippets' modules dropped and its objects collected, so that their
        device memory goes back to the allocator (outside the lock, as a one-shot worker's exit
        frees everything: no kernel runs)."""
        for name in [n for n in sys.modules if n.startswith(SNIPPET_MODULE_PREFIX)]:
            del sys.modules[name]
        gc.collect()

    def tidy(self) -> dict:
        """After a step (and :meth:`drop_step`): settings put back, and whether the worker must
        retire; ``{"restored": [...], "retire": reason or None, "torch_rewrapped": [...]}``."""
        from l1bench.detectors import global_state as detectors
        from l1bench.detectors.checks import _foreign_threads

        restored = detectors.diff_global_state(self.settings, detectors.snapshot_global_state())
        if restored:
            detectors.restore_global_state(self.settings)
        why = None
        now = bindings(watched_namespaces())
        patched = replaced(self.namespaces, now)
        # torch's own wrappers (dynamo's import): the new bindings are the ones to keep finding
        rewrapped = [k for k in patched if torch_rewrapped(self.namespaces[k], now.get(k))]
        self.namespaces.update({k: now[k] for k in rewrapped})
        patched = [k for k in patched if k not in rewrapped]
        modes = process_modes()
        left = [t.name for t in _foreign_threads(self.threads)]
        still = detectors.diff_global_state(self.settings, detectors.snapshot_global_state())
        env = environment()
        changed_env = sorted(k for k in env.keys() | self.environ.keys() if env.get(k) != self.environ.get(k))
        if patched:
            why = f"the step replaced {len(patched)} of torch's bindings: {', '.join(patched[:4])}"
        elif modes != self.modes:
            why = "the step changed " + ", ".join(k for k in modes if modes[k] != self.modes.get(k))
        elif left:
            why = f"threads the step started still run: {', '.join(sorted(left)[:4])}"
        elif changed_env:
            # e.g. TORCH_CUDA_ARCH_LIST or CUDA_MODULE_LOADING set by custom code (a100/l40 L1_T035,
            # h100 L2_T049): a later step of a fresh process would not see them
            why = f"the step changed the environment: {', '.join(changed_env[:4])}"
        elif still:
            why = f"settings could not be put back: {', '.join(still[:4])}"
        elif len(self.steps) >= self.max_steps:
            n = len(self.steps)
            why = f"served {n} step{'s' * (n != 1)}, the most one worker serves"
        return {"restored": restored, "retire": why, "torch_rewrapped": rewrapped}


def empty_device_cache(job: dict) -> None:
    """Hand the allocator's cached device memory back, inside the GPU lock (a call into the
    driver's resource manager), where the step used a GPU."""
    import torch

    device = job.get("device") or ""
    if not device.startswith("cuda") or not torch.cuda.is_initialized() or not torch.cuda.memory_reserved():
        return
    from l1bench.gpu.sections import exclusive

    with exclusive(device, dict(job), {}):
        pass  # the section's end synchronises and empties the cache
