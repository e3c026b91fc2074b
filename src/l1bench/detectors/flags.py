"""Flag vocabulary of the detectors: the flag record, its names, the cfg defaults.

The names themselves are the members of :class:`l1bench.results.Flag` (defined there, with
what each means).
"""

from __future__ import annotations

from .. import snippet
from ..results import Flag

#: Aliases of the flags :mod:`l1bench.timing.strict` raises, imported from the package.
EVENT_SYNC_MISMATCH = Flag.EVENT_SYNC_MISMATCH
L2_RESIDENT = Flag.L2_RESIDENT
TIMED_OUTPUT_MISMATCH = Flag.TIMED_OUTPUT_MISMATCH

ALL_FLAGS = (
    Flag.LAZY,
    Flag.ALIAS_INPUT,
    Flag.SAME_STORAGE,
    Flag.INPUT_MUTATION,
    Flag.CACHED_OUTPUT,
    Flag.OUTPUT_MISMATCH,
    Flag.BACKGROUND_WORK,
    Flag.GLOBAL_STATE,
    Flag.PRECISION_DOWNGRADE,
    Flag.DTYPE_CHANGED,
    Flag.DEGENERATE_TASK,
    Flag.SPEEDUP_CEILING,
    Flag.DETECTOR_ERROR,
    Flag.EVENT_SYNC_MISMATCH,
    Flag.L2_RESIDENT,
    Flag.TIMED_OUTPUT_MISMATCH,
    Flag.EXTENSION_BUILD_FAILED,
    Flag.SELF_TIMED,
    Flag.RUN_SPREAD,
    Flag.HOST_BOUND,
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
