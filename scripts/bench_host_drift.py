"""Benchmark (not a test): does the host's speed drift over a machine's first minutes?

Session eighteen's H100 (a VM) ran the CPU probe 14-17 % slower, and host-bound timed calls
~30 % slower, in its first ten minutes than later, whatever ran beside them; GPU-bound calls did
not move. This asks the machine alone, with nothing else running: every ``--interval`` seconds
for ``--seconds``, on one pinned CPU (default the last one),

    probe_us     the CPU probe's task (l1bench.hostclock.CpuProbe: SHA-256 of 16 KiB), median of 200
    launch_us    the host's part of a tiny CUDA call (the call returning, no sync), median of 200
    host_ms      50 tiny kernels timed by CUDA events: a host-bound timed call (median of 20)
    gpu_ms       one 4096² matmul timed by CUDA events: a GPU-bound timed call (median of 20)

one JSON line per sample and, at the end, each column's first-minute median over its
last-minute median. ``--cpu`` skips the CUDA columns (no GPU). On a fresh H100 (session
eighteen, results/h100/bench/host-drift-h100.json) there was no start-up ramp, but episodes of
a few seconds in which the host-bound call ran up to 3× its median and the matmul never moved.

    python scripts/bench_host_drift.py --seconds 150 --json $OUT/host-drift-h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _installed  # noqa: F401  (one line, not a traceback, without the package)

from l1bench import hostclock

COLUMNS = ("probe_us", "launch_us", "host_ms", "gpu_ms")


def _median_ns(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


def drift(samples: list[dict], window_s: float = 60.0) -> dict:
    """Per column, the median of the samples in the first ``window_s`` seconds and in the last,
    and last over first (below 1: the machine got faster). Samples carry ``t_s`` (seconds since
    the start) and the columns; a column missing from a window is left out."""
    if not samples:
        return {}
    end = max(s["t_s"] for s in samples)
    first = [s for s in samples if s["t_s"] <= window_s]
    last = [s for s in samples if s["t_s"] >= end - window_s]
    out = {}
    for col in COLUMNS:
        a = [s[col] for s in first if s.get(col) is not None]
        b = [s[col] for s in last if s.get(col) is not None]
        if a and b:
            fa, fb = statistics.median(a), statistics.median(b)
            out[col] = {"first": round(fa, 4), "last": round(fb, 4),
                        "last_over_first": round(fb / fa, 3) if fa else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=60.0, help="seconds at each end compared (default 60)")
    ap.add_argument("--timing-cpu", type=int, default=None, help="CPU to pin to (default: the last allowed)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: the probe column only")
    ap.add_argument("--json", default=None, help="write the samples and the drift here")
    args = ap.parse_args(argv)

    cpu = args.timing_cpu if args.timing_cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})

    def probe_us() -> float:
        """The median of 200 of the timed pairs' CPU probes (the same task, the same median)."""
        probe = hostclock.CpuProbe()
        for _ in range(200):
            probe.measure()
        return probe.summary()["median_us"]

    cuda = None
    if not args.cpu:
        import torch

        cuda = torch.cuda
        tiny = torch.zeros(16, device="cuda")
        a = torch.randn(4096, 4096, device="cuda")
        start, stop = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)

        def event_ms(fn, n):
            vals = []
            for _ in range(n):
                cuda.synchronize()
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                vals.append(start.elapsed_time(stop))
            return statistics.median(vals)

        def host_bound():
            for _ in range(50):
                tiny.add_(1.0)

        event_ms(host_bound, 3)
        event_ms(lambda: a @ a, 3)

    samples = []
    t0 = time.monotonic()
    print(f"pinned to CPU {cpu}; {'no GPU' if cuda is None else cuda.get_device_name()}", flush=True)
    while (now := time.monotonic() - t0) < args.seconds:
        s = {"t_s": round(now, 1), "probe_us": probe_us()}
        if cuda is not None:
            s["launch_us"] = round(_median_ns(lambda: tiny.add_(1.0), 200) / 1000, 2)
            cuda.synchronize()
            s["host_ms"] = round(event_ms(host_bound, 20), 4)
            s["gpu_ms"] = round(event_ms(lambda: a @ a, 20), 4)
        samples.append(s)
        print(json.dumps(s), flush=True)
        time.sleep(max(0.0, args.interval - (time.monotonic() - t0 - now)))
    result = {"cpu": cpu, "interval_s": args.interval, "window_s": args.window, "samples": samples,
              "drift": drift(samples, args.window)}
    for col, d in result["drift"].items():
        print(f"{col:10s} first {args.window:.0f} s {d['first']}, last {d['last']}: last/first {d['last_over_first']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
