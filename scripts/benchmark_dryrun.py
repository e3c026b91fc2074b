#!/usr/bin/env python3
"""Benchmark: wall time of the full dry run of a device's workflow (CI's planning step).

    python scripts/benchmark_dryrun.py --release-dir ../shared/cuda-l1 [--repeat 5] [--here]

Clones the repository's HEAD into a temporary folder (a fresh clone: committed results, no
task folders, no .snakemake) and times ``snakemake -n -q rules --cores 1 --config device=h100
release_dir=...`` there: the first run (which also splits the release into task folders),
then ``--repeat`` more. ``--here`` times the current checkout instead. Prints each wall time,
the median of the repeats, the jobs the dry run plans, and the goal (5 s on a 2-CPU machine).
A benchmark, not a test: it never fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 5.0


def dry_run(workdir: Path, device: str, release_dir: str) -> tuple[float, dict, str]:
    cmd = [sys.executable, "-m", "snakemake", "-n", "-q", "rules", "--cores", "1",
           "--config", f"device={device}", f"release_dir={release_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"dry run failed ({proc.returncode}):\n{out[-2000:]}")
    block = out.split("Job stats:")[-1] if "Job stats:" in out else ""
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M) if m[1] != "total"}
    return wall, jobs, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--release-dir", default=os.environ.get("L1_RELEASE_DIR", str(ROOT.parent / "shared/cuda-l1")))
    ap.add_argument("--device", default="h100")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--here", action="store_true", help="time the current checkout, not a fresh clone")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args(argv)
    release_dir = str(Path(args.release_dir).resolve())

    with tempfile.TemporaryDirectory(prefix="l1bench-dryrun-") as tmp:
        if args.here:
            work = ROOT
        else:
            work = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(work)], check=True)
        first, jobs, _ = dry_run(work, args.device, release_dir)
        walls = [dry_run(work, args.device, release_dir)[0] for _ in range(args.repeat)]

    median = statistics.median(walls) if walls else first
    where = "this checkout" if args.here else "a fresh clone of HEAD"
    print(f"full dry run, device={args.device}, {where}, {os.cpu_count()} CPUs")
    print(f"  first run (splits the release into task folders): {first:.2f} s")
    if walls:
        print(f"  {len(walls)} more: " + ", ".join(f"{w:.2f}" for w in walls)
              + f" s; median {median:.2f} s, max {max(walls):.2f} s")
    print(f"  planned jobs: {jobs or 'none (nothing to be done)'}")
    print(f"  goal: <= {GOAL_S:.0f} s: {'met' if max([first, *walls]) <= GOAL_S else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": args.device, "where": where, "cpus": os.cpu_count(), "first_s": round(first, 3),
            "repeat_s": [round(w, 3) for w in walls], "median_s": round(median, 3), "planned": jobs,
            "goal_s": GOAL_S,
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
