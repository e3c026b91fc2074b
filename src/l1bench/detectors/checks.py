"""The individual detectors (except GLOBAL_STATE, in :mod:`.global_state`): each returns a list
of flags ``{"flag": NAME, "reason": ...}`` and its docstring says what it proves and where it
is blind."""

from __future__ import annotations

import math
import threading
import time

from .. import snippet
from ..results import Flag
from .flags import make_flag
from .tensors import as_device, digest, shares_memory, storage_range, sync, tensors_of

# --------------------------------------------------------------------------- LAZY


def check_lazy(out, device) -> list:
    """Flag outputs that are not real, materialised tensors on ``device``: a tensor subclass, another
    device, or an empty storage / null pointer while holding elements (deferred work). Values
    filled in later (threads, streams) pass here. The paper protocol's own check (the ``lazy``
    status) is :func:`l1bench.timing.harness.lazy_problems`: it differs on non-tensor and empty
    outputs and in its wording.
    """
    import torch

    dev = as_device(device)
    flags = []
    for i, o in enumerate(snippet.flatten_outputs(out)):
        if not isinstance(o, torch.Tensor):
            continue
        name = type(o).__name__
        if name not in ("Tensor", "Parameter"):
            flags.append(make_flag(Flag.LAZY, f"output {i} is a {name}, not a plain Tensor"))
            continue
        if as_device(o.device) != dev:
            flags.append(make_flag(Flag.LAZY, f"output {i} on {o.device}, expected {dev}"))
        if o.numel() > 0 and storage_range(o) is None:
            flags.append(make_flag(Flag.LAZY, f"output {i} has no storage or a null data pointer"))
    return flags


# --------------------------------------------------------------------------- ALIAS / SAME_STORAGE


def check_alias_input(out, inputs, reference_aliases: bool = False) -> list:
    """Flag an output that shares memory with an input (the model returned its input, a view of it,
    or wrote into it). Skipped when the reference itself aliases (a reshape task).
    """
    if reference_aliases or not shares_memory(out, inputs):
        return []
    return [make_flag(Flag.ALIAS_INPUT, "an output shares storage with an input")]


def check_same_storage(first_out, later_outs, reference_reuses: bool = False) -> list:
    """Flag later calls' outputs that overlap an earlier output the caller still holds: a persistent
    output buffer that silently overwrites kept results (a held output's address cannot be handed
    out again legitimately).
    """
    if reference_reuses:
        return []
    for k, later in enumerate(later_outs):
        if shares_memory(first_out, later):
            return [make_flag(Flag.SAME_STORAGE, f"call {k + 2} returned the storage of call 1's held output")]
    return []


# --------------------------------------------------------------------------- INPUT_MUTATION


def check_input_mutation(before: list, after: list) -> list:
    """Flag inputs whose bytes changed across a call (digests from :func:`digests`).

    Proves: the model wrote into its inputs.  Limits: a model that restores the
    input before returning is not seen.
    """
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
    if not changed:
        return []
    return [make_flag(Flag.INPUT_MUTATION, f"input tensor(s) {changed} changed during the call")]


# --------------------------------------------------------------------------- CACHED_OUTPUT


def check_later_calls(stale: list, wrong: list) -> list:
    """Flags for later calls of a model whose first call matched the reference: ``stale`` labels
    wrong outputs that match the reference for *earlier* inputs (CACHED_OUTPUT: caching keyed on
    identity, address or shape, or a CUDA graph replayed on the first call's buffers), ``wrong``
    other wrong outputs. A cache keyed on the full contents is invisible (and correct).
    """
    flags = []
    if stale:
        flags.append(make_flag(Flag.CACHED_OUTPUT, "returned the result for earlier inputs on: " + ", ".join(stale)))
    if wrong:
        flags.append(make_flag(Flag.OUTPUT_MISMATCH, "first call right, then wrong on: " + ", ".join(wrong)))
    return flags


# --------------------------------------------------------------------------- BACKGROUND_WORK


def _foreign_threads(before) -> list:
    """Alive threads not in ``before``, ignoring threads that torch itself starts."""
    new = []
    for t in threading.enumerate():
        if t in before or not t.is_alive():
            continue
        target = getattr(t, "_target", None)
        if (getattr(target, "__module__", "") or "").startswith("torch"):
            continue
        new.append(t)
    return new


def check_new_threads(before, when: str) -> list:
    """Flag Python threads that appeared since ``before`` and still run (threads whose target lives in
    ``torch`` are ignored). Native threads and CUDA streams are not seen.
    """
    new = _foreign_threads(before)
    if not new:
        return []
    names = ", ".join(sorted(t.name for t in new))
    return [make_flag(Flag.BACKGROUND_WORK, f"{len(new)} new thread(s) alive after {when}: {names}")]


def settle(device, threads=(), join_timeout_s: float = 1.0, settle_s: float = 0.05) -> None:
    """Let late work finish: device-wide sync, join ``threads``, sleep, sync again."""
    sync(device)
    deadline = time.monotonic() + join_timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    time.sleep(settle_s)
    sync(device)


def check_output_settled(at_return: list, settled: list) -> list:
    """Flag outputs whose digests changed between return (``at_return``) and a full :func:`settle`
    (``settled``): a thread or stream was still writing them. Racy by nature; strict timing's
    EVENT_SYNC_MISMATCH covers streams.
    """
    if at_return == settled:
        return []
    return [make_flag(Flag.BACKGROUND_WORK, "output changed after the call returned (late writes)")]


