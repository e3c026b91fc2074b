"""Integrity detectors: catch custom models that fool a speed benchmark.

The published CUDA-L1 harness checks a custom ``ModelNew`` against the reference
``Model`` with ``allclose`` on a few inputs and then times repeated calls.  A
custom model can pass that and still be fast for the wrong reasons (reward
hacks): lazy outputs, returning its input, caching outputs keyed on input
identity, doing the work on threads or streams the timer does not wait for,
changing global backend flags, or computing in lower precision.

Each detector here is a small function that returns a list of flags
``{"flag": NAME, "reason": one short line}``; :func:`run_detectors` builds both
models, runs them on fresh inputs and collects every detector's flags.  A flag
says "review this result", not "this is proven cheating": each docstring states
what the detector proves and where it is blind.

These functions execute untrusted snippet code: call them only inside a worker
child process, never in the Snakemake process.  They work on CPU (``"cpu"``) and
CUDA (``"cuda:N"``); CUDA-only steps are guarded with ``device.type == "cuda"``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import threading
import time

from . import snippet
from .results import Flag

# --------------------------------------------------------------------------- flag names

#: The flag names, as module attributes (defined, with what each means, in l1bench.results.Flag).
LAZY = Flag.LAZY
ALIAS_INPUT = Flag.ALIAS_INPUT
SAME_STORAGE = Flag.SAME_STORAGE
INPUT_MUTATION = Flag.INPUT_MUTATION
CACHED_OUTPUT = Flag.CACHED_OUTPUT
OUTPUT_MISMATCH = Flag.OUTPUT_MISMATCH
BACKGROUND_WORK = Flag.BACKGROUND_WORK
GLOBAL_STATE = Flag.GLOBAL_STATE
PRECISION_DOWNGRADE = Flag.PRECISION_DOWNGRADE
DTYPE_CHANGED = Flag.DTYPE_CHANGED
DEGENERATE_TASK = Flag.DEGENERATE_TASK
SPEEDUP_CEILING = Flag.SPEEDUP_CEILING
DETECTOR_ERROR = Flag.DETECTOR_ERROR
EVENT_SYNC_MISMATCH = Flag.EVENT_SYNC_MISMATCH
L2_RESIDENT = Flag.L2_RESIDENT
EXTENSION_BUILD_FAILED = Flag.EXTENSION_BUILD_FAILED

ALL_FLAGS = (
    LAZY,
    ALIAS_INPUT,
    SAME_STORAGE,
    INPUT_MUTATION,
    CACHED_OUTPUT,
    OUTPUT_MISMATCH,
    BACKGROUND_WORK,
    GLOBAL_STATE,
    PRECISION_DOWNGRADE,
    DTYPE_CHANGED,
    DEGENERATE_TASK,
    SPEEDUP_CEILING,
    DETECTOR_ERROR,
    EVENT_SYNC_MISMATCH,
    L2_RESIDENT,
    EXTENSION_BUILD_FAILED,
)

#: Defaults of the ``cfg`` keys read by :func:`run_detectors`.
DEFAULTS = {
    "seed": 42,
    "atol": 1e-2,
    "rtol": 1e-2,
    "n_calls": 3,
    "precision_factor": 10.0,
    "precision_floor": 1e-6,
    "settle_s": 0.05,
    "join_timeout_s": 1.0,
}


def make_flag(name: str, reason: str) -> dict:
    """A flag record; ``reason`` is shortened to one line."""
    return {"flag": name, "reason": snippet.short(reason, 200)}


def flag_names(flags) -> list:
    """The distinct flag names in ``flags``, in first-seen order."""
    seen = []
    for f in flags:
        if f["flag"] not in seen:
            seen.append(f["flag"])
    return seen


# --------------------------------------------------------------------------- helpers


def as_device(device):
    """``device`` as a ``torch.device`` with an explicit CUDA index."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def sync(device) -> None:
    """Wait for all work on ``device`` (every stream); no-op on CPU."""
    import torch

    dev = as_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def tensors_of(values) -> list:
    """The tensors in a flat list / tuple / single value (outputs or inputs)."""
    import torch

    return [v for v in snippet.flatten_outputs(values) if isinstance(v, torch.Tensor)]


