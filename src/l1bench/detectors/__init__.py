"""Integrity detectors: catch custom models that fool a speed benchmark.

A custom ``ModelNew`` can pass the published harness's ``allclose`` check and still be fast for
the wrong reasons: lazy outputs, returning its input, caching outputs, work on streams the timer
does not wait for, changed global backend flags, lower precision. Each detector returns flags
``{"flag": NAME, "reason": one short line}`` ("review this result", not proof);
:func:`run_detectors` builds both models, runs them on fresh inputs and collects the flags.
They execute untrusted snippet code: call them only inside a worker child process.

Submodules: :mod:`.flags` (the flag vocabulary), :mod:`.tensors` (tensor utilities),
:mod:`.checks` (the detectors), :mod:`.global_state` (torch's global settings),
:mod:`.run` (:func:`run_detectors`). This module re-exports what the rest of the project uses.
"""

from __future__ import annotations

from .checks import ceiling_flag, check_lazy
from .flags import EVENT_SYNC_MISMATCH, L2_RESIDENT, TIMED_OUTPUT_MISMATCH, make_flag
from .global_state import restore_global_state, snapshot_global_state
from .run import run_detectors
from .tensors import as_device, clone_values, compare_outputs, tensors_of

__all__ = [
    "EVENT_SYNC_MISMATCH",
    "L2_RESIDENT",
    "TIMED_OUTPUT_MISMATCH",
    "as_device",
    "ceiling_flag",
    "clone_values",
    "check_lazy",
    "compare_outputs",
    "make_flag",
    "restore_global_state",
    "run_detectors",
    "snapshot_global_state",
    "tensors_of",
]
