"""Child process that builds, checks or times one task: the only place where snippet code runs.

Run as ``python -m l1bench.worker JOB.json RESULT.json``. Exit codes: 0, a result was written
(whatever its status); 3, the run broke (CUDA fault, out of memory), no result, the job must
fail and be retried; anything else, or a signal, a crash.

* :mod:`~l1bench.worker.outcome`: the result dict, statuses from snippet exceptions;
* :mod:`~l1bench.worker.torch_hooks`: patches of torch internals (compile backends, dynamo
  compiles and extension builds with the GPU lock released, failed builds remembered);
* :mod:`~l1bench.worker.stages`: ``do_build``, ``do_check``, ``do_time``;
* :mod:`~l1bench.worker.entry`: ``run``, ``main``, ``pick_device``.

How a step holds the GPU and times its calls is :mod:`l1bench.timing`'s.
"""
