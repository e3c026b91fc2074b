"""Integrity detectors: catch custom models that fool a speed benchmark.

The published CUDA-L1 harness checks a custom ``ModelNew`` against the reference
``Model`` with ``allclose`` on a few inputs and then times repeated calls.  A
custom model can pass that and still be fast for the wrong reasons (reward
hacks): lazy outputs, returning its input, caching outputs keyed on input
identity, doing the work on threads or streams the timer does not wait for,
changing global backend flags, or computing in lower precision.

Each detector here is a small function that returns a list of flags
``{"flag": NAME, "reason": one short line}``; :func:`run_detectors` builds both
models, runs them on fresh inputs and collects every detector's flags.  A flag
says "review this result", not "this is proven cheating": each docstring states
what the detector proves and where it is blind.

These functions execute untrusted snippet code: call them only inside a worker
child process, never in the Snakemake process.  They work on CPU (``"cpu"``) and
CUDA (``"cuda:N"``); CUDA-only steps are guarded with ``device.type == "cuda"``.

Submodules, each importing only from those above it:

- :mod:`.flags`: the flag record and vocabulary (``make_flag``, ``flag_names``, ``ALL_FLAGS``,
  ``DEFAULTS``); the names are the members of :class:`l1bench.results.Flag`.
- :mod:`.tensors`: tensor utilities (``as_device``, ``sync``, ``tensors_of``, ``clone_values``,
  ``digest``/``digests``, ``device_fingerprint``, ``storage_range``, ``shares_memory``,
  ``compare_outputs``).
- :mod:`.checks`: the individual detectors (LAZY, ALIAS_INPUT, SAME_STORAGE, INPUT_MUTATION,
  CACHED_OUTPUT, BACKGROUND_WORK, PRECISION_DOWNGRADE, DTYPE_CHANGED, DEGENERATE_TASK,
  SPEEDUP_CEILING).
- :mod:`.global_state`: GLOBAL_STATE: snapshot / restore / diff of the global torch settings.
- :mod:`.run`: the orchestration, :func:`run_detectors` (and the custom-model call wrappers).

This module is the package's interface: the names the rest of the project (``worker.py``,
``strict.py``, ``scripts/``) uses; ``check_lazy`` and ``compare_outputs`` for the references in
``worker.py``'s docstrings.  Tests import from the submodules.
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
