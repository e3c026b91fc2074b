"""Was the thread that timed a call kept from running during it? The kernel's own accounting.

A CUDA-event time covers everything between the two events, so a call is timed with any pause
of the thread that launches it (preemption, hypervisor steal, interrupts). Read before and after
each timed call, outside its events, the thread's CPU time, run-queue wait (``schedstat``) and
context switches say whether it ran throughout: ``disturbed_ns`` (wait, plus lost time when the
thread never slept) is what a timed call must not contain.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

#: Calls whose thread lost at least this much (ns) are *disturbed*: far above the microseconds
#: of a timer interrupt, far below the 4 ms scheduler ticks that stretched the H200 run's calls.
DISTURBED_NS = 20_000
#: ... and at least this share of the call's event time.
RELATIVE = 0.02


@dataclass(frozen=True)
class Sample:
    wall_ns: int
    run_ns: int
    wait_ns: int | None
    nvcsw: int
    nivcsw: int


@dataclass(frozen=True)
class Delta:
    """What happened to the timing thread between two samples."""

    wall_ns: int
    run_ns: int
    wait_ns: int | None
    nvcsw: int
    nivcsw: int

    @property
    def lost_ns(self) -> int:
        """Neither running nor waiting for a CPU (sleeping, stolen by the hypervisor, interrupts)."""
        return max(0, self.wall_ns - self.run_ns - (self.wait_ns or 0))

    @property
    def disturbed_ns(self) -> int:
        """Time the thread was kept from running although it wanted to (see module doc)."""
        wait = self.wait_ns or 0
        return wait + (self.lost_ns if self.nvcsw == 0 else 0)

    def disturbed(self, threshold_ns: int = DISTURBED_NS) -> bool:
        return self.disturbed_ns >= threshold_ns


def _thread_rusage():
    who = getattr(resource, "RUSAGE_THREAD", None)
    return resource.getrusage(who if who is not None else resource.RUSAGE_SELF)


class ThreadClock:
    """Samples the calling thread's accounting; create and use it in the thread that times.

    ``available`` is False where the kernel has no per-thread schedstat (then ``wait_ns`` is
    None and only lost time and context switches are known).
    """

    def __init__(self):
        self.tid = threading.get_native_id()
        self._fd = None
        try:
            self._fd = os.open(f"/proc/self/task/{self.tid}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None
        self.available = self._fd is not None and self._read_wait() is not None

    def _read_wait(self) -> int | None:
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> Sample:
        ru = _thread_rusage()
        wait = self._read_wait() if self._fd is not None else None
        return Sample(time.perf_counter_ns(), time.thread_time_ns(), wait, ru.ru_nvcsw, ru.ru_nivcsw)

    @staticmethod
    def delta(before: Sample, after: Sample) -> Delta:
        wait = None if before.wait_ns is None or after.wait_ns is None else after.wait_ns - before.wait_ns
        return Delta(
            after.wall_ns - before.wall_ns,
            after.run_ns - before.run_ns,
            wait,
            after.nvcsw - before.nvcsw,
            after.nivcsw - before.nivcsw,
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ThreadClock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Ledger:
    """The timed calls of one result and what the host did to them (kept on the result).

    ``record`` takes each timed call: its event time and the :class:`Delta` of its host part
    (from before the start event to after the end event was enqueued: the only stretch in which
    the host can lengthen what the events measure).
    """

    def __init__(self, threshold_ns: int = DISTURBED_NS):
        self.threshold_ns = threshold_ns
        self.calls: list = []  # (trial, pair, side, event_ms, Delta)
        self.retimed: set = set()
        self.firsts: dict = {}  # trial: [reference first?] of its kept pairs, in ref_ms order (ref_first)

    def disturbed(self, delta: Delta | None, event_ms: float) -> bool:
        """Whether the host kept the thread from running for at least the threshold and at
        least :data:`RELATIVE` of the call's event time (a microsecond on a 10 ms call is not
        worth timing again)."""
        return delta is not None and delta.disturbed(max(self.threshold_ns, int(RELATIVE * event_ms * 1e6)))

    def record(self, delta: Delta | None, trial: int, pair: int, side: str, event_ms: float) -> bool:
        """Account for one timed call; True when its host part was disturbed."""
        self.calls.append((trial, pair, side, event_ms, delta))
        return self.disturbed(delta, event_ms)

    def mark_retimed(self, trial: int, pair: int) -> None:
        """The pair (trial, pair) was discarded and timed again."""
        self.retimed.add((trial, pair))

    def summary(self) -> dict:
        known = [c for c in self.calls if c[4] is not None]
        kept = [c for c in self.calls if (c[0], c[1]) not in self.retimed]
        launches = {}
        for side in SIDES:
            walls = sorted(c[4].wall_ns for c in kept if c[2] == side and c[4] is not None)
            launches[side] = walls[len(walls) // 2] if walls else None
        return {
            "calls": len(self.calls),
            "disturbed_calls": sum(self.disturbed(c[4], c[3]) for c in known),
            "disturbed_ms": round(sum(c[4].disturbed_ns for c in known if self.disturbed(c[4], c[3])) / 1e6, 3),
            "retimed_pairs": len(self.retimed),
            # each side's median launch (host part of a timed call, us) beside its median event
            # time: launch-bound calls have the two close, device-bound ones a short launch
            "launch_median_us": {side: None if ns is None else round(ns / 1000) for side, ns in launches.items()},
            "ref_first": list(self.firsts.values()),
        }


#: A side of a timed call is *host-bound* when its median launch (the host's part of the call:
#: until the call returns, ``launch_median_us``) is at least this share of its median timed
#: call (CUDA events). Its GPU waited for the host's launches, so its time measures the CPU as
#: much as the kernels: it moves with the host's speed between runs (2026-12-05, two H100 hosts: one 14 %
#: slower at a fixed CPU task made launch-bound calls ~30 % slower, GPU-bound ones not at all).
HOST_BOUND_SHARE = 0.8
SIDES = ("ref", "custom")


def launch_shares(result: dict) -> dict[str, float] | None:
    """Each side's median launch over its median timed call (``ref_ms``/``custom_ms``, every
    trial's calls), from a time result's ``host_timing.launch_median_us``. None where the
    result does not record both sides' launches (results timed before the ledger recorded
    them, or without the host clock) or has no timings."""
    launches = (result.get("host_timing") or {}).get("launch_median_us") or {}
    shares = {}
    for side in SIDES:
        if launches.get(side) is None:
            return None
        # per outer trial its timed calls, as the paper protocol (the ledger's only user) writes them
        calls = sorted(v for trial in result.get(f"{side}_ms") or [] for v in trial)
        if not calls:
            return None
        median_ms = calls[len(calls) // 2]
        if median_ms <= 0:
            return None
        shares[side] = launches[side] / 1000 / median_ms
    return shares


def host_bound_sides(result: dict, share: float = HOST_BOUND_SHARE) -> list[str] | None:
    """The sides (``ref``, ``custom``) of a time result whose timed calls are host-bound
    (:data:`HOST_BOUND_SHARE`); [] for a result bound by the GPU on both sides, None where the
    result does not say (:func:`launch_shares`)."""
    shares = launch_shares(result)
    if shares is None:
        return None
    return [side for side in SIDES if shares[side] >= share]
