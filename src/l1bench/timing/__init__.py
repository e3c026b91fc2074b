"""GPU timing: how a check or time step holds the GPU, times its calls and is served.

Every check and time result records the version of this path that made it, ``timing_version``
(:data:`TIMING_VERSION`; older results: :func:`l1bench.results.timing_version`). Version 7: the
GPU touched only inside the lock, the lock holder on a timing CPU of its own, disturbed and
driver-stalled pairs timed again, a task's check and eager-mode time steps served by one
process per task; the torch.compile modes keep a process per step, timed as since version 4.
"""

#: The timing version new check and time results record (``timing_version``).
TIMING_VERSION = 7

#: The oldest version whose torch.compile-mode results are timed as today: those steps have had
#: a process of their own, timed as now, since version 4.
COMPILE_MODES_SINCE = 4


def current_version(mode: str) -> int:
    """The oldest timing version whose results of ``mode`` are timed as a new result would be:
    :data:`COMPILE_MODES_SINCE` for the torch.compile modes, else :data:`TIMING_VERSION`."""
    return COMPILE_MODES_SINCE if mode.startswith("torch_compile") else TIMING_VERSION
