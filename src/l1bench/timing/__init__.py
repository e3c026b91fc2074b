"""GPU timing: how a check or time step holds the GPU, times its calls and is served.

Every check and time result records the version of this path that made it,
``timing_version`` (:data:`TIMING_VERSION`; results made before the field existed carry
``timing_design``, read by :func:`l1bench.results.timing_version`; results with neither: 1).

1. before the timing-isolation work: other jobs' start-up, driver calls and threads could reach
   the timed calls;
2. kernels only inside the GPU lock, the device synchronised before any pause of the lock,
   threads started in a section moved off the timing CPU, no garbage collection in sections,
   every timed call's host accounting recorded and disturbed pairs timed again
   (:mod:`l1bench.timing.hostclock`); also every call into the GPU's resource manager inside the lock;
3. the driver's threads moved off the timing CPU as soon as CUDA has started;
4. a trial's first pair that stalled in the driver, or was disturbed, is timed again after
   emptying the allocator and one warm-up call; each step in a process of its own;
5. and 6. variants of 4 that were measured and not taken up (shared sections; CUDA started
   outside the lock);
7. as 4, but a task's check and its eager-mode time steps (default, cuda_graph, cudnn; paper
   and strict) are served one after another by one process per task (its task worker), so
   CUDA starts once per task; the torch.compile modes keep a process per step, as in 4.
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
