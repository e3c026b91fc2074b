"""Benchmark (not a test): what a fresh process's first GPU calls cost, and how much of it can
be done before the GPU lock.

The locked steps of a job that are not timed are mostly per-process first-use costs (the lock
profile of results/isolation/LOCKED-STEPS.md: the first convolution in "reference warm-up" and
"laziness"). Each case runs in fresh interpreters, alternating, ``--repeats`` times:

    plain     import torch; CUDA's start; first convolution; the same again; a new shape;
              first matmul
    preload   the same, after loading cuDNN's and cuBLAS's libraries with dlopen before CUDA
              starts (CPU only: what a worker could do before it takes the lock)

Prints one JSON line per process and a median table; ``--json`` keeps them.

    python scripts/bench_first_call.py --repeats 3 --json results/h100/bench/first-call-h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import ctypes, glob, json, os, sys, time
t = time.perf_counter()
import torch
out = {"case": sys.argv[1], "import_s": time.perf_counter() - t}
if sys.argv[1] == "preload":
    t = time.perf_counter()
    roots = {os.path.dirname(os.path.dirname(torch.__file__))}
    found = glob.glob(os.path.join(next(iter(roots)), "nvidia", "**", "lib*.so*"), recursive=True)
    found += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "lib*.so*"))
    libs = sorted({p for p in found if os.path.basename(p).startswith(("libcudnn", "libcublas"))})
    loaded = 0
    for p in libs:
        try:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
            loaded += 1
        except OSError:
            pass
    out["preload_s"], out["preloaded"] = time.perf_counter() - t, loaded
dev = "cuda" if torch.cuda.is_available() else "cpu"

def step(name, fn):
    t = time.perf_counter()
    fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    out[name] = round(time.perf_counter() - t, 4)

step("cuda_start_s", lambda: (torch.empty(1, device=dev), dev == "cuda" and torch.cuda.current_blas_handle()))
x = torch.randn(8, 64, 56, 56, device=dev)
conv = torch.nn.Conv2d(64, 64, 3).to(dev)
step("conv_first_s", lambda: conv(x))
step("conv_again_s", lambda: conv(x))
x2 = torch.randn(4, 32, 30, 30, device=dev)
conv2 = torch.nn.Conv2d(32, 48, 5).to(dev)
step("conv_new_shape_s", lambda: conv2(x2))
a = torch.randn(512, 768, device=dev)
lin = torch.nn.Linear(768, 1024).to(dev)
step("linear_first_s", lambda: lin(a))
print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}), flush=True)
"""

STEPS = ("import_s", "preload_s", "cuda_start_s", "conv_first_s", "conv_again_s", "conv_new_shape_s", "linear_first_s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    for _ in range(args.repeats):
        for case in ("plain", "preload"):
            run = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, timeout=300)
            if run.returncode:
                sys.exit(f"bench_first_call: the {case} process failed: {run.stderr.strip().splitlines()[-1:]}")
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    print("| case | " + " | ".join(STEPS) + " |")
    print("|---" * (len(STEPS) + 1) + "|")
    for case in ("plain", "preload"):
        mine = [r for r in rows if r["case"] == case]
        cells = [f"{statistics.median(r.get(s, 0) for r in mine):.3f}" for s in STEPS]
        print(f"| {case} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