def clone_values(values) -> list:
    """Deep copy of an input list: tensors cloned (same device), others kept."""
    import torch

    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def digest(t) -> str:
    """A fingerprint of a tensor's bytes, with dtype and shape; NaN-safe.

    CPU tensors: sha1 of the bytes. Device tensors: :func:`device_fingerprint`, computed where
    the tensor lives (copying hundreds of MB to the host and hashing them there took seconds
    per call for the large inputs of level-1 tasks, inside the GPU lock).
    """
    import torch

    plain = t.detach()
    if type(plain) is not torch.Tensor:  # materialise subclasses into plain tensors
        plain = plain.clone().as_subclass(torch.Tensor)
    flat = plain.contiguous().reshape(-1)
    h = hashlib.sha1(f"{flat.dtype}{tuple(t.shape)}".encode())
    if flat.numel() and flat.device.type != "cpu":
        h.update(device_fingerprint(flat).encode())
    elif flat.numel():
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def device_fingerprint(flat) -> str:
    """Two position-weighted sums of a 1-D tensor's bytes (as int32 words), on its device.

    Equal bytes give equal sums; any change of a word changes both sums unless it is
    cancelled mod 2**64 by changes elsewhere (not a cryptographic hash: it detects mutation,
    caching and stale outputs, not an adversary forging collisions against it).
    """
    import torch

    raw = flat.view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32).to(torch.int64)
    idx = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
    a = (words * (idx * 2654435761 + 1)).sum().item()
    b = ((words + 0x9E3779B9) * (idx * 40503 + 7919) ^ (idx << 17)).sum().item()
    return f"{raw.numel()}:{a}:{b}"


def digests(values) -> list:
    """:func:`digest` of every tensor in ``values``."""
    return [digest(t) for t in tensors_of(values)]


def storage_range(t):
    """``(start, end)`` byte addresses of a tensor's whole storage, or None.

    None when the tensor has no accessible storage (wrapper subclasses) or an
    empty one.
    """
    try:
        st = t.untyped_storage()
        start, size = st.data_ptr(), st.nbytes()
    except Exception:  # noqa: BLE001 - storage-less tensors raise various errors
        return None
    if not start or not size:
        return None
    return start, start + size


def shares_memory(xs, ys) -> bool:
    """True when some tensor of ``xs`` and some tensor of ``ys`` overlap in memory."""
    rx = [r for r in map(storage_range, tensors_of(xs)) if r]
    ry = [r for r in map(storage_range, tensors_of(ys)) if r]
    return any(a0 < b1 and b0 < a1 for a0, a1 in rx for b0, b1 in ry)


def compare_outputs(out, ref, atol: float, rtol: float):
    """``(ok, reason)``: does ``out`` match ``ref`` like the published check (allclose)?

    The custom output is cast to the reference's dtype and device first, unlike the paper
    protocol's :func:`l1bench.worker.compare_outputs` (which fails mixed dtypes, as the harness's
    allclose does); see there why the two are kept apart."""
    import torch

    outs, refs = snippet.flatten_outputs(out), snippet.flatten_outputs(ref)
    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, reference has {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs, strict=False)):
        if not isinstance(r, torch.Tensor):
            if o != r:
                return False, f"output {i}: {o!r} != {r!r}"
            continue
        if not isinstance(o, torch.Tensor):
            return False, f"output {i} is a {type(o).__name__}, not a tensor"
        if tuple(o.shape) != tuple(r.shape):
            return False, f"output {i}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        o_plain = o.detach().to(device=r.device, dtype=r.dtype).as_subclass(torch.Tensor)
        if not torch.allclose(o_plain, r, atol=atol, rtol=rtol):
            diff = (o_plain.double() - r.double()).abs().max().item() if r.numel() else 0.0
            return False, f"output {i}: max abs diff {diff:.3g}"
    return True, ""


