"""Vocabulary of the tables: the columns of ``scores.csv``, the status groups, mode labels and the
order of modes and protocols, the rows of a summary table and the missing-score convention.

First layer of :mod:`l1bench.aggregate`; imports nothing from the other submodules.
"""

from __future__ import annotations

from .. import results
from ..modes import MODES, NAMES
from ..results import Status

#: Per mode: do tasks without a score count as 1.0x in the statistics
#: (:attr:`l1bench.modes.Mode.missing_as_one`, the CUDA-L1 README's convention)?
MISSING_AS_ONE = {m.name: m.missing_as_one for m in MODES}
#: Display names, as in the CUDA-L1 README (:attr:`l1bench.modes.Mode.label`).
MODE_LABELS = {m.name: m.label for m in MODES}
#: Where each mode's missing-score convention comes from (:attr:`l1bench.modes.Mode.convention`).
CONVENTION_SOURCES = {m.name: m.convention for m in MODES}

#: Known timing protocols, in display order (others sort after, alphabetically).
PROTOCOLS = ("paper", "strict")

#: Rows of a summary table, in order.
STAT_ROWS = ("Mean", "Max", "75%", "50%", "25%", "Success", "Speedup", "GeoMean")

#: A score above this counts as a speedup (README: ">1.01x out of total").
SPEEDUP_THRESHOLD = 1.01

#: Statuses meaning "ran and failed" (the custom code or the baseline; or broke in every
#: attempt: the worker crashed or timed out) and "not attempted, by design": l1bench.results.
FAILED_STATUSES = results.FAILED_STATUSES
NOT_RUN_STATUSES = results.NOT_RUN_STATUSES
#: Status of a task/mode with meta but no time file.
MISSING = "missing"

COLUMNS = [
    "device",
    "level",
    "task",
    "tid",
    "mode",
    "protocol",
    "status",
    "reason",
    "published",
    "measured",
    "std",
    "n_timings",
    "ratio",
    "flags",
    "check_status",
    "gpu",
    "driver",
    "cuda",
    "torch",
    "started",
    # extras beyond the brief, useful when reading scores.csv
    "code_status",
    "ci95_lo",
    "ci95_hi",
    "finished",
    "python",
    # paper protocol: timed calls stretched by a host-side stall (l1bench.timing.stalls) and the score
    # without the pairs that hold one (the measured score itself is the harness's, unchanged)
    "stalled_calls",
    "score_without_stalls",
    # the timing version that made the score (results.timing_version)
    "timing_version",
    # paper scores: 1 where a side's timed calls are host-bound (HOST_BOUND), 0 where neither is,
    # empty where the result records no launches; what the score's custom code ran (TIMED_GROUPS)
    "host_bound",
    "timed",
    # the machine the result was timed on: its host's name and its GPU's UUID (summary.md's Machines)
    "host",
    "gpu_uuid",
]

#: What a score times, its ``timed`` group (:func:`.stats.timed_group`), in display order. Host-bound
#: first, whatever code ran (the score measures the host's launches as much as the GPU); else what the
#: custom code ran: its own C++/CUDA extension (torch.utils.cpp_extension), built; its PyTorch
#: fallback, the extension not building (``EXTENSION_BUILD_FAILED``); or, code that builds no
#: extension, PyTorch operators: CUDA-L1's rewrite as written, not counted as a fallback.
TIMED_GROUPS = {
    "kernel": "CUDA-L1 kernel on the GPU",
    "host_bound": "host-bound",
    "fallback": "PyTorch fallback",
    "pytorch": "PyTorch code (no extension)",
}

NA = "–"  # shown for a missing number


def _protocol_key(p) -> tuple:
    return (PROTOCOLS.index(p), "") if p in PROTOCOLS else (len(PROTOCOLS), str(p))


def _mode_key(m) -> tuple:
    return (NAMES.index(m), "") if m in NAMES else (len(NAMES), str(m))


def status_class(status) -> str:
    """'measured', 'failed', 'not_run' or 'missing'."""
    if status == Status.OK:
        return "measured"
    if status == MISSING:
        return "missing"
    if status in NOT_RUN_STATUSES:
        return "not_run"
    return "failed"


def _mode_label(mode) -> str:
    return MODE_LABELS.get(mode, str(mode))
