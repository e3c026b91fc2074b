"""Benchmark (not a test): which activity of a workflow job stalls another job's timed calls?

One process times calls with CUDA events from a thread pinned to the timing CPU (the highest
CPU), as the lock holder does: a tiny kernel (~10 µs, launch-bound) and, every 20th call, a
~0.5 ms copy, an allocating call (below) and a host-heavy call (``launch``: 50 tiny kernels
launched from Python, ~0.5 ms of launching, as a model's forward is; a tiny call cannot show a
CPU that runs 10x slower for a few ms, since 10x its ~10 µs is under the 1 ms a stall must add,
and this one can). Meanwhile other processes, kept off the timing CPU as the workflow keeps its jobs,
do one kind of work at a time, each something a job of the workflow does outside the GPU lock:

    idle                nothing (the floor)
    cpu_python          pure-Python CPU loops on every other CPU, 2 per CPU
    cpu_shared          the same, free to use the timing CPU too (positive control)
    process_churn       interpreters starting, importing torch and exiting (job start-up)
    cuda_context        processes creating a CUDA context and cuBLAS handle, then exiting
    alloc_free          1 GiB device allocations freed with empty_cache, in a loop
    gpu_kernels         another process launching ~ms kernels on the GPU (positive control)
    library_first_use   fresh processes: context, first convolution (cuDNN) and matmul, exit
    compile_first_call  fresh processes: torch.compile of a small model, first call (codegen)
    nvcc                nvcc compiling a small CUDA file, in a loop
    load_extension      fresh processes loading built torch extensions (--ext), then a context
    nvidia_smi          nvidia-smi queries (what provenance.clocks runs twice per job)
    resident_contexts   30 processes that start CUDA (context, cuBLAS handle, 256 MiB) and then
                        sleep: the contexts a run's waiting jobs keep open on the GPU
    file_io             64 MiB files written, fsync'd and removed
    memory              2 GiB of fresh host memory touched and freed
    all                 all of them together (the workflow's mix)

Every 20th call also allocates 4 MiB of device memory inside its window, after the
allocator's cache was emptied (``alloc``: a real cudaMalloc, as the first timed pair of an
outer trial makes): its latency shows what other processes' calls into the GPU's resource
manager do to a timed call that calls into it too.

Per activity: timed calls, stalled calls per 1000 (>= 3x the median and >= 1 ms over it, as
l1bench.stalls counts them), each stall's cause from the timing thread's own accounting
(l1bench.hostclock: preempted / host_lost / host_slow / gpu), calls during whose launch the
thread was kept from running (disturbed) per 1000, the CPU probe's time after each tiny call
and how often it was slow (l1bench.hostclock.CpuProbe: the timing CPU itself slowed; on --cpu
the copy every 20th call runs on the CPU and slows the probes near it), the timing CPU's
interrupt, softirq, system and steal time (/proc/stat) and interrupts (/proc/interrupts), and
how much work the interferers did. With ``--isolate-system`` (root) the machine-wide isolation of the timing CPU
(timingcpus.isolate_system) is applied afterwards and ``idle`` and ``all`` are measured again.

    python scripts/bench_stalls.py --seconds 6 --json results/h100/bench/stalls-activities.json
    python scripts/bench_stalls.py --cpu --seconds 2 --activities idle cpu_python   # no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _installed  # noqa: F401  (one line, not a traceback, without the package)

from l1bench import hostclock, stalls, timingcpus

ACTIVITIES = (
    "idle", "cpu_python", "cpu_shared", "process_churn", "cuda_context", "alloc_free", "gpu_kernels",
    "library_first_use", "compile_first_call", "nvcc", "load_extension", "nvidia_smi", "file_io", "memory",
    "resident_contexts", "all",
)
#: Activities that need a CUDA device (skipped with --cpu).
NEEDS_GPU = {
    "cuda_context", "alloc_free", "gpu_kernels", "library_first_use", "load_extension", "nvidia_smi",
    "resident_contexts",
}
#: The mix of ``all``: (activity, processes).
MIX = (("cpu_python", 8), ("process_churn", 2), ("cuda_context", 2), ("alloc_free", 1), ("library_first_use", 2),
       ("compile_first_call", 1), ("nvcc", 2), ("load_extension", 2), ("nvidia_smi", 2), ("file_io", 1), ("memory", 1))

CU_SOURCE = "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"


# --------------------------------------------------------------------------- interferers


def _py(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def tick(n: int) -> int:
    """One more iteration done, said at once (the parent kills interferers when timing ends)."""
    print(n + 1, flush=True)
    return n + 1


def interfere(activity: str, until: float, ext: list[str], cpu: bool) -> int:
    """Do ``activity`` until the wall clock reaches ``until``; returns the iterations done."""
    n = 0
    if activity == "cpu_shared":
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    if activity in ("cpu_python", "cpu_shared"):
        x = 0
        while time.time() < until:
            for _ in range(2_000_000):
                x += 1
            n = tick(n)
        return n
    dev = "cpu" if cpu else "cuda"
    if activity == "process_churn":
        while time.time() < until:
            _py("import torch")
            n = tick(n)
    elif activity == "cuda_context":
        while time.time() < until:
            _py("import torch; torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.current_blas_handle()")
            n = tick(n)
    elif activity == "resident_contexts":
        import torch

        held = torch.empty(2**26, device=dev)  # 256 MiB
        torch.cuda.current_blas_handle()
        torch.cuda.synchronize()
        n = tick(n)
        while time.time() < until:
            time.sleep(0.05)
        del held
    elif activity == "alloc_free":
        import torch

        while time.time() < until:
            t = torch.empty(2**28, device=dev)
            del t
            torch.cuda.empty_cache()
            n = tick(n)
    elif activity == "gpu_kernels":
        import torch

        a = torch.randn(4096, 4096, device=dev)
        while time.time() < until:
            for _ in range(10):
                a = (a @ a).tanh_()
            torch.cuda.synchronize()
            n = tick(n)
    elif activity == "library_first_use":
        code = (
            "import torch; x = torch.randn(8, 16, 32, 32, device='cuda'); w = torch.randn(16, 16, 3, 3, device='cuda');"
            " torch.nn.functional.conv2d(x, w); (x.flatten(1) @ x.flatten(1).T).sum().item()"
        )
        while time.time() < until:
            _py(code)
            n = tick(n)
    elif activity == "compile_first_call":
        code = (
            "import torch; m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), "
            f"torch.nn.Linear(256, 64)).to('{dev}');"
            f" torch.compile(m)(torch.randn(32, 256, device='{dev}'))"
        )
        while time.time() < until:
            _py(code)
            n = tick(n)
    elif activity == "nvcc":
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(CU_SOURCE)
            while time.time() < until:
                nvcc = ["nvcc", "-c", str(src), "-o", str(Path(tmp) / "k.o")]
                rc = subprocess.run(nvcc, capture_output=True).returncode
                if rc:
                    return -1
                n = tick(n)
    elif activity == "load_extension":
        # torch extensions are Python modules; a plain CUDA library (built by build_library)
        # is loaded as a shared object: either way dlopen and the CUDA fatbin's registration
        code = (
            "import ctypes, importlib.machinery, importlib.util, sys, torch\n"
            "torch.empty(1, device='cuda')\n"
            "for p in sys.argv[1:]:\n"
            "    name = p.rsplit('/', 1)[-1].split('.')[0]\n"
            "    try:\n"
            "        spec = importlib.util.spec_from_file_location("
            "name, p, loader=importlib.machinery.ExtensionFileLoader(name, p))\n"
            "        spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "    except Exception:\n"
            "        ctypes.CDLL(p)\n"
        )
        while time.time() < until and ext:
            subprocess.run([sys.executable, "-c", code, *ext], capture_output=True)
            n = tick(n)
    elif activity == "nvidia_smi":
        while time.time() < until:
            subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,pstate",
                            "--format=csv,noheader,nounits"], capture_output=True)
            n = tick(n)
    elif activity == "file_io":
        block = os.urandom(1 << 20)
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_IO_DIR")) as tmp:
            while time.time() < until:
                path = Path(tmp) / "f"
                with open(path, "wb") as fh:
                    for _ in range(64):
                        fh.write(block)
                    fh.flush()
                    os.fsync(fh.fileno())
                path.unlink()
                n = tick(n)
    elif activity == "memory":
        import numpy as np

        while time.time() < until:
            a = np.ones(2**28, dtype=np.float64)
            del a
            n = tick(n)
    return n


# --------------------------------------------------------------------------- the timer


def cpu_line(cpu: int) -> list[int]:
    """user nice system idle iowait irq softirq steal (jiffies) of one CPU from /proc/stat."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith(f"cpu{cpu} "):
                return [int(v) for v in line.split()[1:9]]
    except OSError:
        pass
    return [0] * 8


