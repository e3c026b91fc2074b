"""Strict timing protocol: reference vs. custom, resistant to the known reward hacks.

Unlike the published harness (repeated calls on the same inputs, CUDA events on the current
stream):

* every timed call gets freshly generated inputs, all kept alive to the end (no tensor or
  address is seen twice: defeats output caching);
* on CUDA the L2 cache is flushed before every timed call, outside the timed region;
* on CUDA each call is timed by events and by a host timer around ``torch.cuda.synchronize()``
  (every stream); the synchronised time is the strict time, and one far above the event time
  is work on streams the timer does not wait for (EVENT_SYNC_MISMATCH);
* reference and custom calls are interleaved in random order, the global backend state
  restored before every reference call;
* repetitions continue until the speedup's relative standard error is small (within a cap and
  a time budget); a seeded bootstrap gives a 95 % interval for the ratio of medians;
* with ``verify_outputs``, randomly picked timed calls' outputs are compared with the
  reference's on a copy of their inputs (TIMED_OUTPUT_MISMATCH ends the timing).

Like the detectors, this executes untrusted code: run it in a worker child.
"""

from __future__ import annotations

import math
import random
import statistics
import time

from l1bench import detectors
from l1bench.detectors import EVENT_SYNC_MISMATCH, L2_RESIDENT, TIMED_OUTPUT_MISMATCH, make_flag
from l1bench.timing.strictcalls import CallTimer, InputPool, L2Flusher, OutputChecks, default_pool_bytes, l2_flush_bytes

#: Defaults of the ``cfg`` keys read by :func:`time_strict` and :func:`cache_sensitivity`.
DEFAULTS = {
    "seed": 42,
    "warmup": 3,
    "min_reps": 10,
    "max_reps": 200,
    "rse_target": 0.02,
    "budget_s": 20.0,
    "sync_mismatch": 1.5,
    "sync_slack_ms": 0.05,
    "flush_l2": True,
    "flush_clean": True,
    "l2_fallback_bytes": 256 << 20,
    "pool_bytes": None,  # None: 1 GiB on CPU, min(16 GiB, 30% of the GPU's total memory) on CUDA
    "pool_chunk": 16,
    "bootstrap": 1000,
    "l2_factor": 1.5,
    "verify_outputs": 0,
    "atol": 1e-2,
    "rtol": 1e-2,
}


def _cfg(cfg) -> dict:
    c = dict(DEFAULTS)
    c.update(cfg or {})
    return c


# --------------------------------------------------------------------------- statistics


def _se_median(xs) -> float:
    """Robust standard error of a median: 1.2533 * 1.4826 * MAD / sqrt(n)."""
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(xs))


def speedup_rse(ref_ms, custom_ms) -> float:
    """Relative standard error of median(ref)/median(custom) (delta method, robust SEs)."""
    if len(ref_ms) < 2 or len(custom_ms) < 2:
        return math.inf
    mr, mc = statistics.median(ref_ms), statistics.median(custom_ms)
    if mr <= 0 or mc <= 0:
        return math.inf
    return math.hypot(_se_median(ref_ms) / mr, _se_median(custom_ms) / mc)


