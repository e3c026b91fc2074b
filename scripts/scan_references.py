"""Find degenerate KernelBench tasks on the CPU: reference outputs constant for random inputs.

A task whose reference output is identically zero (or constant) for every random input makes
any speedup meaningless (a kernel can return a constant). This scan needs no GPU: each
reference runs in a child process with a timeout, on a few random inputs.
Snakemake script of rule scan_references.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHILD = r"""
import json, sys, torch
from l1bench.snippet import load_reference, set_seed, flatten_outputs
Model, get_inputs, get_init_inputs = load_reference(open(sys.argv[1]).read())
torch.set_num_threads(1)
set_seed(42)
model = Model(*get_init_inputs())
stats = []
with torch.no_grad():
    for seed in range(int(sys.argv[2])):
        set_seed(seed)
        for out in flatten_outputs(model(*get_inputs())):
            if isinstance(out, torch.Tensor) and out.numel():
                o = out.double()
                stats.append([float(o.min()), float(o.max()), float(o.abs().max())])
print(json.dumps(stats))
"""


def verdict(stats: list) -> str:
    """'zero', 'constant' or 'ok' from per-output [min, max, absmax], one entry per trial.

    constant: every element of every output has one value, the same for all random inputs
    (a scalar loss that changes with the inputs is not constant).
    """
    if not stats:
        return "no_tensor_output"
    if all(s[2] == 0.0 for s in stats):
        return "zero"
    if all(s[0] == s[1] for s in stats) and len({s[0] for s in stats}) == 1:
        return "constant"
    return "ok"


def scan_one(ref: Path, trials: int, timeout: float) -> dict:
    from l1bench.lifeline import guarded

    try:
        proc = subprocess.run(  # under the guard: the child dies with this process
            guarded([sys.executable, "-c", CHILD, str(ref), str(trials)]),
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": "timeout"}
    if proc.returncode != 0:
        return {"verdict": "error", "reason": proc.stderr.strip().splitlines()[-1][:200] if proc.stderr else ""}
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"verdict": verdict(stats), "stats": stats}


def scan_folder(tasks_dir, trials: int, timeout: float, jobs: int, tids) -> dict:
    """{tid: {"verdict": ..., "stats": ...}} for the task folders ``tids`` under ``tasks_dir``."""
    refs = [r for r in sorted(Path(tasks_dir).glob("*/ref.py")) if r.parent.name in set(tids)]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        found = pool.map(lambda r: scan_one(r, trials, timeout), refs)
        return dict(zip((r.parent.name for r in refs), found, strict=False))


def smk_main(smk) -> None:
    """Snakemake rule scan_references: scan the selected tasks, write the JSON atomically."""
    import logging

    from l1bench.io import atomic_write_json
    from l1bench.lifeline import exit_with_workflow
    from l1bench.log import setup_logging

    exit_with_workflow()  # a killed workflow leaves no scan (nor reference) running

    setup_logging(smk.log[0])
    tids = [Path(m).parent.name for m in smk.input.meta]
    res = scan_folder(Path(smk.input.meta[0]).parent.parent, smk.params.trials, smk.params.timeout, smk.threads, tids)
    for tid, r in res.items():
        if r["verdict"] != "ok":
            logging.info("%s %s %s", tid, r["verdict"], r.get("reason", ""))
    atomic_write_json(smk.output[0], res)


if "snakemake" in globals():
    smk_main(snakemake)  # noqa: F821
