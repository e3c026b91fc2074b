"""Benchmark (not a test): do busy CPUs stretch CUDA-event timings of tiny kernels?

Times a tiny kernel many times with CUDA events (as the worker's ``time_call`` does) from a
thread pinned to the highest CPU, the way the GPU lock holder runs, in three phases:

* ``idle``: nothing else runs;
* ``isolated``: ``--burners`` CPU-bound processes, all kept off the timing CPU (what the
  workflow now does for every process it starts: gpulock.keep_workflow_off_timing_cpus);
* ``shared``: the same burners free to run on any CPU, the timing CPU included (what job
  scripts, Snakemake and samplers could do before).

Prints, per phase, the calls stretched by at least 1 ms (per 1000) and the largest stretch.

    python scripts/bench_stalls.py --seconds 10 --burners 32 --json stalls.json
    python scripts/bench_stalls.py --cpu --seconds 2 --burners 4   # smoke test without a GPU
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time


def burn(cpus, stop_at: float) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    x = 0
    while time.time() < stop_at:
        x += 1


def timed_calls(seconds: float, use_cuda: bool) -> list[float]:
    import torch

    dev = "cuda" if use_cuda else "cpu"
    x = torch.ones(1024, device=dev)
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if use_cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            x.add_(1)
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            x.add_(1)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def phase(name: str, seconds: float, burners: int, pin_burners, timing_cpu: int, use_cuda: bool) -> dict:
    ctx = mp.get_context("spawn")
    stop_at = time.time() + seconds + 2
    procs = [ctx.Process(target=burn, args=(pin_burners, stop_at)) for _ in range(burners)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let the scheduler spread them
    os.sched_setaffinity(0, {timing_cpu})
    try:
        ms = timed_calls(seconds, use_cuda)
    finally:
        os.sched_setaffinity(0, ALL_CPUS)
        for p in procs:
            p.join()
    med = statistics.median(ms)
    stretched = [v - med for v in ms if v - med >= 1.0]
    res = {
        "phase": name, "burners": burners, "calls": len(ms), "median_ms": med,
        "stretched_1ms": len(stretched), "per_1000": 1000 * len(stretched) / len(ms),
        "max_stretch_ms": max(stretched, default=0.0),
        "stretch_ms": sorted(round(v, 2) for v in stretched)[-50:],
    }
    print(f"{name:9s} burners {burners:3d}: {len(ms)} calls, median {med:.4f} ms, stretched >= 1 ms: "
          f"{len(stretched)} ({res['per_1000']:.2f} per 1000), largest +{res['max_stretch_ms']:.2f} ms", flush=True)
    return res


ALL_CPUS: set[int] = set()


def main(argv=None) -> int:
    global ALL_CPUS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="timing per phase")
    ap.add_argument("--burners", type=int, default=2 * os.cpu_count())
    ap.add_argument("--cpu", action="store_true", help="time on the CPU (a smoke test without a GPU)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    ALL_CPUS = set(os.sched_getaffinity(0))
    timing = max(ALL_CPUS)
    rest = ALL_CPUS - {timing}
    if not rest:
        sys.exit("bench_stalls: needs at least two CPUs")
    use_cuda = not args.cpu
    print(f"timing CPU {timing}; {len(rest)} other CPUs; {'CUDA events' if use_cuda else 'host timer'}", flush=True)
    out = [
        phase("idle", args.seconds, 0, None, timing, use_cuda),
        phase("isolated", args.seconds, args.burners, rest, timing, use_cuda),
        phase("shared", args.seconds, args.burners, None, timing, use_cuda),
    ]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"timing_cpu": timing, "cpus": len(ALL_CPUS), "phases": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
