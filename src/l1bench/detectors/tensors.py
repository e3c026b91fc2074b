"""Tensor utilities of the detectors: devices, sync, flattening, cloning, byte digests,
storage overlap, output comparison."""

from __future__ import annotations

import hashlib

from .. import snippet


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


def clone_values(values):
    """Deep copy of an input list: tensors cloned (same device), in nested lists, tuples and
    dicts too; others kept."""
    import torch

    if isinstance(values, torch.Tensor):
        return values.detach().clone()
    if isinstance(values, (list, tuple)):
        return type(values)(clone_values(v) for v in values)
    if isinstance(values, dict):
        return {k: clone_values(v) for k, v in values.items()}
    return values


def digest(t) -> str:
    """A fingerprint of a tensor's bytes, with dtype and shape; NaN-safe. CPU tensors: sha1 of the
    bytes; device tensors: :func:`device_fingerprint`, computed where they live (no copy to the host
    inside the GPU lock).
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
    """Two position-weighted sums of a 1-D tensor's bytes (as int32 words), on its device: detects
    mutation, caching and stale outputs, not an adversary forging collisions.
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
    protocol's :func:`l1bench.timing.harness.compare_outputs` (which fails mixed dtypes, as the harness's
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