def _call(model, inputs):
    return model(*inputs)


class CustomFailure(Exception):
    """The custom model raised during ``stage``."""

    def __init__(self, stage: str, err: BaseException):
        super().__init__(f"{stage}: {type(err).__name__}: {err}")
        self.stage = stage
        self.err = err


def _custom(stage: str, fn, *args):
    """Run custom-model code, turning its exceptions into :class:`CustomFailure`."""
    try:
        return fn(*args)
    except Exception as err:  # any failure of untrusted code
        raise CustomFailure(stage, err) from err


# --------------------------------------------------------------------------- LAZY


def check_lazy(out, device) -> list:
    """Flag outputs that are not real, materialised tensors on ``device``.

    Proves: the object returned is a tensor subclass (``type(out).__name__`` not
    ``Tensor``/``Parameter``), lives on another device, or has an empty storage /
    null data pointer while holding elements - i.e. the work may be deferred
    until someone looks at the values.  The same checks as the paper protocol.
    Limits: a plain tensor whose values are filled in later (threads, streams)
    passes here; see :func:`check_background`. The paper protocol's own check (the ``lazy``
    status) is :func:`l1bench.worker.lazy_problems`, which differs on non-tensor and empty
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
            flags.append(make_flag(LAZY, f"output {i} is a {name}, not a plain Tensor"))
            continue
        if as_device(o.device) != dev:
            flags.append(make_flag(LAZY, f"output {i} on {o.device}, expected {dev}"))
        if o.numel() > 0 and storage_range(o) is None:
            flags.append(make_flag(LAZY, f"output {i} has no storage or a null data pointer"))
    return flags


# --------------------------------------------------------------------------- ALIAS / SAME_STORAGE


def check_alias_input(out, inputs, reference_aliases: bool = False) -> list:
    """Flag an output that shares memory with an input.

    Proves: some output's storage overlaps some input's storage (the model
    returned its input, a view of it, or wrote its result into it), so no new
    result was produced.  Skipped when the reference itself aliases (e.g. a
    reshape task), since then aliasing is faithful.  Limits: only storages
    visible from Python are compared.
    """
    if reference_aliases or not shares_memory(out, inputs):
        return []
    return [make_flag(ALIAS_INPUT, "an output shares storage with an input")]


def check_same_storage(first_out, later_outs, reference_reuses: bool = False) -> list:
    """Flag outputs of later calls that reuse the memory of an earlier, still-held output.

    Proves: while the caller still holds the first call's output, a call on
    different fresh inputs returned memory overlapping it - a persistent output
    buffer that silently overwrites results the caller kept.  The first output is
    held, so the caching allocator cannot legitimately hand its address out
    again.  Limits: a buffer reused only after the caller drops its output is
    invisible (and harmless).
    """
    if reference_reuses:
        return []
    for k, later in enumerate(later_outs):
        if shares_memory(first_out, later):
            return [make_flag(SAME_STORAGE, f"call {k + 2} returned the storage of call 1's held output")]
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
    return [make_flag(INPUT_MUTATION, f"input tensor(s) {changed} changed during the call")]


# --------------------------------------------------------------------------- CACHED_OUTPUT


def check_later_calls(stale: list, wrong: list) -> list:
    """Flags for later calls of a model whose first call matched the reference.

    ``stale`` labels calls whose wrong output matches the reference for some
    *earlier* inputs; ``wrong`` labels other wrong outputs.  The calls are (b)
    fresh inputs each time and (a) the first call's tensors refilled in place
    with new data, each compared (allclose, cfg atol/rtol) with the reference on
    that call's data.  Proves (CACHED_OUTPUT): the model returned an earlier
    result - caching keyed on tensor identity/address/shape, or a CUDA graph
    replayed on the first call's buffers.  Limits: a cache keyed on the full
    contents is invisible (and correct); a task whose outputs hardly depend on
    the inputs cannot separate stale from fresh (see DEGENERATE_TASK).
    """
    flags = []
    if stale:
        flags.append(make_flag(CACHED_OUTPUT, "returned the result for earlier inputs on: " + ", ".join(stale)))
    if wrong:
        flags.append(make_flag(OUTPUT_MISMATCH, "first call right, then wrong on: " + ", ".join(wrong)))
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
    """Flag Python threads that appeared since ``before`` (a set of threads) and still run.

    Proves: the model left a thread running after it returned (construction or
    call).  Limits: a thread that finishes before we look, native (C++/OpenMP)
    threads and CUDA streams are not seen; threads whose target lives in the
    ``torch`` package are ignored, but e.g. ``torch.compile`` thread pools are
    reported (the reason lists names to review).
    """
    new = _foreign_threads(before)
    if not new:
        return []
    names = ", ".join(sorted(t.name for t in new))
    return [make_flag(BACKGROUND_WORK, f"{len(new)} new thread(s) alive after {when}: {names}")]


def settle(device, threads=(), join_timeout_s: float = 1.0, settle_s: float = 0.05) -> None:
    """Let late work finish: device-wide sync, join ``threads``, sleep, sync again."""
    sync(device)
    deadline = time.monotonic() + join_timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    time.sleep(settle_s)
    sync(device)


def check_output_settled(at_return: list, settled: list) -> list:
    """Flag outputs whose bytes changed between return and a full settle.

    ``at_return`` are digests of clones taken on the current stream right after
    the call returned; ``settled`` the digests of the same outputs after
    :func:`settle`.  Proves: something (a thread, a CUDA stream the current
    stream does not wait for) was still writing the output when the call
    returned.  Limits: racy by nature - work that happens to finish before the
    clone runs is not seen; strict timing's EVENT_SYNC_MISMATCH covers streams.
    """
    if at_return == settled:
        return []
    return [make_flag(BACKGROUND_WORK, "output changed after the call returned (late writes)")]


# --------------------------------------------------------------------------- GLOBAL_STATE

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
    """Every global torch setting that changes speed or numerics, as a flat dict.

    Keys: ``backends.<path>`` for ``torch.backends`` flags (cuDNN benchmark /
    deterministic / enabled / TF32, matmul reduced-precision reductions, the
    ``fp32_precision`` leaves of torch >= 2.9), SDPA switches, and
    ``float32_matmul_precision``, ``default_dtype``, ``deterministic_algorithms``,
    ``deterministic_warn_only``, ``num_threads``.  Values torch refuses to read
    (mixed legacy/new TF32 API) are recorded as ``"<unreadable>"``.
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
    """Put back every setting recorded by :func:`snapshot_global_state`.

    Only settings that differ are written; values recorded as unreadable are
    skipped.  Order matters on torch >= 2.9, where the legacy TF32 switches and
    ``float32_matmul_precision`` keep hidden state of their own next to the
    ``fp32_precision`` leaves: the legacy values are written first (which also
    writes some leaves), then the leaves and the other flags.
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
    """Flag global settings changed between two snapshots.

    Proves: constructing / calling the custom model changed process-wide
    settings (e.g. ``cudnn.benchmark``, TF32, matmul precision, thread count)
    that also change the reference's speed or numerics when both run in one
    process.  Limits: only the settings in :func:`snapshot_global_state`;
    changes made and undone inside one call are not seen.
    """
    changed = diff_global_state(before, after)
    if not changed:
        return []
    detail = ", ".join(f"{k}: {before.get(k)!r}->{after.get(k)!r}" for k in changed[:4])
    return [make_flag(GLOBAL_STATE, f"{when} changed {detail}")]


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
    """``(flags, details)``: is the custom output much less accurate than the reference?

    Against a float64 run of the reference, ``err(x) = ||x - ref64|| / ||ref64||``;
    flags PRECISION_DOWNGRADE when ``err(custom) > max(factor * err(ref32), floor)``
    for some floating output.  Proves: the custom result carries far more
    rounding error than the float32 reference does - typically half/bfloat16
    arithmetic or TF32 hidden behind a cast back to float32, which ``allclose``
    with atol=rtol=1e-2 lets through.  Limits: an honest but less stable
    algorithm (e.g. long sequential float32 sums) can also be flagged; the
    reason gives both errors for review.  Outputs whose float64 reference is
    all zeros, or not float64 (the reference casts internally), are skipped.
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
                make_flag(PRECISION_DOWNGRADE, f"output {i}: rel err {e_cus:.2e} vs reference fp32 {e_ref:.2e}")
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
            flags.append(make_flag(DTYPE_CHANGED, f"output {i} is {o.dtype}, reference {r.dtype}"))
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
    """Flag a task whose reference output carries no information.

    ``ref_outputs`` are reference outputs for several fresh random inputs and
    ``input_digests`` the digests of those inputs.  Proves: every output tensor
    is constant (e.g. always zero) for every input, or - the inputs differing -
    the outputs are identical anyway; a custom model can then return a constant
    or a cached result and look arbitrarily fast while passing every check.
    Limits: a few random inputs can miss rare non-constant cases.
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
            return [make_flag(DEGENERATE_TASK, f"reference output is constant for all {len(outs)} random inputs")]
    inputs_differ = len(set(map(tuple, input_digests))) == len(input_digests)
    if inputs_differ and len(outs) > 1:
        ds = [tuple(digest(t) for t in ts) for ts in outs]
        if len(set(ds)) == 1 and all(isinstance(t, torch.Tensor) for t in outs[0]):
            return [make_flag(DEGENERATE_TASK, "reference output is identical for different random inputs")]
    return []


# --------------------------------------------------------------------------- SPEEDUP_CEILING


def ceiling_flag(score, ceiling: float = 10.0) -> list:
    """Flag a speedup above ``ceiling`` for review (no proof of anything by itself)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return []
    if math.isfinite(value) and value > ceiling:
        return [make_flag(SPEEDUP_CEILING, f"speedup {value:.2f}x above ceiling {ceiling:g}x: review")]
    if math.isinf(value) and value > 0:
        return [make_flag(SPEEDUP_CEILING, "infinite speedup: review")]
    return []


