"""The detectors' flag record, its names and the cfg defaults.

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
