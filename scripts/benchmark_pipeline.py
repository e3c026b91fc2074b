"""Benchmark (not a test): run one fixed slice twice and compare wall time per stage.

* ``serial``: one job at a time (``--cores 1 --resources gpu=1``), like a harness that
  builds, checks and times task after task;
* ``overlapped``: the default design (parallel builds, several GPU jobs in flight whose
  kernel sections are serialised by the per-GPU lock).

Besides wall time it reports what the overlap may cost in measurement quality: the timed calls
that a host-side stall stretched (l1bench.stalls), per 1000, in each run.

Each run writes its own results tree (``results_dir``), so both build from scratch.

    python scripts/benchmark_pipeline.py --device h100 --release-dir ../shared/cuda-l1 \\
        --tasks 1/1 1/12 2/96 --cores 16 --gpu-jobs 12
    python scripts/benchmark_pipeline.py --device demo --tasks 1/1 1/2 --cores 2 --gpu-jobs 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import _installed  # noqa: F401  (one line, not a traceback, without the package)

from l1bench import stalls
from l1bench.stagetimes import collect, results, table


def run(name: str, args, cores: int, gpu_jobs: int) -> dict:
    out = Path(args.out_root) / name
    cfg = [f"device={args.device}", f"results_dir={out}", "tasks=" + json.dumps(args.tasks)]
    if args.release_dir:
        cfg.append(f"release_dir={args.release_dir}")
    if args.modes:
        cfg.append("modes=" + json.dumps(args.modes))
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--resources", f"gpu={gpu_jobs}",
           "--retries", "0", "-q", "rules", "--config", *cfg]
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1]).returncode
    wall = time.monotonic() - t0
    rows = list(results(out / args.device))
    stats = collect(rows)
    rate = stalls.stall_rate(r for r in rows if r["kind"] == "time")
    print(f"\n## {name}: {wall:.1f} s wall (snakemake exit {rc})\n\n{table(stats)}\n{stalls.describe_rate(rate)}")
    return {"wall_s": wall, "rc": rc, "stages": stats, "stalls": rate}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="demo")
    ap.add_argument("--release-dir")
    ap.add_argument("--tasks", nargs="+", required=True, help='e.g. 1/1 2/96')
    ap.add_argument("--modes", nargs="*")
    ap.add_argument("--cores", type=int, default=16)
    ap.add_argument("--gpu-jobs", type=int, default=12)
    ap.add_argument("--out-root", default="bench")
    ap.add_argument("--json", help="write both runs' numbers here")
    args = ap.parse_args(argv)
    serial = run("serial", args, 1, 1)
    overlapped = run("overlapped", args, args.cores, args.gpu_jobs)
    print(f"\nspeed ratio serial/overlapped: {serial['wall_s'] / overlapped['wall_s']:.2f}x")
    # what the speed costs in measurement quality: timed calls a host-side stall stretched
    print(f"stalled timed calls per 1000: serial {stalls.per_1000(serial['stalls']):.1f}, "
          f"overlapped {stalls.per_1000(overlapped['stalls']):.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"serial": serial, "overlapped": overlapped}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