# --------------------------------------------------------------------------- orchestration


def _fresh(get_inputs, device, seed: int) -> list:
    snippet.set_seed(seed)
    return snippet.make_inputs(get_inputs, device, on_device=True)


def _reference_phase(ref_model, get_inputs, device, c) -> dict:
    """Generate every input set and the reference outputs (reference errors propagate)."""
    seed, n = int(c["seed"]), int(c["n_calls"])
    ph = {"A": _fresh(get_inputs, device, seed + 1)}
    ph["fresh"] = [_fresh(get_inputs, device, seed + 11 + k) for k in range(n)]
    ph["refill"] = _fresh(get_inputs, device, seed + 7)
    ph["ref_A"] = _call(ref_model, clone_values(ph["A"]))
    ph["ref_A_again"] = _call(ref_model, clone_values(ph["A"]))
    ph["ref_fresh"] = [_call(ref_model, clone_values(x)) for x in ph["fresh"]]
    ph["ref_refill"] = _call(ref_model, clone_values(ph["refill"]))
    sync(device)
    # A reference that disagrees with itself (random ops in forward) makes output checks moot.
    ph["deterministic"] = compare_outputs(ph["ref_A_again"], ph["ref_A"], float(c["atol"]), float(c["rtol"]))[0]
    # Does the reference itself alias its inputs or reuse its output memory?
    a_in = clone_values(ph["A"])
    a_out = _call(ref_model, a_in)
    b_out = _call(ref_model, clone_values(ph["fresh"][0])) if ph["fresh"] else None
    ph["ref_aliases"] = shares_memory(a_out, a_in)
    ph["ref_reuses"] = b_out is not None and shares_memory(a_out, b_out)
    ph["_hold"] = [a_in, a_out, b_out]
    # float64 reference for the precision check (skipped if it cannot run in float64)
    try:
        ref64_model = copy.deepcopy(ref_model).double()
        ph["ref64_A"] = _call(ref64_model, to_double(clone_values(ph["A"])))
        ph["ref64_error"] = None
    except Exception as err:  # noqa: BLE001 - reference not runnable in float64
        ph["ref64_A"], ph["ref64_error"] = None, snippet.short(f"{type(err).__name__}: {err}", 120)
    return ph