def bootstrap_ci(ref_ms, custom_ms, n_boot: int = 1000, seed: int = 42, level: float = 0.95) -> list:
    """Percentile bootstrap interval of median(ref)/median(custom), resampling (ref, custom) pairs."""
    import numpy as np

    r, c = np.asarray(ref_ms, dtype=float), np.asarray(custom_ms, dtype=float)
    n = min(len(r), len(c))
    if n == 0:
        return [math.nan, math.nan]
    r, c = r[:n], c[:n]
    if n == 1:
        s = float(r[0] / c[0]) if c[0] > 0 else math.inf
        return [s, s]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(int(n_boot), n))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.median(r[idx], axis=1) / np.median(c[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return [float(lo), float(hi)]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


# --------------------------------------------------------------------------- strict timing


def time_strict(ref_model, custom_model, make_inputs, device, cfg=None, global_state=None) -> dict:
    """Time ``ref_model`` against ``custom_model`` under the strict protocol (module docstring).

    ``make_inputs()`` returns a new input list on ``device`` at each call; ``global_state``
    the snapshot restored before every reference call and on return (default: one taken on entry;
    pass one taken before constructing the custom model). ``cfg`` keys: :data:`DEFAULTS`.

    Returns the strict times ``ref_ms``/``custom_ms`` (on CUDA also the event times),
    ``speedup_median`` (median(ref)/median(custom)), ``speedup_mean``, ``ci95``, ``n``, ``rse``,
    ``stop_reason``, ``verified`` (with ``verify_outputs``) and ``flags``. Models' exceptions
    propagate.
    """
    import torch

    c = _cfg(cfg)
    dev = detectors.as_device(device)
    state = global_state if global_state is not None else detectors.snapshot_global_state()
    pool_bytes = c["pool_bytes"] if c["pool_bytes"] is not None else default_pool_bytes(dev)
    run = _StrictRun(ref_model, custom_model, state, c, dev, InputPool(make_inputs, pool_bytes, c["pool_chunk"]))
    try:
        with torch.no_grad():
            run.warm_up(int(c["warmup"]))
            rse, stop = run.repetitions()
    finally:
        detectors.restore_global_state(state)

    result = _summarise(run.ms, run.ev, c, rse, stop)
    result.update(
        {"device": str(dev), "l2_flush": run.flush.enabled, "l2_flush_bytes": run.flush.nbytes,
         "pool_sets": run.pool.used, "pool_bytes": run.pool.max_bytes}
    )
    if run.picks.wanted:
        result["verified"] = run.picks.summary()
        if run.picks.mismatch:
            result["flags"].append(make_flag(TIMED_OUTPUT_MISMATCH, run.picks.mismatch))
    return result


class _StrictRun:
    """The timed calls of one :func:`time_strict`: each call of the reference after its global
    state is restored, after the L2 flush; the strict (``ms``) and event (``ev``) times of each."""

    def __init__(self, ref_model, custom_model, state, c: dict, dev, pool: InputPool):
        self.models = {"ref": ref_model, "custom": custom_model}
        self.state, self.c, self.pool = state, c, pool
        self.flush = L2Flusher(dev, l2_flush_bytes(dev, c["l2_fallback_bytes"]), c["flush_l2"], c["flush_clean"])
        self.timer = CallTimer(dev)
        self.rng = random.Random(int(c["seed"]))
        self.picks = OutputChecks(int(c["verify_outputs"] or 0), int(c["min_reps"]))
        self.ms: dict = {"ref": [], "custom": []}
        self.ev: dict = {"ref": [], "custom": []}

    def run_one(self, which: str, inputs, keep=None):
        if which == "ref":
            detectors.restore_global_state(self.state)
        self.flush()
        return self.timer.time(self.models[which], inputs, keep)

    def warm_up(self, calls: int) -> None:
        for _ in range(calls):
            for which in ("ref", "custom"):
                inputs = self.pool.take()
                if inputs is None:
                    break
                self.run_one(which, inputs)

    def repetitions(self) -> tuple[float, str]:
        """Time (reference, custom) pairs in random order until a stop rule holds: (the speedup's
        relative standard error, why it stopped)."""
        c, ms = self.c, self.ms
        rse, t_start = math.inf, time.monotonic()
        while True:
            sets = {w: self.pool.take() for w in ("ref", "custom")}
            if sets["ref"] is None or sets["custom"] is None:
                return rse, "pool_memory"
            if not self.repetition(sets):
                return rse, "output_mismatch"
            n = len(ms["ref"])
            rse = speedup_rse(ms["ref"], ms["custom"])
            if n >= int(c["min_reps"]) and rse < float(c["rse_target"]):
                return rse, "rse"
            if n >= int(c["max_reps"]):
                return rse, "max_reps"
            if time.monotonic() - t_start > float(c["budget_s"]):
                return rse, "budget"

    def repetition(self, sets: dict) -> bool:
        """One timed pair; a picked one's custom output checked against the reference on a copy
        of its inputs. False when that output differed."""
        order = ["ref", "custom"]
        self.rng.shuffle(order)
        rep = len(self.ms["ref"])
        kept = [] if self.picks.picked(rep) else None
        copy = detectors.clone_values(sets["custom"]) if kept is not None else None
        for which in order:
            sync_ms, event_ms = self.run_one(which, sets[which], kept if which == "custom" else None)
            self.ms[which].append(sync_ms)
            if event_ms is not None:
                self.ev[which].append(event_ms)
        if kept is None:
            return True
        detectors.restore_global_state(self.state)
        self.picks.check(rep, self.models["ref"](*copy), kept[0], float(self.c["atol"]), float(self.c["rtol"]))
        return not self.picks.mismatch


#: The words that mark a strict step that timed nothing for want of GPU memory (l1bench.attempts
#: reads them as running out of memory).
MEMORY_SHORT = "GPU memory short"


def measured_nothing(st: dict) -> str | None:
    """Why a :func:`time_strict` result timed no pair (its input pool gave out before the timed loop,
    as on a crowded GPU), None when it timed one. Not a measurement: the step fails and is retried.
    """
    if st.get("n"):
        return None
    cap = st.get("pool_bytes")
    held = f" of at most {cap / 2**20:.0f} MiB" if isinstance(cap, (int, float)) else ""
    return (f"strict timing measured nothing: the input pool ({st.get('pool_sets')} sets{held}) gave out "
            f"before the timed loop ({st.get('stop_reason')}); {MEMORY_SHORT}")


def _summarise(ms, ev, c, rse, stop) -> dict:
    ref, cus = ms["ref"], ms["custom"]
    n = min(len(ref), len(cus))
    out = {"ref_ms": ref, "custom_ms": cus, "n": n, "rse": rse, "stop_reason": stop, "flags": []}
    if ev["custom"]:
        out["ref_event_ms"], out["custom_event_ms"] = ev["ref"], ev["custom"]
    if n == 0:
        out.update({"speedup_median": math.nan, "speedup_mean": math.nan, "ci95": [math.nan, math.nan]})
        return out
    out["speedup_median"] = _ratio(statistics.median(ref), statistics.median(cus))
    out["speedup_mean"] = _ratio(statistics.fmean(ref), statistics.fmean(cus))
    out["ci95"] = bootstrap_ci(ref, cus, int(c["bootstrap"]), int(c["seed"]))
    if ev["custom"]:
        sync_med, event_med = statistics.median(cus), statistics.median(ev["custom"])
        out["custom_sync_event_ratio"] = _ratio(sync_med, event_med)
        out["speedup_event_median"] = _ratio(statistics.median(ev["ref"]), event_med)
        out["flags"] += sync_mismatch_flag(sync_med, event_med, c["sync_mismatch"], c["sync_slack_ms"])
    return out


def sync_mismatch_flag(sync_med_ms: float, event_med_ms: float, factor: float = 1.5, slack_ms: float = 0.05) -> list:
    """EVENT_SYNC_MISMATCH when the synchronised median exceeds ``factor`` x the event median and the
    gap is above ``slack_ms`` (the host's synchronisation overhead): the call left work on streams
    the current stream does not wait for, which the published harness's events under-count.
    """
    if sync_med_ms - event_med_ms <= slack_ms:
        return []
    if event_med_ms > 0 and sync_med_ms <= factor * event_med_ms:
        return []
    return [
        make_flag(
            EVENT_SYNC_MISMATCH,
            f"synchronised median {sync_med_ms:.3f} ms vs current-stream event median {event_med_ms:.3f} ms",
        )
    ]


# --------------------------------------------------------------------------- L2 sensitivity


def cache_sensitivity(ref_model, custom_model, make_inputs, device, cfg=None, global_state=None):
    """Does the custom speedup depend on data left in L2 between calls? (CUDA only; on CPU
    ``{"skipped": ..., "flags": []}``.) Runs :func:`time_strict` with and without the L2 flush and
    flags L2_RESIDENT when ``speedup_no_flush / speedup_flush > cfg["l2_factor"]`` (event-based
    speedups where available): an advantage the published harness, which never flushes, inflates.
    """
    dev = detectors.as_device(device)
    if dev.type != "cuda":
        return {"skipped": "L2 sensitivity is measured on CUDA only", "flags": []}
    c = _cfg(cfg)
    runs = {}
    for flush in (True, False):
        cf = dict(c, flush_l2=flush)
        runs[flush] = time_strict(ref_model, custom_model, make_inputs, dev, cf, global_state)
    key = "speedup_event_median" if "speedup_event_median" in runs[True] else "speedup_median"
    s_flush, s_warm = runs[True][key], runs[False][key]
    ratio = _ratio(s_warm, s_flush)
    flags = []
    if math.isfinite(ratio) and ratio > float(c["l2_factor"]):
        flags.append(
            make_flag(L2_RESIDENT, f"speedup {s_warm:.2f}x without L2 flush vs {s_flush:.2f}x with flush")
        )
    return {
        "basis": key,
        "speedup_flush": s_flush,
        "speedup_noflush": s_warm,
        "ratio": ratio,
        "n_flush": runs[True]["n"],
        "n_noflush": runs[False]["n"],
        "flags": flags,
    }
