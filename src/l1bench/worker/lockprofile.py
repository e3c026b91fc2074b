"""Where a job's GPU-lock time goes: a sampling profiler of the worker's main thread, by step.

The compile modes' step "compile (tracing and code generation unlocked)" held the GPU lock for
more than a second per job although tracing, code generation and Triton's compile all let go of
it (RUN_NOTES, session nine). :class:`StepSampler` says what the thread does in such time: one
daemon thread per worker (opt-in, ``L1BENCH_PROFILE_LOCKED=1``), started before the job's
first GPU section (so it inherits the mask off the timing CPU). While a step of
:func:`l1bench.worker.sections.phase` runs that is not a timed one (``UNSAMPLED``) and the GPU
lock is held, it reads the main thread's stack every ``interval_s`` (``sys._current_frames``)
and counts each function on it once (inclusive counts, as a profiler's "cumulative" column)
and the innermost one (the leaf). The rest of the time it is blocked on an event: it takes no
GIL while calls are timed. Diagnosis only: results carry it as ``lock_profile``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter

#: Environment switch: profile the GPU-lock time of every untimed step (result key
#: ``lock_profile``: step -> sampled functions).
PROFILE_ENV = "L1BENCH_PROFILE_LOCKED"
#: The sampling interval in seconds (default 0.005).
INTERVAL_ENV = "L1BENCH_PROFILE_INTERVAL_S"


def frame_name(frame) -> str:
    """``module:function`` of a frame (the module from its globals; ``?`` when unknown)."""
    module = frame.f_globals.get("__name__") or "?"
    return f"{module}:{frame.f_code.co_name}"


def stack_of(frame, limit: int = 200) -> list[str]:
    """The names of ``frame`` and its callers, innermost first (at most ``limit``)."""
    out = []
    while frame is not None and len(out) < limit:
        out.append(frame_name(frame))
        frame = frame.f_back
    return out


def summarize(stacks: list[list[str]], interval_s: float, top: int = 25, skip: tuple[str, ...] = ()) -> dict:
    """Counts of sampled stacks (innermost first): seconds per function, inclusive (a function
    counted once per sample however often it recurs) and as the leaf, the ``top`` of each.
    Frames whose name starts with one of ``skip`` (the sampler's own callers) are left out."""
    inclusive: Counter = Counter()
    leaves: Counter = Counter()
    for stack in stacks:
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


#: Steps never sampled: the timed ones (the sampler's GIL use would stretch timed calls) and the
#: detectors (some compare timings).
UNSAMPLED = frozenset({"warm-up calls", "timed pairs", "strict", "detectors"})


def sample_of(thread_id: int) -> list[str]:
    """The stack of thread ``thread_id`` as names (innermost first; [] if it is gone). No frame
    outlives this call: a frame kept until the next sample would keep its locals alive after its
    function returned (CUDA graph trees then find tensors in their pool that no output tracks:
    14 of 40 reduce-overhead jobs failed so in session nine)."""
    frame = sys._current_frames().get(thread_id)  # a local: released on return
    return stack_of(frame) if frame is not None else []


class StepSampler:
    """Samples the creating thread's stack every ``interval_s`` while a :meth:`step` runs and
    ``held()`` is true (the GPU lock is held); blocked otherwise. :meth:`summary`: by step."""

    def __init__(self, held, interval_s: float = 0.005, top: int = 25):
        self.held = held
        self.interval_s = interval_s
        self.top = top
        self.stacks: dict[str, list[list[str]]] = {}
        self._target = threading.get_ident()
        self._steps: list[str] = []  # nested steps: samples go to the innermost
        self._on = threading.Event()  # a sampled step runs
        self._off = threading.Event()  # it ended: stop sampling now
        self._idle = threading.Event()  # the thread is blocked (takes no GIL)
        # the sampler needs the GIL to take a sample: at Python's default switch interval (5 ms)
        # a busy main thread lets it in only that often, whatever interval_s asks, and a step
        # shorter than that is often not sampled at all (diagnosis only: the switches cost time)
        if interval_s < sys.getswitchinterval():
            sys.setswitchinterval(interval_s)
        self._thread = threading.Thread(target=self._run, name="l1bench-lockprofile", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._idle.set()
            self._on.wait()
            self._idle.clear()
            while self._on.is_set() and not self._off.wait(self.interval_s):
                name = self._steps[-1] if self._steps else None
                if name is not None and self.held() and (stack := sample_of(self._target)):
                    self.stacks.setdefault(name, []).append(stack)

    @contextlib.contextmanager
    def step(self, name: str):
        """Sample the body as step ``name`` (not the ``UNSAMPLED`` ones, nor other threads'
        calls). On leaving, waits until the thread is blocked again (at most one sample)."""
        if name in UNSAMPLED or threading.get_ident() != self._target:
            yield
            return
        self._steps.append(name)
        self._off.clear()
        self._on.set()
        try:
            yield
        finally:
            self._steps.pop()
            if not self._steps:
                self._on.clear()
                self._off.set()
                self._idle.wait(1.0)

    def summary(self) -> dict:
        """{step: :func:`summarize` of its samples} (steps with none left out)."""
        return {
            name: summarize(stacks, self.interval_s, self.top, skip=(f"{__name__}:",))
            for name, stacks in sorted(self.stacks.items())
        }


#: This process's sampler (:func:`start_if_asked`), None when not asked for.
ACTIVE: StepSampler | None = None


def start_if_asked(held, env=None) -> StepSampler | None:
    """Start this process's :class:`StepSampler` of ``held`` where ``L1BENCH_PROFILE_LOCKED``
    is set (not ``""`` or ``"0"``); None (nothing started) otherwise."""
    global ACTIVE
    env = os.environ if env is None else env
    if env.get(PROFILE_ENV, "") in ("", "0"):
        return None
    if ACTIVE is None:
        ACTIVE = StepSampler(held, float(env.get(INTERVAL_ENV) or 0.005))
    return ACTIVE


def step(name: str):
    """:meth:`StepSampler.step` of this process's sampler, or a no-op without one."""
    return ACTIVE.step(name) if ACTIVE is not None else contextlib.nullcontext()
