"""Child process that builds, checks or times one task.

Run as ``python -m l1bench.worker JOB.json RESULT.json``. This is the only place
where snippet code executes. Exit codes:

* 0 — a result was written (whatever its status: a compile error or a wrong
  output is a *result*);
* 3 — the run broke (CUDA fault, out of memory): no result, the job must fail
  and be retried;
* anything else, or a signal — a crash: no result.

The paper protocol follows CUDA-L1's ``eval/eval_cuda.py`` at the pinned commit
(our own code): correctness trials seeded like the harness, 3 warm-up calls,
``outer_trials`` × ``inner_trials`` timed pairs in random order with CUDA events,
waiting on the custom model's own streams when its source mentions
``cuda.Stream``; score = mean over outer trials of mean(ref ms)/mean(custom ms).

Modules:

* :mod:`~l1bench.worker.outcome`: the result dict (``result``), a negative earlier stage carried
  forward (``upstream_status``), snippet exceptions as statuses (``guarded``), ``EXIT_INFRA``,
  ``NO_CODE_REASON``;
* :mod:`~l1bench.worker.torch_hooks`: patches of torch internals and their per-process state:
  the torch.compile backend (``_BACKENDS``, ``_COMPILED_GRAPHS``), dynamo compiles and extension
  builds with the GPU lock released, failed extension builds remembered (``_FAILED_BUILDS``) and
  noted on results;
* :mod:`~l1bench.worker.stages`: ``do_build``, ``do_check``, ``do_time`` (the setup both
  protocols share, then the protocol of ``job["protocol"]``, :mod:`l1bench.timing.protocols`);
* :mod:`~l1bench.worker.entry`: ``run``, ``main`` (``__main__``), ``KINDS``, ``pick_device``.

How a step holds the GPU and times its calls (sections, the harness's timed pairs, the
protocols, the task worker that serves a task's steps) is :mod:`l1bench.timing`'s.

This module re-exports the names used outside the package, on first use (:func:`__getattr__`):
importing one submodule (the timing package imports ``outcome`` and ``torch_hooks``) must not
import the whole worker, whose stages import the timing package. They are bindings, not the
names the code looks up: a test that replaces a function or state of the worker patches the
module that uses it (``harness.time_call``, ``harness.cuda_initialized``, ``harness.move``,
``torch_hooks._FAILED_BUILDS``), never ``l1bench.worker``.
"""

import importlib

#: Re-exported name -> the module that defines it.
_EXPORTS = {
    "builds_extensions": "l1bench.results",
    "InfraError": "l1bench.snippet",
    "pick_device": "l1bench.worker.entry",
    **dict.fromkeys(
        ("CustomBuilder", "compare_outputs", "correctness_trials", "lazy_problems", "time_call",
         "timed_pairs", "warm_up"),
        "l1bench.timing.harness",
    ),
    **dict.fromkeys(("EXIT_INFRA", "NO_CODE_REASON", "result", "upstream_status"), "l1bench.worker.outcome"),
    "claim_gpu": "l1bench.timing.sections",
    **dict.fromkeys(
        ("exclusive_extension_build", "extension_build_failures", "note_extension_failures",
         "release_lock_during_dynamo_compiles", "release_lock_during_extension_builds",
         "remember_failed_extension_builds", "wrap_baseline"),
        "l1bench.worker.torch_hooks",
    ),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'l1bench.worker' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
