"""The worker pool: how a job reaches a worker child (:mod:`l1bench.worker`) and gets back what
its stage found (plain data, which the job stamps: :func:`l1bench.job.stamped`).

A build or a torch.compile-mode time job starts a worker of its own (:mod:`~l1bench.pool.runner`);
a task's check and eager-mode time steps go to its task worker, one process per task
(:mod:`~l1bench.pool.server`, the job's side :mod:`~l1bench.pool.client`), which puts back
what a step changed (:mod:`~l1bench.pool.state`) and waits idle within the GPU's memory
(:mod:`~l1bench.pool.idle`).
"""
