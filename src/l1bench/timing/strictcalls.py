"""What each call the strict protocol times is made of (:mod:`l1bench.timing.strict`): fresh
inputs from a pool kept alive until the end (:class:`InputPool`), the L2 cache flushed before it
(:class:`L2Flusher`), the picked repetitions' outputs checked (:class:`OutputChecks`), and the
two clocks of one call, host-synchronised and CUDA events (:class:`CallTimer`).

Like the rest of the strict protocol, this runs untrusted code's models: run it in a worker child.
"""

from __future__ import annotations

import random
import time

from l1bench import detectors

# --------------------------------------------------------------------------- inputs


def _nbytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in detectors.tensors_of(values))


class InputPool:
    """Fresh input sets handed out once each, generated ``chunk`` at a time outside timed regions and
    all kept alive until the pool dies, so no two timed calls see the same tensor or address.
    :meth:`take` returns None once another set would exceed ``max_bytes``.
    """

    def __init__(self, make_inputs, max_bytes: int, chunk: int = 16):
        self._make = make_inputs
        self._max = int(max_bytes)
        self._chunk = max(1, int(chunk))
        self._kept: list = []
        self._next = 0
        self.bytes = 0

    def _room_for_one(self) -> bool:
        if not self._kept:
            return True
        per_set = self.bytes / len(self._kept)
        return self.bytes + per_set <= self._max

    def _refill(self) -> None:
        for _ in range(self._chunk):
            if not self._room_for_one():
                break
            values = self._make()
            self._kept.append(values)
            self.bytes += _nbytes(values)

    def take(self):
        """The next unused input set, or None when the memory cap is reached."""
        if self._next >= len(self._kept):
            self._refill()
        if self._next >= len(self._kept):
            return None
        values = self._kept[self._next]
        self._next += 1
        return values

    @property
    def used(self) -> int:
        return self._next

    @property
    def max_bytes(self) -> int:
        return self._max


def default_pool_bytes(dev) -> int:
    """The input pool's cap: 1 GiB on a CPU, min(16 GiB, 30 % of the GPU's total memory) on CUDA, the
    same whatever else runs. A pool that does not fit runs out of memory, an attempt retried with
    the GPU alone (l1bench.attempts).
    """
    import torch

    if dev.type != "cuda":
        return 1 << 30
    _free, total = torch.cuda.mem_get_info(dev)
    return int(min(16 << 30, 0.3 * total))


# --------------------------------------------------------------------------- L2 flush


def l2_flush_bytes(dev, fallback: int = 256 << 20) -> int:
    """Bytes to write for an L2 flush: 2x the device's L2 size (``fallback`` if unknown)."""
    import torch

    size = 0
    try:
        size = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
    except Exception:  # noqa: BLE001 - property missing on some builds
        size = 0
    return 2 * size if size > 0 else int(fallback)


class L2Flusher:
    """Evicts the device L2 before a timed call (no-op when disabled or on CPU): writes ``nbytes`` (at
    least 2x L2), then with ``clean`` reads a zeroed buffer of the L2's size, so that no dirty-line
    write-back is charged to the timed call.
    """

    def __init__(self, dev, nbytes: int, enabled: bool = True, clean: bool = True):
        import torch

        self.enabled = bool(enabled) and dev.type == "cuda"
        self.nbytes = int(nbytes) if self.enabled else 0
        self._buf = torch.empty(self.nbytes, dtype=torch.uint8, device=dev) if self.enabled else None
        n_clean = self.nbytes // 2 // 8 if (self.enabled and clean) else 0
        self._clean = torch.zeros(n_clean, dtype=torch.int64, device=dev) if n_clean else None
        self._k = 0

    def __call__(self) -> None:
        if self.enabled:
            self._k = (self._k + 1) % 251
            self._buf.fill_(self._k)
            if self._clean is not None:
                self._clean.sum()  # result unused: the read is the point


# --------------------------------------------------------------------------- timing one call


class OutputChecks:
    """Which timed repetitions have their custom output checked (``verify_outputs``), and what
    the checks found. ``wanted`` of the first ``min_reps`` repetitions, picked up front, and each
    later repetition with the rate ``wanted / min_reps``; picked by the operating system's random
    source, so a snippet cannot replay the choice (the timing's own seed is public)."""

    def __init__(self, wanted: int, min_reps: int, source: random.Random | None = None):
        self.wanted, self.min_reps = max(0, int(wanted)), max(1, int(min_reps))
        self._source = source or random.SystemRandom()
        first = min(self.wanted, self.min_reps)
        self._early = set(self._source.sample(range(self.min_reps), first)) if first else set()
        self._rate = min(1.0, self.wanted / self.min_reps)
        self.reps: list[int] = []
        self.mismatch: str | None = None

    def picked(self, rep: int) -> bool:
        """Whether repetition ``rep`` (0-based) is checked; decided before its timed calls."""
        if not self.wanted:
            return False
        return rep in self._early if rep < self.min_reps else self._source.random() < self._rate

    def check(self, rep: int, ref_out, custom_out, atol: float, rtol: float) -> None:
        """Compare a kept timed output with the reference's on a copy of the same inputs."""
        self.reps.append(rep)
        ok, why = detectors.compare_outputs(custom_out, ref_out, atol, rtol)
        if not ok and self.mismatch is None:
            self.mismatch = f"timed repetition {rep + 1}'s output differs from the reference's on its inputs: {why}"

    def summary(self) -> dict:
        return {"wanted": self.wanted, "reps": [r + 1 for r in self.reps], "mismatch": self.mismatch}


class CallTimer:
    """Times one call: host perf_counter (after a device-wide sync on CUDA) and, on CUDA, events."""

    def __init__(self, dev):
        import torch

        self.cuda = dev.type == "cuda"
        self.dev = dev
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def time(self, model, inputs, keep: list | None = None):
        """``(sync_ms, event_ms or None)`` of ``model(*inputs)``; the output is dropped after,
        or appended to ``keep`` (after the timing) when given."""
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.dev)
            self._start.record()
            t0 = time.perf_counter()
            out = model(*inputs)
            self._end.record()
            torch.cuda.synchronize(self.dev)
            t1 = time.perf_counter()
            event_ms = self._start.elapsed_time(self._end)
        else:
            t0 = time.perf_counter()
            out = model(*inputs)
            t1 = time.perf_counter()
            event_ms = None
        if keep is not None:
            keep.append(out)
        del out
        return (t1 - t0) * 1e3, event_ms
