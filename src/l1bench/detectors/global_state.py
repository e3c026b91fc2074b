"""GLOBAL_STATE: snapshot, restore and diff of the process-wide torch settings that change
speed or numerics, and the check that flags a change."""

from __future__ import annotations

from ..results import Flag
from .flags import make_flag

#: Backend flags read and written as attributes under ``torch.backends``: (path, legacy?).
#: "Legacy" TF32 switches are views of the ``fp32_precision`` leaves (torch >= 2.9)
#: plus hidden state of their own; :func:`restore_global_state` writes them first.
_BACKEND_ATTRS = (
    ("cudnn.benchmark", False),
    ("cudnn.deterministic", False),
    ("cudnn.enabled", False),
    ("cuda.matmul.allow_fp16_reduced_precision_reduction", False),
    ("cuda.matmul.allow_bf16_reduced_precision_reduction", False),
    ("cuda.matmul.allow_fp16_accumulation", False),
    ("fp32_precision", False),
    ("cuda.matmul.fp32_precision", False),
    ("cudnn.fp32_precision", False),
    ("cudnn.conv.fp32_precision", False),
    ("cudnn.rnn.fp32_precision", False),
    ("mkldnn.fp32_precision", False),
    ("mkldnn.matmul.fp32_precision", False),
    ("mkldnn.conv.fp32_precision", False),
    ("mkldnn.rnn.fp32_precision", False),
    ("cudnn.allow_tf32", True),
    ("cuda.matmul.allow_tf32", True),
)


#: Scaled-dot-product-attention backend switches: (name, getter, setter) in torch.backends.cuda.
_SDP = (
    ("flash_sdp", "flash_sdp_enabled", "enable_flash_sdp"),
    ("mem_efficient_sdp", "mem_efficient_sdp_enabled", "enable_mem_efficient_sdp"),
    ("math_sdp", "math_sdp_enabled", "enable_math_sdp"),
    ("cudnn_sdp", "cudnn_sdp_enabled", "enable_cudnn_sdp"),
)


_UNREADABLE = "<unreadable>"


def _resolve(path: str):
    """(owner object, attribute name) of a dotted path under ``torch.backends``, or None."""
    import torch

    obj = torch.backends
    *parts, last = path.split(".")
    for p in parts:
        obj = getattr(obj, p, None)
        if obj is None:
            return None
    try:
        getattr(obj, last)
    except AttributeError:
        return None
    except Exception:  # noqa: BLE001 - exists, but torch refuses to read it right now
        pass
    return obj, last


def _read(fn):
    try:
        value = fn()
    except Exception:  # noqa: BLE001 - e.g. torch refuses to read mixed legacy/new TF32 flags
        return _UNREADABLE
    return str(value) if not isinstance(value, (bool, int, float, str)) else value


def snapshot_global_state() -> dict:
    """Every global torch setting that changes speed or numerics, as a flat dict: ``backends.<path>``
    flags (cuDNN, TF32, reduced-precision reductions, torch >= 2.9's ``fp32_precision`` leaves), SDPA
    switches, matmul precision, default dtype, deterministic algorithms, thread count. Values torch
    refuses to read are recorded as ``"<unreadable>"``.
    """
    import torch

    snap = {}
    for path, _derived in _BACKEND_ATTRS:
        where = _resolve(path)
        if where is not None:
            obj, name = where
            snap[f"backends.{path}"] = _read(lambda: getattr(obj, name))  # noqa: B023 - called at once
    cuda_b = torch.backends.cuda
    for name, getter, _setter in _SDP:
        if hasattr(cuda_b, getter):
            snap[f"sdp.{name}"] = _read(getattr(cuda_b, getter))
    snap["float32_matmul_precision"] = _read(torch.get_float32_matmul_precision)
    snap["default_dtype"] = _read(torch.get_default_dtype)
    snap["deterministic_algorithms"] = _read(torch.are_deterministic_algorithms_enabled)
    snap["deterministic_warn_only"] = _read(torch.is_deterministic_algorithms_warn_only_enabled)
    snap["num_threads"] = _read(torch.get_num_threads)
    return snap


def _set_backend(path: str, want) -> None:
    where = _resolve(path)
    if want == _UNREADABLE or where is None:
        return
    obj, name = where
    if _read(lambda: getattr(obj, name)) != want:
        setattr(obj, name, want)


def restore_global_state(snap: dict) -> None:
    """Put back the settings of :func:`snapshot_global_state` that differ (unreadable ones skipped):
    the legacy TF32 switches and matmul precision first, as on torch >= 2.9 they also write some
    ``fp32_precision`` leaves, then the leaves and the other flags.
    """
    import torch

    for path, derived in _BACKEND_ATTRS:
        if derived:
            _set_backend(path, snap.get(f"backends.{path}", _UNREADABLE))
    want = snap.get("float32_matmul_precision", _UNREADABLE)
    if want != _UNREADABLE and _read(torch.get_float32_matmul_precision) != want:
        torch.set_float32_matmul_precision(want)
    for path, derived in _BACKEND_ATTRS:
        if not derived:
            _set_backend(path, snap.get(f"backends.{path}", _UNREADABLE))
    cuda_b = torch.backends.cuda
    for name, getter, setter in _SDP:
        want = snap.get(f"sdp.{name}", _UNREADABLE)
        if want != _UNREADABLE and hasattr(cuda_b, setter) and _read(getattr(cuda_b, getter)) != want:
            getattr(cuda_b, setter)(want)
    want = snap.get("default_dtype", _UNREADABLE)
    if want != _UNREADABLE and str(torch.get_default_dtype()) != want:
        torch.set_default_dtype(getattr(torch, want.replace("torch.", "")))
    det, warn = snap.get("deterministic_algorithms"), snap.get("deterministic_warn_only")
    current = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    if _UNREADABLE not in (det, warn) and current != (det, warn):
        torch.use_deterministic_algorithms(det, warn_only=warn)
    want = snap.get("num_threads", _UNREADABLE)
    if want != _UNREADABLE and torch.get_num_threads() != want:
        torch.set_num_threads(want)


def diff_global_state(before: dict, after: dict) -> list:
    """Keys whose values differ between two snapshots (sorted)."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def check_global_state(before: dict, after: dict, when: str) -> list:
    """Flag global settings (:func:`snapshot_global_state`) changed between two snapshots: they would
    change the reference's speed or numerics too. Changes undone inside one call are not seen.
    """
    changed = diff_global_state(before, after)
    if not changed:
        return []
    detail = ", ".join(f"{k}: {before.get(k)!r}->{after.get(k)!r}" for k in changed[:4])
    return [make_flag(Flag.GLOBAL_STATE, f"{when} changed {detail}")]