def _call_settled(stage: str, model, inputs, device, c):
    """Call the custom model and let late work finish (threads joined), so that
    later comparisons test caching rather than timing races."""
    threads = set(threading.enumerate())
    out = _custom(stage, _call, model, inputs)
    settle(device, _foreign_threads(threads), c["join_timeout_s"], 0.0)
    return out


def _custom_phase(custom_model, ph, device, c, base_state, flags, details) -> None:
    """Run the custom model through every detector (exceptions become CustomFailure)."""
    atol, rtol = float(c["atol"]), float(c["rtol"])
    A = ph["A"]
    hold = []

    # main call: late writes, threads, mutation, laziness, aliasing, dtype, precision
    before = digests(A)
    threads = set(threading.enumerate())
    out = _custom("call", _call, custom_model, A)
    at_return = [t.detach().clone() for t in tensors_of(out)]  # queued right after the return
    flags += check_new_threads(threads, "call")
    settle(device, _foreign_threads(threads), c["join_timeout_s"], c["settle_s"])
    flags += check_output_settled([digest(t) for t in at_return], digests(out))
    flags += check_input_mutation(before, digests(A))
    flags += check_lazy(out, device)
    flags += check_alias_input(out, A, ph["ref_aliases"])
    flags += check_dtype(out, ph["ref_A"])
    after_call = snapshot_global_state()
    flags += check_global_state(base_state, after_call, "calling the custom model")
    restore_global_state(base_state)

    compare_ok = ph["deterministic"]
    details["reference_deterministic"] = compare_ok
    main_ok, why = compare_outputs(out, ph["ref_A"], atol, rtol)
    details["first_call_matches"] = main_ok
    if compare_ok and not main_ok:
        flags.append(make_flag(OUTPUT_MISMATCH, f"first call disagrees with the reference: {why}"))
    if compare_ok and main_ok and ph["ref64_A"] is not None:
        pf, pd = check_precision(
            out, ph["ref_A"], ph["ref64_A"], float(c["precision_factor"]), float(c["precision_floor"])
        )
        flags += pf
        details["precision"] = pd
    else:
        details["precision"] = ph["ref64_error"] or "skipped"

    # Later calls: fresh tensors, then the first tensors refilled in place with new data.
    # A wrong output that equals the reference for *earlier* inputs is a stale (cached)
    # result; any other wrong output is a plain mismatch.
    earlier = [ph["ref_A"]]
    stale, wrong, fresh_ok = [], [], []

    def judge(label, out_k, ref_k):
        ok = compare_outputs(out_k, ref_k, atol, rtol)[0]
        if not ok:
            is_stale = any(compare_outputs(out_k, r, atol, rtol)[0] for r in earlier)
            (stale if is_stale else wrong).append(label)
        earlier.append(ref_k)
        return ok

    for k, (x, ref_x) in enumerate(zip(ph["fresh"], ph["ref_fresh"], strict=False)):
        out_x = _call_settled(f"fresh call {k + 1}", custom_model, x, device, c)
        hold.append(out_x)
        fresh_ok.append(judge(f"fresh call {k + 1}", out_x, ref_x))
    flags += check_same_storage(out, hold, ph["ref_reuses"])

    for dst, src in zip(A, ph["refill"], strict=False):
        if hasattr(dst, "copy_") and hasattr(src, "shape"):
            dst.copy_(src)
    out_refill = _call_settled("in-place refill call", custom_model, A, device, c)
    refill_ok = judge("same tensors refilled in place", out_refill, ph["ref_refill"])
    details["fresh_calls_match"] = fresh_ok
    details["refill_call_matches"] = refill_ok
    if compare_ok and main_ok:
        flags += check_later_calls(stale, wrong)

    flags += check_global_state(base_state, snapshot_global_state(), "later calls of the custom model")
    restore_global_state(base_state)
    del hold