# --------------------------------------------------------------------------- PRECISION / DTYPE


def to_double(values) -> list:
    """Floating tensors in ``values`` cast to float64; others unchanged."""
    import torch

    return [
        v.detach().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values
    ]


def relative_error(x, ref64):
    """``||x - ref64|| / ||ref64||`` in float64, or None when ``ref64`` is all zeros / empty."""
    r = ref64.detach().double()
    denom = r.norm().item()
    if r.numel() == 0 or denom == 0 or not math.isfinite(denom):
        return None
    xd = x.detach().as_subclass(type(r)).to(device=r.device, dtype=r.dtype)
    return (xd - r).norm().item() / denom


def check_precision(custom_out, ref32_out, ref64_out, factor: float = 10.0, floor: float = 1e-6):
    """``(flags, details)``: PRECISION_DOWNGRADE when, against a float64 run of the reference,
    ``err(custom) > max(factor * err(ref32), floor)`` for some floating output, with
    ``err(x) = ||x - ref64|| / ||ref64||``: half/bfloat16 or TF32 arithmetic hidden behind a cast,
    which ``allclose`` at 1e-2 lets through. An honest but less stable algorithm can be flagged too
    (the reason gives both errors). All-zero or non-float64 references are skipped.
    """
    import torch

    flags, details = [], []
    outs = snippet.flatten_outputs(custom_out)
    for i, (o, r32, r64) in enumerate(
        zip(outs, snippet.flatten_outputs(ref32_out), snippet.flatten_outputs(ref64_out), strict=False)
    ):
        if not all(isinstance(t, torch.Tensor) for t in (o, r32, r64)):
            continue
        if not r32.is_floating_point() or r64.dtype != torch.float64 or tuple(o.shape) != tuple(r64.shape):
            continue
        e_ref, e_cus = relative_error(r32, r64), relative_error(o, r64)
        if e_ref is None or e_cus is None:
            continue
        limit = max(factor * e_ref, floor)
        details.append({"output": i, "err_ref32": e_ref, "err_custom": e_cus, "limit": limit})
        if not e_cus <= limit:  # NaN counts as too large
            flags.append(
                make_flag(Flag.PRECISION_DOWNGRADE, f"output {i}: rel err {e_cus:.2e} vs reference fp32 {e_ref:.2e}")
            )
    return flags, details


def check_dtype(custom_out, ref_out) -> list:
    """Flag outputs whose dtype differs from the reference's.

    Proves: the custom model returns e.g. half where the reference returns
    float32 (``allclose`` casts silently).  Limits: none beyond comparing dtypes.
    """
    import torch

    flags = []
    outs, refs = snippet.flatten_outputs(custom_out), snippet.flatten_outputs(ref_out)
    for i, (o, r) in enumerate(zip(outs, refs, strict=False)):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.dtype != r.dtype:
            flags.append(make_flag(Flag.DTYPE_CHANGED, f"output {i} is {o.dtype}, reference {r.dtype}"))
    return flags


# --------------------------------------------------------------------------- DEGENERATE_TASK


def _is_constant(t) -> bool:
    """True for a non-empty tensor whose elements are all equal (max - min == 0)."""
    import torch

    if t.numel() == 0:
        return False
    v = t.detach()
    if v.is_complex():
        v = torch.view_as_real(v)
    elif v.dtype == torch.bool:
        v = v.to(torch.uint8)
    return bool((v.max() - v.min()).item() == 0)


def check_degenerate(ref_outputs: list, input_digests: list) -> list:
    """Flag a task whose reference output carries no information: constant for every input, or
    identical for differing inputs (``input_digests``); a custom model can then return a constant
    and pass every check.
    """
    import torch

    outs = [tensors_of(o) for o in ref_outputs]
    if not outs or not any(outs):
        return []
    # Constant within every output *and* the same constant for every input: a scalar loss is
    # "constant" within itself, yet it changes with the inputs and carries information.
    if all(ts and all(_is_constant(t) for t in ts) for ts in outs):
        values = {tuple(float(t.detach().reshape(-1)[0].real) for t in ts) for ts in outs}
        if len(values) == 1:
            return [make_flag(Flag.DEGENERATE_TASK, f"reference output is constant for all {len(outs)} random inputs")]
    inputs_differ = len(set(map(tuple, input_digests))) == len(input_digests)
    if inputs_differ and len(outs) > 1:
        ds = [tuple(digest(t) for t in ts) for ts in outs]
        if len(set(ds)) == 1 and all(isinstance(t, torch.Tensor) for t in outs[0]):
            return [make_flag(Flag.DEGENERATE_TASK, "reference output is identical for different random inputs")]
    return []


# --------------------------------------------------------------------------- SPEEDUP_CEILING


def ceiling_flag(score, ceiling: float = 10.0) -> list:
    """Flag a speedup above ``ceiling`` for review (no proof of anything by itself)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return []
    if math.isfinite(value) and value > ceiling:
        return [make_flag(Flag.SPEEDUP_CEILING, f"speedup {value:.2f}x above ceiling {ceiling:g}x: review")]
    if math.isinf(value) and value > 0:
        return [make_flag(Flag.SPEEDUP_CEILING, "infinite speedup: review")]
    return []
