"""Find degenerate KernelBench tasks on the CPU: reference outputs constant for random inputs.

A task whose reference output is identically zero (or constant) for every random input makes
any speedup meaningless (a kernel can return a constant). This scan needs no GPU: each
reference runs in a child process with a timeout, on a few random inputs.

    python scripts/scan_references.py results/h100/tasks --out results/h100/reference_scan.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from l1bench.snippet import load_reference, set_seed, flatten_outputs
Model, get_inputs, get_init_inputs = load_reference(open(sys.argv[1]).read())
torch.set_num_threads(1)
set_seed(42)
model = Model(*get_init_inputs())
stats = []
with torch.no_grad():
    for seed in range(int(sys.argv[3])):
        set_seed(seed)
        for out in flatten_outputs(model(*get_inputs())):
            if isinstance(out, torch.Tensor) and out.numel():
                o = out.double()
                stats.append([float(o.min()), float(o.max()), float(o.abs().max())])
print(json.dumps(stats))
"""


def verdict(stats: list) -> str:
    """'zero', 'constant' or 'ok' from per-output [min, max, absmax] over all trials."""
    if not stats:
        return "no_tensor_output"
    if all(s[2] == 0.0 for s in stats):
        return "zero"
    if all(s[0] == s[1] for s in stats):
        return "constant"
    return "ok"


def scan_one(ref: Path, trials: int, timeout: float) -> dict:
    pkg = str(Path(__file__).resolve().parent)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(ref), pkg, str(trials)],
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": "timeout"}
    if proc.returncode != 0:
        return {"verdict": "error", "reason": proc.stderr.strip().splitlines()[-1][:200] if proc.stderr else ""}
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"verdict": verdict(stats), "stats": stats}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    refs = sorted(Path(args.tasks_dir).glob("*/ref.py"))
    with ThreadPoolExecutor(args.jobs) as pool:
        res = dict(zip((r.parent.name for r in refs), pool.map(lambda r: scan_one(r, args.trials, args.timeout), refs)))
    Path(args.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    for tid, r in res.items():
        if r["verdict"] != "ok":
            print(tid, r["verdict"], r.get("reason", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
