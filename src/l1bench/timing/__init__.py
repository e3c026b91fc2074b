"""How a call is timed: the published harness's primitives, both protocols, the host's clock and
the stalls it shows. Who holds the GPU is :mod:`l1bench.gpu`'s; which process runs a step,
:mod:`l1bench.pool`'s.

Every check and time result records the version of this path that made it, ``timing_version``
(:data:`TIMING_VERSION`; older results: :func:`l1bench.results.timing_version`). Version 9: the
GPU touched only inside the lock, the lock holder on a timing CPU of its own, disturbed and
driver-stalled pairs timed again, a task's check and eager-mode time steps served by one
process per task, the torch.compile modes in a process per step; inputs drawn on the host and
copied, held and let go of through an outer trial as the published harness does, its last
warm-up output held through the timed pairs (:class:`l1bench.timing.harness.HeldInputs`).
Results of another version are stale.
"""

#: The timing version new check and time results record (``timing_version``).
TIMING_VERSION = 9