def interrupts_on(cpu: int) -> dict:
    """Interrupt counts on one CPU per source (/proc/interrupts)."""
    out = {}
    try:
        lines = Path("/proc/interrupts").read_text().splitlines()
    except OSError:
        return out
    cpus = lines[0].split()
    try:
        col = cpus.index(f"CPU{cpu}")
    except ValueError:
        return out
    for line in lines[1:]:
        parts = line.split()
        if len(parts) > col + 1 and parts[col + 1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[col + 1])
    return out


#: Tiny kernels a ``launch`` call launches (its time is the launching: host-bound).
LAUNCHES = 50


def time_calls(seconds: float, cpu: bool, timing_cpu: int, rest: set) -> dict:
    """Tiny calls, and a ~0.5 ms one every 20th call, for ``seconds`` from the timing CPU; after
    each tiny call the CPU probe of the timed pairs (:class:`l1bench.hostclock.CpuProbe`): was
    the timing CPU itself slowed by what the others do?"""
    import torch

    from l1bench.worker import time_call

    dev = "cpu" if cpu else "cuda"
    x = torch.ones(1024, device=dev)
    big_src = torch.ones(2**26 if cpu else 2**28, device=dev)
    big_dst = torch.empty_like(big_src)
    tiny = lambda: x.add_(1)  # noqa: E731

    def host_heavy():  # host-heavy: the launching is the call's time, as in a model's forward
        for _ in range(LAUNCHES):
            x.add_(1)

    medium = lambda: big_dst.copy_(big_src)  # noqa: E731
    held: list = []

    def alloc():  # a device allocation inside the window, as a first timed pair makes
        held.append(torch.empty(1 << 20, device=dev))
        x.add_(1)

    for fn in (tiny, medium, host_heavy):
        for _ in range(5):
            time_call(fn, (), dev)
    out: dict = {"tiny": [], "medium": [], "alloc": [], "launch": []}
    probe = hostclock.CpuProbe()
    os.sched_setaffinity(0, {timing_cpu})
    try:
        with hostclock.ThreadClock() as clock:
            end = time.monotonic() + seconds
            i = 0
            while time.monotonic() < end:
                kind = {19: "medium", 9: "alloc", 4: "launch"}.get(i % 20, "tiny")
                if kind == "alloc":  # the allocator's cache emptied first: a real cudaMalloc
                    held.clear()
                    if not cpu:
                        torch.cuda.empty_cache()
                fn = {"tiny": tiny, "medium": medium, "alloc": alloc, "launch": host_heavy}[kind]
                ms, launch = time_call(fn, (), dev, (), clock)
                out[kind].append((ms, launch))
                if kind == "tiny":  # not after the copy: on --cpu it runs on the CPU, and slows the probe
                    probe.measure()
                i += 1
    finally:
        os.sched_setaffinity(0, rest)
    summary = probe.summary()
    out["probe"] = summary | {"slow_per_1000": round(1000 * summary["slow"] / max(1, summary["probes"]), 3)}
    return out


