"""Write the embedded demo release (config/demo/optimized_cuda_code/demo.json).

A handful of KernelBench-style tasks that run on the CPU in seconds and cover
every outcome the pipeline must handle. Run: python scripts/make_demo_release.py
"""

import json
import sys
from pathlib import Path

HEADER = "import torch\nimport torch.nn as nn\n"

ROWSUM_REF = HEADER + '''
class Model(nn.Module):
    """Row sums, one row at a time (slow on purpose)."""

    def forward(self, x):
        return torch.stack([x[i].sum() for i in range(x.shape[0])])


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return []
'''

ROWSUM_FAST = HEADER + '''
class ModelNew(nn.Module):
    """Correct and faster: one vectorised reduction."""

    def forward(self, x):
        return x.sum(dim=1)
'''

SCALE_REF = HEADER + '''
class Model(nn.Module):
    """y = relu(x) * scale."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return [2.0]
'''

SCALE_SLOW = HEADER + '''
class ModelNew(nn.Module):
    """Correct but slower: recomputes the result many times."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        y = None
        for _ in range(40):
            y = torch.maximum(x, torch.zeros_like(x)) * self.scale
        return y
'''

SCALE_WRONG = HEADER + '''
class ModelNew(nn.Module):
    """Incorrect: wrong scale factor."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * (self.scale * 1.25)
'''

RAISES = HEADER + '''
class ModelNew(nn.Module):
    """Raises in forward."""

    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        raise RuntimeError("kernel launch not implemented")
'''

HANGS = HEADER + '''import time


class ModelNew(nn.Module):
    """Never returns from forward (the job must time out, alone)."""

    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        while True:
            time.sleep(0.5)
'''

KILLS = HEADER + '''import os
import signal


class ModelNew(nn.Module):
    """Kills its own process in forward (the job must fail, alone)."""

    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGKILL)
'''

LAZY = HEADER + '''

class LazyTensor(torch.Tensor):
    """A tensor subclass standing in for deferred work."""


class ModelNew(nn.Module):
    """Returns a tensor subclass: fails the laziness check."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return (torch.relu(x) * self.scale).as_subclass(LazyTensor)
'''

NO_MODEL_NEW = HEADER + '''
class FastModel(nn.Module):
    """Forgets to define ModelNew."""

    def forward(self, x):
        return x.sum(dim=1)
'''

SYNTAX_ERROR = HEADER + '''
class ModelNew(nn.Module)
    def forward(self, x):
        return x.sum(dim=1)
'''


def scores(default, compile_default=None, compile_ro=None):
    return {
        "score_default": default,
        "score_torch_compile_default": compile_default,
        "score_torch_compile_reduce_overhead": compile_ro,
        "score_cuda_graph": None,
        "score_cudnn": None,
    }


#: (level, task, ref, custom, published scores, what it demonstrates)
TASKS = [
    (1, 1, ROWSUM_REF, ROWSUM_FAST, scores(20.0, 8.0, 9.0), "correct and faster"),
    (1, 2, SCALE_REF, SCALE_SLOW, scores(1.5, 1.2, 1.3), "correct and slower than published"),
    (1, 3, SCALE_REF, SCALE_WRONG, scores(2.0, 1.5, 1.5), "incorrect output"),
    (1, 4, SCALE_REF, RAISES, scores(1.1), "raises in forward"),
    (1, 5, SCALE_REF, HANGS, scores(1.1), "hangs (job times out)"),
    (1, 6, SCALE_REF, KILLS, scores(1.1), "kills its process (job crashes)"),
    (1, 7, SCALE_REF, "None", scores(3.0, 2.0, 2.0), "no code, published score kept"),
    (2, 1, SCALE_REF, LAZY, scores(5.0), "lazy output"),
    (2, 2, ROWSUM_REF, NO_MODEL_NEW, scores(4.0), "no ModelNew"),
    (2, 3, ROWSUM_REF, SYNTAX_ERROR, scores(4.0), "does not compile"),
    (2, 4, ROWSUM_REF, None, scores(None), "no code, no score"),
]


def rows():
    for level, task, ref, custom, sc, _ in TASKS:
        yield {
            "level_id": level,
            "task_id": task,
            "ref_code": ref,
            "custom_code": custom,
            "cuda_graph_code": None,
            "cudnn_code": None,
            **sc,
        }


def main(dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows()))


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else root / "config/demo/optimized_cuda_code/demo.json")
