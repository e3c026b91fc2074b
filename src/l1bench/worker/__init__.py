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

Modules, each importing only from those above it in this list:

* :mod:`~l1bench.worker.outcome`: the result dict (``result``), a negative earlier stage carried
  forward (``upstream_status``), snippet exceptions as statuses (``guarded``), ``EXIT_INFRA``,
  ``NO_CODE_REASON``;
* :mod:`~l1bench.worker.torch_hooks`: patches of torch internals and their per-process state:
  the torch.compile backend (``_BACKENDS``, ``_COMPILED_GRAPHS``), dynamo compiles and extension
  builds with the GPU lock released, failed extension builds remembered (``_FAILED_BUILDS``) and
  noted on results;
* :mod:`~l1bench.worker.harness`: the published harness's primitives: timing calls and timed
  pairs, laziness and correctness checks, warm-ups, ``CustomBuilder``;
* :mod:`~l1bench.worker.sections`: GPU sections: ``exclusive`` (the GPU lock), ``claim_gpu``,
  ``open_device``, ``phase``;
* :mod:`~l1bench.worker.protocols`: the timing interface ``TimingProtocol`` and its two
  implementations, ``PaperProtocol`` and ``StrictProtocol`` (delegating to
  :func:`l1bench.strict.time_strict`);
* :mod:`~l1bench.worker.stages`: ``do_build``, ``do_check``, ``do_time`` (the setup both
  protocols share, then the protocol of ``job["protocol"]``);
* :mod:`~l1bench.worker.entry`: ``run``, ``main`` (``__main__``), ``KINDS``, ``pick_device``;
* :mod:`~l1bench.worker.serve`: a task worker: one process serving a task's check and
  eager-mode time steps one after another (``python -m l1bench.worker.serve``).

This module re-exports the names used outside the package. They are bindings, not the names the
code looks up: a test that replaces a function or state of the worker patches the module that
uses it (``harness.time_call``, ``harness.cuda_initialized``, ``harness.move``,
``torch_hooks._FAILED_BUILDS``), never ``l1bench.worker``.
"""

from l1bench.results import builds_extensions
from l1bench.snippet import InfraError
from l1bench.worker.entry import pick_device
from l1bench.worker.harness import (
    RETIME_ENV,
    CustomBuilder,
    compare_outputs,
    correctness_trials,
    lazy_problems,
    time_call,
    timed_pairs,
    warm_up,
)
from l1bench.worker.outcome import EXIT_INFRA, NO_CODE_REASON, result, upstream_status
from l1bench.worker.sections import claim_gpu
from l1bench.worker.torch_hooks import (
    exclusive_extension_build,
    extension_build_failures,
    note_extension_failures,
    release_lock_during_dynamo_compiles,
    release_lock_during_extension_builds,
    remember_failed_extension_builds,
    wrap_baseline,
)

__all__ = [
    "EXIT_INFRA",
    "NO_CODE_REASON",
    "RETIME_ENV",
    "CustomBuilder",
    "InfraError",
    "builds_extensions",
    "claim_gpu",
    "compare_outputs",
    "correctness_trials",
    "exclusive_extension_build",
    "extension_build_failures",
    "lazy_problems",
    "note_extension_failures",
    "pick_device",
    "release_lock_during_dynamo_compiles",
    "release_lock_during_extension_builds",
    "remember_failed_extension_builds",
    "result",
    "time_call",
    "timed_pairs",
    "upstream_status",
    "warm_up",
    "wrap_baseline",
]