def summarise(calls: list) -> dict:
    if not calls:
        return {"calls": 0}
    ms = [c[0] for c in calls]
    med = statistics.median(ms)
    flags = stalls.stalled(ms, med)
    causes: dict = {}
    stretch = []
    for (v, launch), stalled in zip(calls, flags, strict=False):
        if stalled:
            cause = hostclock.stall_cause(v - med, launch) if launch is not None else "unknown"
            causes[cause] = causes.get(cause, 0) + 1
            stretch.append(round(v - med, 2))
    disturbed = sum(1 for _, d in calls if d is not None and d.disturbed())
    ordered = sorted(ms)
    return {
        "calls": len(ms),
        "median_ms": round(med, 5),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 5),
        "max_ms": round(ordered[-1], 5),
        "stalled": sum(flags),
        "stalled_per_1000": round(1000 * sum(flags) / len(ms), 3),
        "causes": causes,
        "stretch_ms": sorted(stretch)[-20:],
        "disturbed": disturbed,
        "disturbed_per_1000": round(1000 * disturbed / len(ms), 3),
        "max_wait_us": max((round((d.wait_ns or 0) / 1000) for _, d in calls if d is not None), default=0),
    }


def build_library(dest: Path) -> str | None:
    """A CUDA shared library with a few hundred kernels (nvcc), for ``load_extension`` when no
    built torch extension is given; None without nvcc."""
    src = dest / "bench_ext.cu"
    src.write_text("".join(f"__global__ void k{i}(float *x) {{ x[threadIdx.x] += {i}.0f; }}\n" for i in range(300))
                   + 'extern "C" int n_kernels() { return 300; }\n')
    out = dest / "bench_ext.so"
    try:
        rc = subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", str(src), "-o", str(out)],
                            capture_output=True, timeout=300).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return str(out) if rc == 0 and out.exists() else None


