"""Child process that builds, checks or times one task: the only place where snippet code runs.

Run as ``python -m l1bench.worker JOB.json RESULT.json``. Exit codes: 0, what the stage found was
written (whatever its status); 3 (:data:`EXIT_INFRA`), the run broke (CUDA fault, out of memory),
nothing written, the job must fail and be retried; anything else, or a signal, a crash. What it
writes is plain data (:func:`l1bench.results.stage_result`, with the child's provenance): the job
stamps it as its result (:func:`l1bench.job.stamped`).

* :mod:`~l1bench.worker.torch_hooks`: patches of torch internals (compile backends, dynamo
  compiles and extension builds with the GPU lock released, failed builds remembered);
* :mod:`~l1bench.worker.stages`: ``do_build``, ``do_check``, ``do_time``;
* :mod:`~l1bench.worker.entry`: ``run``, ``main``, ``pick_device``.

How a step holds the GPU is :mod:`l1bench.gpu`'s, how it times its calls :mod:`l1bench.timing`'s;
the processes that run it are :mod:`l1bench.pool`'s.
"""

#: The worker's exit status when the run broke (CUDA fault, out of memory): no result, the job
#: fails and is retried (shared by the parents, :mod:`l1bench.pool`).
EXIT_INFRA = 3