def _eval(model) -> None:
    if hasattr(model, "eval"):
        model.eval()


def run_detectors(ref_cls, custom_cls, get_inputs, get_init_inputs, device, cfg=None, ref_model=None) -> dict:
    """Run every detector on one (reference, custom) pair; return ``{"flags", "details"}``.

    Models are built as :func:`l1bench.snippet.build_model` does (seed before
    construction, the same init inputs for both).  ``cfg`` keys (defaults in
    :data:`DEFAULTS`): seed, atol, rtol, n_calls, precision_factor,
    precision_floor, settle_s, join_timeout_s.

    ``ref_model``: an already built reference (constructed under ``cfg["seed"]`` with the same
    init inputs, on ``device``), to save constructing it again.

    Reference failures propagate.  Failures of the custom model (construction
    or a call) become a DETECTOR_ERROR flag and end the custom checks - except
    failures :func:`l1bench.snippet.classify_exception` classes as
    infrastructure (CUDA faults, OOM), which are raised as
    :class:`l1bench.snippet.InfraError` since the CUDA context may be broken.
    Global backend settings are restored before returning.
    """
    import torch

    c = dict(DEFAULTS)
    c.update(cfg or {})
    dev = as_device(device)
    flags, details = [], {}
    state0 = snapshot_global_state()
    with torch.no_grad():
        try:
            snippet.set_seed(int(c["seed"]))
            init_inputs = get_init_inputs()
            if ref_model is None:  # else: the caller's reference, built the same way (same seed)
                ref_model = snippet.build_model(ref_cls, init_inputs, int(c["seed"]), dev)
            # Eval mode, as the harness's correctness trials: in train mode BatchNorm normalises
            # with batch statistics and dropout is random, and a custom model that folds
            # BatchNorm into its kernel (inference semantics) would "disagree" with the reference.
            _eval(ref_model)
            ph = _reference_phase(ref_model, get_inputs, dev, c)
            refs = [ph["ref_A"], *ph["ref_fresh"]]
            ins = [digests(ph["A"]), *[digests(x) for x in ph["fresh"]]]
            flags += check_degenerate(refs, ins)
            base_state = snapshot_global_state()
            try:
                threads = set(threading.enumerate())
                custom_model = _custom(
                    "construct", snippet.build_model, custom_cls, init_inputs, int(c["seed"]), dev
                )
                flags += check_new_threads(threads, "construction")
                flags += check_global_state(base_state, snapshot_global_state(), "constructing the custom model")
                restore_global_state(base_state)
                _eval(custom_model)
                _custom_phase(custom_model, ph, dev, c, base_state, flags, details)
            except Exception as fail:  # noqa: BLE001 - custom code or its odd outputs broke a check
                cause = fail.err if isinstance(fail, CustomFailure) else fail
                stage = fail.stage if isinstance(fail, CustomFailure) else "checking outputs"
                err = snippet.classify_exception(cause, "detector_error", stage)
                if isinstance(err, snippet.InfraError):
                    raise err from cause
                flags.append(make_flag(DETECTOR_ERROR, f"{stage}: {type(cause).__name__}: {cause}"))
        finally:
            restore_global_state(state0)
    details["flag_names"] = flag_names(flags)
    return {"flags": flags, "details": details}