def run_phase(name: str, args, timing_cpu: int, rest: set) -> dict:
    mix = MIX if name == "all" else () if name == "idle" else ((name, default_count(name, rest)),)
    mix = [(a, k) for a, k in mix if not (args.cpu and a in NEEDS_GPU) and not (a == "load_extension" and not args.ext)]
    until = time.time() + args.ramp + args.seconds + 0.5
    procs = []
    for activity, count in mix:
        for _ in range(count):
            cmd = [sys.executable, __file__, "--interfere", activity, "--until", str(until)]
            cmd += ["--cpu"] if args.cpu else []
            if args.ext:
                cmd += ["--ext", *args.ext]
            procs.append((activity, subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)))
    time.sleep(args.ramp if procs else 0.2)
    stat0, irq0 = cpu_line(timing_cpu), interrupts_on(timing_cpu)
    t0 = time.monotonic()
    calls = time_calls(args.seconds, args.cpu, timing_cpu, rest)
    wall = time.monotonic() - t0
    stat1, irq1 = cpu_line(timing_cpu), interrupts_on(timing_cpu)
    done: dict = {}
    for activity, p in procs:  # stop them now (an iteration can take seconds): what they did is printed as they go
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        lines = (text or "").split()
        done[activity] = done.get(activity, 0) + (int(lines[-1]) if lines and lines[-1].lstrip("-").isdigit() else 0)
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    irq_delta = {k: irq1.get(k, 0) - v for k, v in irq0.items() if irq1.get(k, 0) - v > 0}
    res = {
        "activity": name,
        "seconds": round(wall, 2),
        "interferers": {a: k for a, k in mix},
        "interferer_iterations": done,
        "tiny": summarise(calls["tiny"]),
        "medium": summarise(calls["medium"]),
        "alloc": summarise(calls["alloc"]),
        "launch": summarise(calls["launch"]),
        "probe": calls["probe"],
        "timing_cpu_jiffies": {n: b - a for n, a, b in zip(names, stat0, stat1, strict=False)},
        "timing_cpu_interrupts": dict(sorted(irq_delta.items(), key=lambda kv: -kv[1])[:8]),
    }
    t, m, a, la, pr = res["tiny"], res["medium"], res["alloc"], res["launch"], res["probe"]
    print(
        f"{name:19s} tiny {t['calls']:7d} calls, median {1000 * t.get('median_ms', 0):.1f} us, "
        f"stalled {t.get('stalled_per_1000', 0):6.2f}/1000 "
        f"{t.get('causes', {})}, disturbed {t.get('disturbed_per_1000', 0):6.2f}/1000 "
        f"| medium stalled {m.get('stalled_per_1000', 0):6.2f}/1000 {m.get('causes', {})} "
        f"| alloc median {a.get('median_ms', 0):.3f} ms p99 {a.get('p99_ms', 0):.3f} max {a.get('max_ms', 0):.2f}, "
        f"stalled {a.get('stalled_per_1000', 0):6.1f}/1000 {a.get('causes', {})} "
        f"| launch median {la.get('median_ms', 0):.3f} ms max {la.get('max_ms', 0):.2f}, "
        f"stalled {la.get('stalled_per_1000', 0):6.1f}/1000 {la.get('causes', {})} "
        f"| CPU probe median {pr['median_us']} us max {pr['max_us']} us, slow {pr['slow_per_1000']:.2f}/1000 "
        f"| cpu{timing_cpu} irq+softirq {res['timing_cpu_jiffies']['irq'] + res['timing_cpu_jiffies']['softirq']} "
        f"sys {res['timing_cpu_jiffies']['system']} steal {res['timing_cpu_jiffies']['steal']} | work {done}",
        flush=True,
    )
    return res


