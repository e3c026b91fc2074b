"""Load KernelBench-style snippets (reference ``Model`` and custom ``ModelNew``).

These functions execute untrusted code: call them only inside a worker child
process (:mod:`l1bench.worker`), never in the Snakemake process.
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import random
import sys
import types

from l1bench.results import Status


class SnippetError(Exception):
    """A deterministic problem with a snippet; ``status`` names the result status
    (:class:`l1bench.results.Status`)."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def exec_source(src: str, label: str) -> types.ModuleType:
    """Execute ``src`` as a fresh module named ``l1snip_<label>_<hash>``.

    The module is registered in ``sys.modules`` and its source in ``linecache`` so
    tracebacks, ``inspect`` and ``torch.compile`` can see it.
    """
    name = f"l1snip_{label}_{sha256_text(src)[:12]}"
    filename = f"<{name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    code = compile(src, filename, "exec")
    exec(code, mod.__dict__)
    return mod


def load_reference(src: str, label: str = "ref"):
    """Return (Model, get_inputs, get_init_inputs) of a reference or baseline snippet."""
    mod = exec_source(src, label)
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        raise SnippetError(Status.BASELINE_ERROR, f"{label} snippet lacks {', '.join(missing)}")
    return mod.Model, mod.get_inputs, mod.get_init_inputs


def load_custom(src: str, label: str = "custom"):
    """Return the ``ModelNew`` class of a custom snippet."""
    try:
        mod = exec_source(src, label)
    except SyntaxError as err:
        raise SnippetError(Status.COMPILE_ERROR, f"syntax error: {err.msg} (line {err.lineno})") from None
    except Exception as err:  # noqa: BLE001 - any exception while loading is the snippet's fault
        raise classify_exception(err, Status.LOAD_ERROR, "loading custom code") from None
    model_new = getattr(mod, "ModelNew", None)
    if model_new is None:
        raise SnippetError(Status.MISSING_MODEL_NEW, "custom code defines no ModelNew")
    if not isinstance(model_new, type):
        raise SnippetError(Status.MISSING_MODEL_NEW, f"ModelNew is a {type(model_new).__name__}, not a class")
    return model_new


#: Exception texts that mean the CUDA context or the process is broken (not a verdict).
INFRA_MARKERS = (
    "out of memory",
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cudaError",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
)

#: Exception texts that mean an extension failed to compile.
COMPILE_MARKERS = ("Error building extension", "ninja: build stopped", "nvcc", "compilation terminated")


class InfraError(Exception):
    """The run broke (CUDA fault, OOM): the job must fail and be retried, not recorded."""


def classify_exception(err: BaseException, default_status: str, during: str) -> Exception:
    """Map an exception raised by snippet code to a SnippetError or an InfraError."""
    text = f"{type(err).__name__}: {err}"
    if type(err).__name__ == "OutOfMemoryError" or any(m in text for m in INFRA_MARKERS):
        return InfraError(f"{during}: {short(text)}")
    if any(m in text for m in COMPILE_MARKERS):
        return SnippetError(Status.COMPILE_ERROR, f"{during}: {short(text)}")
    return SnippetError(default_status, f"{during}: {short(text)}")


@contextlib.contextmanager
def guarded(during: str, default_status: str):
    """Turn exceptions from snippet code into SnippetError / InfraError."""
    try:
        yield
    except (SnippetError, InfraError):
        raise
    except Exception as err:
        raise classify_exception(err, default_status, during) from err


def short(text: str, limit: int = 300) -> str:
    """One line, at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def set_seed(seed: int) -> None:
    """Seed torch (CPU and current CUDA device), as the published harness does."""
    import torch

    torch.manual_seed(seed)
    # queued until CUDA starts when it has not (asking is_available() would start the driver
    # outside the GPU lock)
    torch.cuda.manual_seed(seed)
    random.seed(seed)


def to_device(values, device):
    """Move tensors in a list to ``device``; leave other values alone."""
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def make_inputs(get_inputs, device):
    """Call ``get_inputs`` (its random tensors drawn on the host) and move its tensors to
    ``device``, as the published harness does (``get_inputs()`` then ``.cuda()``)."""
    return to_device(get_inputs(), device)


def build_model(cls, init_inputs, seed: int, device):
    """Construct ``cls(*init_inputs)`` under ``seed`` and move it to ``device``."""
    import torch

    with torch.no_grad():
        set_seed(seed)
        model = cls(*init_inputs)
        if hasattr(model, "to"):
            model = model.to(device)
    return model


def flatten_outputs(out) -> list:
    """A model output as a flat list (tensor, tuple/list of tensors, or other)."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]
