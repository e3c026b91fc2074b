"""Where a step's GPU-lock time goes: a sampling profiler of one thread's Python stack.

The compile modes' step "compile (tracing and code generation unlocked)" holds the GPU lock
for more than a second per job although tracing, code generation and Triton's compile all let
go of it (RUN_NOTES, session nine). :class:`LockedStackSampler` says what the thread does in
that time: a daemon thread wakes every ``interval_s``, and when ``held()`` is true (the GPU
lock is held) it reads the target thread's stack (``sys._current_frames``) and counts each
function on it once (inclusive counts, as a profiler's "cumulative" column) and the innermost
one (the leaf). Diagnosis only, opt-in (``L1BENCH_PROFILE_LOCKED=1``), and never around timed
calls: the sampler takes the GIL for each sample. Its thread must be started before the GPU
section (it then inherits the mask off the timing CPU).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter

#: Environment switch: profile the GPU-lock time of the compile step (result key
#: ``compile_lock_profile``).
PROFILE_ENV = "L1BENCH_PROFILE_LOCKED"


def frame_name(frame) -> str:
    """``module:function`` of a frame (the module from its globals; ``?`` when unknown)."""
    module = frame.f_globals.get("__name__") or "?"
    return f"{module}:{frame.f_code.co_name}"


def stack_of(frame, limit: int = 200) -> list[str]:
    """The names of ``frame`` and its callers, innermost first (at most ``limit``); keeps no
    reference to any of them."""
    out = []
    while frame is not None and len(out) < limit:
        out.append(frame_name(frame))
        frame = frame.f_back
    del frame
    return out


def summarize(stacks: list[list[str]], interval_s: float, top: int = 25, skip: tuple[str, ...] = ()) -> dict:
    """Counts of sampled stacks (innermost first): seconds per function, inclusive (a function
    counted once per sample however often it recurs) and as the leaf, the ``top`` of each.
    Frames whose name starts with one of ``skip`` (the sampler's own callers) are left out."""
    inclusive: Counter = Counter()
    leaves: Counter = Counter()
    for stack in stacks:
        if not stack:
            continue
        names = [n for n in stack if not n.startswith(skip)] if skip else stack
        if not names:
            continue
        leaves[names[0]] += 1
        inclusive.update(set(names))

    def seconds(counter: Counter) -> list[list]:
        return [[name, round(n * interval_s, 3)] for name, n in counter.most_common(top)]

    return {
        "interval_s": interval_s,
        "samples": len(stacks),
        "sampled_s": round(len(stacks) * interval_s, 3),
        "inclusive_s": seconds(inclusive),
        "leaf_s": seconds(leaves),
    }


class LockedStackSampler:
    """Sample the calling thread's stack every ``interval_s`` while ``held()`` is true; use as
    a context manager, then :meth:`summary`."""

    def __init__(self, held, interval_s: float = 0.005, top: int = 25):
        self.held = held
        self.interval_s = interval_s
        self.top = top
        self.stacks: list[list[str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._target: int | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.held() and (stack := self._sample()):
                self.stacks.append(stack)

    def _sample(self) -> list[str]:
        """The target's stack as names. No frame outlives this call: a frame kept until the
        next sample would keep its locals alive after its function returned (CUDA graph trees
        then find tensors in their pool that no output tracks)."""
        frame = sys._current_frames().get(self._target)
        try:
            return stack_of(frame) if frame is not None else []
        finally:
            del frame

    def __enter__(self) -> LockedStackSampler:
        self._target = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="l1bench-lockprofile", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict:
        return summarize(self.stacks, self.interval_s, self.top, skip=(f"{__name__}:",))


def sampler_if_asked(held, env=None) -> LockedStackSampler | None:
    """A :class:`LockedStackSampler` of ``held`` where ``L1BENCH_PROFILE_LOCKED`` is set (not
    ``""`` or ``"0"``), else None."""
    import os

    env = os.environ if env is None else env
    return LockedStackSampler(held) if env.get(PROFILE_ENV, "") not in ("", "0") else None