def default_count(activity: str, rest: set) -> int:
    return {
        "cpu_python": 2 * len(rest), "cpu_shared": 2 * len(rest) + 2, "process_churn": 6, "cuda_context": 4,
        "alloc_free": 2, "gpu_kernels": 1, "library_first_use": 4, "compile_first_call": 3, "nvcc": 4,
        "load_extension": 4, "nvidia_smi": 4, "file_io": 2, "memory": 2, "resident_contexts": 30,
    }[activity]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="timing per activity")
    ap.add_argument("--ramp", type=float, default=2.0, help="seconds the interferers run before timing starts")
    ap.add_argument("--activities", nargs="*", default=list(ACTIVITIES), choices=ACTIVITIES)
    ap.add_argument("--cpu", action="store_true", help="time on the CPU (a smoke test without a GPU)")
    ap.add_argument("--ext", nargs="*", default=[], help="built torch extension modules (.so) for load_extension")
    ap.add_argument("--isolate-system", action="store_true", help="then isolate the timing CPU machine-wide (root)")
    ap.add_argument("--json")
    ap.add_argument("--interfere", help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.interfere:
        print(interfere(args.interfere, args.until, args.ext, args.cpu), flush=True)
        return 0

    cpus = set(os.sched_getaffinity(0))
    timing, rest = timingcpus.core_plan(cpus, 1, min_cpus=2)
    if not timing:
        sys.exit("bench_stalls: needs at least two CPUs")
    timing_cpu = timing[0]
    timingcpus._set_process_affinity(rest)  # as the workflow: every process it starts stays off
    import torch

    if not args.cpu:
        torch.empty(1, device="cuda")  # the context (and its threads) off the timing CPU
    if not args.ext and not args.cpu and "load_extension" in args.activities + ["all"]:
        lib = build_library(Path(tempfile.mkdtemp(prefix="bench-ext-")))
        args.ext = [lib] if lib else []
    print(f"timing CPU {timing_cpu}; {len(rest)} other CPUs; {'host timer' if args.cpu else 'CUDA events'}; "
          f"torch {torch.__version__}; {os.uname().release}", flush=True)
    phases = [run_phase(a, args, timing_cpu, rest) for a in args.activities if not (args.cpu and a in NEEDS_GPU)]
    isolation = None
    if args.isolate_system:
        isolation = timingcpus.isolate_system([timing_cpu])
        print(f"isolate_system: {isolation}", flush=True)
        for a in ("idle", "all"):
            res = run_phase(a, args, timing_cpu, rest)
            res["activity"] = f"{a} (system isolated)"
            phases.append(res)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "timing_cpu": timing_cpu, "cpus": len(cpus), "kernel": os.uname().release, "torch": torch.__version__,
            "seconds": args.seconds, "system_isolation": isolation, "phases": phases,
        }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
