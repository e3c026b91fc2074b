"""The evaluation modes: one record each (:class:`Mode`), in the paper's column order
(:data:`MODES`). Every list, check and label of a mode derives from it: the release's score fields
and baseline snippets (:mod:`l1bench.release`, :mod:`l1bench.plan`), the baselines and
torch.compile modes the worker times (``timing.harness.BASELINE_MODES``,
``worker.torch_hooks.COMPILE_MODES``), the task worker, priorities and slots of the jobs
(:mod:`l1bench.plan`), the tables' order, labels and missing-score convention
(:mod:`l1bench.aggregate.conventions`). The config schema's mode enums are a static copy of
:data:`NAMES`, held to it by tests/test_modes.py. Imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    #: config ``modes``, and the time results' folder (``time/<protocol>/<name>/``)
    name: str
    #: the release field of the published score
    score_field: str
    #: the paper's label (the CUDA-L1 README's)
    label: str
    #: the release field of the mode's own baseline snippet (the task folder's ``<name>.py``;
    #: GPU only), which the custom code is timed against; None: against the reference
    baseline: str | None = None
    #: the reference under ``torch.compile(mode=...)``; None: eager
    compile: str | None = None
    #: where the mode's missing-score convention (:attr:`missing_as_one`) comes from
    convention: str = "CUDA-L1 README"

    @property
    def task_worker(self) -> bool:
        """Whether its time jobs are served by their task's worker (l1bench.pool.server): the
        eager modes. A torch.compile mode keeps a process per job: dynamo's and inductor's
        caches would carry over."""
        return self.compile is None

    @property
    def missing_as_one(self) -> bool:
        """Whether tasks without a score count as 1.0x in the statistics. The CUDA-L1 README does
        so for default and the torch.compile modes (a task that failed falls back to the
        reference: speedup 1.0, mean/percentiles/geomean over all tasks), but averages only the
        scored tasks for cuda_graph (its Speedup column reads e.g. "147/229"), whose baseline is
        a snippet of its own that may be absent; so for every mode with a baseline snippet."""
        return self.baseline is None


MODES = (
    Mode("default", "score_default", "Default"),
    Mode("torch_compile", "score_torch_compile_default", "Torch Compile", compile="default"),
    Mode("torch_compile_reduce_overhead", "score_torch_compile_reduce_overhead", "Torch Compile RO",
         compile="reduce-overhead"),
    Mode("cuda_graph", "score_cuda_graph", "CUDA Graph", baseline="cuda_graph_code"),
    # the README has no cudnn row: cuda_graph's convention, a baseline snippet that may be absent
    Mode("cudnn", "score_cudnn", "cuDNN", baseline="cudnn_code",
         convention="README convention for CUDA Graph, applied to cuDNN by choice"),
)
#: The modes' names, in order.
NAMES = tuple(m.name for m in MODES)
BY_NAME = {m.name: m for m in MODES}


def compiles(name: str) -> bool:
    """Whether the mode ``name`` times the reference under torch.compile."""
    return BY_NAME[name].compile is not None
