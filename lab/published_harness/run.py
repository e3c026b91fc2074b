"""Run CUDA-L1's published harness (``eval/eval_cuda.py``, unmodified) on a task list, one task
and mode per process, and write a results tree the comparison tools read like the workflow's.

    python lab/published_harness/run.py --release .release/optimized_cuda_code/h100.json \\
        --harness .release/eval/eval_cuda.py --tasks config/slices/h100_slice41.yaml \\
        --modes default --out results/sbs-pub1 --device h100
    (or: python -m lab.published_harness.run ...)

The harness file comes from ``--harness PATH`` or, without it, is fetched from the pinned
upstream commit; either way its sha256 must be :data:`HARNESS_SHA256` (``--any-harness``
accepts another, and records its hash). It is never committed (MIT, upstream's).

For each task and mode a fresh ``python child.py JOB`` calls the harness's ``eval_pipeline``
with the arguments of its own ``eval()`` (10 correctness trials, 7 outer × 10 timed pairs, GPU
0); :mod:`child` records what happens. The parent turns the records into
``OUT/<device>/time/paper/<mode>/<tid>.json`` (written atomically, one file per task and mode,
so a failing task never loses another's): ``status`` and ``reason`` in the workflow's terms,
``score``, ``trial_scores``, ``ref_ms``/``custom_ms`` (per outer trial, every timed pair),
``verdict``, ``harness_error`` (the harness's own message), ``extensions`` (each inline
extension: built or not, the compiler's first error) and ``harness: published``. The child's
output, events and the harness's own log stay under ``OUT/<device>/harness_logs/<mode>/<tid>/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The harness at CUDA-L1's pinned commit (the release's commit).
HARNESS_COMMIT = "51e8356bf844101cab2aeeca4bdff47ebb1953b8"
HARNESS_URL = f"https://raw.githubusercontent.com/deepreinforce-ai/CUDA-L1/{HARNESS_COMMIT}/eval/eval_cuda.py"
HARNESS_SHA256 = "e67846011f09ce63de8ab05e9464868541944060efcf4bce635eec9580cd51e1"

#: The workflow's modes and the harness's ``original_eval_setup`` for each (its ``eval()``):
#: cuda_graph and cudnn time the custom code against the release's baseline snippet.
SETUPS = {
    "default": "vanilla",
    "torch_compile": "torch_compile",
    "torch_compile_reduce_overhead": "torch_compile_reduce_overhead",
    "cuda_graph": "cuda_graph",
    "cudnn": "cudnn",
}

def baseline_field(mode: str) -> str | None:
    """The release field of ``mode``'s own baseline snippet (``l1bench.modes``), or None."""
    from l1bench.modes import BY_NAME

    return BY_NAME[mode].baseline


#: The arguments the harness's own ``eval()`` passes to ``eval_pipeline``.
PIPELINE_ARGS = {"num_correct_trials": 10, "num_perf_trials": 10, "global_n_trials": 7, "gpu_index": 0}
#: The same, in the workflow's ``paper:`` terms (``params`` of a result), for the comparison
#: tools (an early stop shows as fewer trial scores than ``outer_trials``).
PARAMS = {"seed": 42, "correctness_trials": 10, "atol": 0.01, "rtol": 0.01, "warmup": 3, "outer_trials": 7,
          "inner_trials": 10, "early_stop_below": 0.3}


# --------------------------------------------------------------------------- inputs


def sha256_file(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def harness_file(path, cache_dir, any_hash: bool = False) -> tuple[Path, str]:
    """(the harness file, its sha256): ``path``, or the pinned file fetched into ``cache_dir``.
    A hash other than :data:`HARNESS_SHA256` is an error unless ``any_hash``."""
    if path is None:
        path = Path(cache_dir) / f"eval_cuda-{HARNESS_COMMIT[:12]}.py"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(HARNESS_URL, timeout=60) as resp:
                data = resp.read()
            tmp = path.with_suffix(".part")
            tmp.write_bytes(data)
            tmp.replace(path)
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"harness {path}: file not found")
    digest = sha256_file(path)
    if digest != HARNESS_SHA256 and not any_hash:
        raise SystemExit(
            f"harness {path}: sha256 {digest} is not the pinned {HARNESS_SHA256} (--any-harness accepts it)"
        )
    return path, digest


def task_ids(spec: str) -> list[str]:
    """Task ids from a YAML file with a ``tasks:`` list, or from ``L1_T012,1/19,...``."""
    import yaml

    from l1bench import release as rel

    if Path(spec).is_file():
        data = yaml.safe_load(Path(spec).read_text()) or {}
        items = data.get("tasks")
        if not isinstance(items, list):
            raise SystemExit(f"{spec}: no 'tasks:' list")
    else:
        items = [s for s in spec.replace(" ", ",").split(",") if s]
    out = []
    for item in items:
        try:
            out.append(rel.task_id(*rel.parse_task_selector(item)))
        except rel.ReleaseError as err:
            raise SystemExit(str(err)) from None
    return list(dict.fromkeys(out))


def load_tasks(release_path) -> dict:
    """{tid: l1bench.release.Task} of a release file, as the product parses it (the file's own
    baseline fields, as the harness's ``eval()`` reads them)."""
    from l1bench import release as rel

    return {t.tid: t for t in rel.load_release(release_path)}


# --------------------------------------------------------------------------- one task


def result_path(root, device: str, mode: str, tid: str) -> Path:
    return Path(root) / device / "time" / "paper" / mode / f"{tid}.json"


def log_dir(root, device: str, mode: str, tid: str) -> Path:
    return Path(root) / device / "harness_logs" / mode / tid


def read_jsonl(path) -> list[dict]:
    """The JSON objects of a JSON-lines file; a torn last line (a killed writer) is left out."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def run_child(job: dict, job_dir: Path, timeout_s: float, python: str = sys.executable,
              child: Path = HERE / "child.py", env: dict | None = None) -> dict:
    """Run :mod:`child` on ``job`` in a process group of its own; kill the group past
    ``timeout_s``. Returns {returncode, timed_out, wall_s}."""
    job_dir = Path(job_dir).resolve()  # the child runs in it: every path it is given is absolute
    job_dir.mkdir(parents=True, exist_ok=True)
    job_path = job_dir / "job.json"
    job_path.write_text(json.dumps(job, indent=1))
    t0 = time.time()
    with open(job_dir / "child.log", "w") as log:
        proc = subprocess.Popen([python, str(child), str(job_path)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=job_dir)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # interrupted (SIGINT, SIGTERM): the harness's process goes too
            _kill_group(proc)
            raise
    return {"returncode": proc.returncode, "timed_out": timed_out, "wall_s": round(time.time() - t0, 3)}


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def summarize_extensions(events: list[dict]) -> list[dict]:
    """Per inline extension (by name): calls, how many built, and the first failure's error."""
    by_name: dict[str, dict] = {}
    for ev in events:
        if ev.get("event") != "extension":
            continue
        ext = by_name.setdefault(ev["name"], {"extension": ev["name"], "calls": 0, "built": 0, "failed": 0,
                                              "error": None, "build_s": 0.0, "extensions_dir": ev.get("extensions_dir"),
                                              "build_directory": ev.get("build_directory"), "flags": ev.get("flags")})
        ext["calls"] += 1
        ext["build_s"] = round(ext["build_s"] + (ev.get("seconds") or 0.0), 3)
        if ev.get("ok"):
            ext["built"] += 1
        else:
            ext["failed"] += 1
            ext["error"] = ext["error"] or ev.get("error")
    for ext in by_name.values():
        ext["ok"] = ext["built"] > 0
    return list(by_name.values())


#: The harness's failure messages (eval_pipeline's return) → the workflow's statuses.
MESSAGE_STATUS = (
    ("Original model compilation failed", "baseline_error"),
    ("Failed to load original model", "baseline_error"),
    ("Failed to initialize original model", "baseline_error"),
    ("Custom model compilation failed", "load_error"),
    ("Failed to load custom model", "load_error"),
    ("Failed to initialize custom model", "runtime_error"),
    ("Error during validation", "runtime_error"),
    ("Shape mismatch", "incorrect"),
    ("Value mismatch", "incorrect"),
    ("Only ", "incorrect"),
    ("Runtime error in trial", "runtime_error"),
    ("CUDA is not available", "unsupported"),
    ("fail to inference", "runtime_error"),
    ("No trials completed successfully", "runtime_error"),
)


#: Messages that say the machine has no usable CUDA (not a verdict on the code).
NO_CUDA = ("not compiled with CUDA", "CUDA is not available", "No CUDA GPUs", "Found no NVIDIA driver")


def status_of(message: str, events: list[dict]) -> str:
    """The workflow's status for a harness failure ``message`` (what eval_pipeline returned)."""
    if any(m in message for m in NO_CUDA):
        return "unsupported"
    if any(ev.get("event") == "lazy" and ev.get("ok") is False for ev in events) and not any(
        ev.get("event") == "correctness" for ev in events
    ):
        if not message.startswith(("Error during validation", "Failed to load custom model")):
            return "lazy"
    for prefix, status in MESSAGE_STATUS:
        if message.startswith(prefix):
            if status == "load_error" and any(e.get("event") == "extension" and not e.get("ok") for e in events):
                return "compile_error"
            return status
    return "runtime_error"


def verdict_of(events: list[dict], status: str) -> str | None:
    """"pass" when the harness's correctness check passed, "fail" when it ran and failed (or
    the laziness check failed the output), None when the harness decided nothing about the
    output (it did not load, broke, or ran out of time first)."""
    for ev in events:
        if ev.get("event") == "correctness":
            return "pass" if ev.get("ok") else "fail"
    return "fail" if status == "lazy" else None


def record_from(job: dict, events: list[dict], harness_log: list[dict], proc: dict, timeout_s: float) -> dict:
    """The result of one task and mode from the child's events, the harness's log and how
    the child ended."""
    trials = [ev for ev in events if ev.get("event") == "trial" and "score" in ev]
    final = next((r for r in reversed(harness_log) if r.get("done")), None) or {}
    returned = next((ev for ev in events if ev.get("event") == "returned"), None)
    raised = next((ev for ev in events if ev.get("event") == "raised"), None)
    end = next((ev for ev in events if ev.get("event") == "end"), None)
    score = score_std = None
    trial_scores = [t["score"] for t in trials if t.get("score") is not None]
    message = ""
    if proc["timed_out"]:
        status, message = "timeout", f"ran past {timeout_s:g} s"
    elif returned is not None and returned.get("value") == 0 and final.get("score") is not None:
        status = "ok"
        score, score_std = float(final["score"]), final.get("std")
        trial_scores = trial_scores or list(final.get("scores") or [])
    elif returned is not None:
        value = returned.get("value")
        message = str(value[1]) if isinstance(value, list) and len(value) > 1 else f"returned {value!r}"
        status = status_of(message, events)
    elif raised is not None:
        status, message = "runtime_error", raised.get("error", "")
    else:
        status = "crashed"
        message = f"the harness's process ended with status {proc['returncode']} before eval_pipeline returned"
    ref_ms = [t.get("ref_ms") or [] for t in trials]
    custom_ms = [t.get("custom_ms") or [] for t in trials]
    flat_ref = [v for r in ref_ms for v in r]
    flat_cus = [v for r in custom_ms for v in r]
    extensions = summarize_extensions(events)
    env = (end or {}).get("environment") or {}
    started = next((ev["t"] for ev in events if ev.get("event") == "start"), None)
    out = {
        "kind": "time",
        "tid": job["tid"],
        "status": status,
        "reason": message,
        "mode": job["mode"],
        "protocol": "paper",
        "score": score,
        "score_std": score_std,
        "n_timings": len(flat_ref),
        "flags": [],
        "harness": "published",
        "harness_sha256": job["harness_sha256"],
        "harness_setup": job["setup"],
        "harness_error": message or None,
        "verdict": verdict_of(events, status),
        "trial_scores": trial_scores,
        "trial_seeds": [t.get("seed") for t in trials],
        "ref_ms": [[round(v, 5) for v in r] for r in ref_ms],
        "custom_ms": [[round(v, 5) for v in r] for r in custom_ms],
        # per pair: whether the reference was timed first (the harness's random order)
        "ref_first": [t.get("ref_first") or [] for t in trials],
        "ref_ms_mean": statistics.fmean(flat_ref) if flat_ref else None,
        "custom_ms_mean": statistics.fmean(flat_cus) if flat_cus else None,
        "extensions": extensions,
        # the workflow's field (l1bench.extensions reads it): extensions that never built
        "extension_failures": [{"extension": e["extension"], "error": e["error"]} for e in extensions if not e["ok"]],
        "steps": [{k: v for k, v in ev.items() if k in ("event", "caller", "ok", "error", "seconds")}
                  for ev in events if ev.get("event") in ("execute", "lazy", "correctness")],
        "params": dict(PARAMS),
        "provenance": env | {"started_unix": started, "wall_s": proc["wall_s"], "returncode": proc["returncode"]},
    }
    if any(not e["ok"] for e in extensions):
        out["flags"].append({"flag": "EXTENSION_BUILD_FAILED",
                             "reason": "; ".join(f"{e['extension']}: {e['error']}" for e in extensions if not e["ok"])})
    return out


def extensions_env(ext_root, tid: str) -> dict | None:
    """The child's environment: the task's own ``TORCH_EXTENSIONS_DIR`` under ``ext_root`` (None:
    torch's default folder, shared by every task)."""
    if not ext_root:
        return None
    return os.environ | {"TORCH_EXTENSIONS_DIR": str(Path(ext_root).resolve() / tid)}


def prebuild(tasks: dict, tids, ext_root, workers: int, timeout_s: float = 300,
             python: str = sys.executable, child: Path = HERE / "child.py") -> dict:
    """Run each task's custom code once, ``workers`` at a time, each into its task's
    ``TORCH_EXTENSIONS_DIR`` under ``ext_root``, so that the harness's own runs find the
    extensions built (the harness then only loads them; a build that fails fails again there).
    Returns {tid: wall seconds}."""
    from concurrent.futures import ThreadPoolExecutor

    def one(tid):
        task = tasks[tid]
        job_dir = Path(ext_root) / "_jobs" / tid
        if not task.custom_code or any(e.get("event") == "built" for e in read_jsonl(job_dir / "events.jsonl")):
            return tid, 0.0  # no code, or built by an earlier call
        job = {"tid": tid, "mode": "build", "build_only": True, "custom_src": task.custom_code,
               "events_path": str((job_dir / "events.jsonl").resolve())}
        took = run_child(job, job_dir, timeout_s, python, child, extensions_env(ext_root, tid))["wall_s"]
        (job_dir / "job.json").unlink(missing_ok=True)  # the release's code is not kept
        return tid, took

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return dict(pool.map(one, tids))


def run_task(task, mode: str, out_root, device: str, harness: Path, harness_sha: str, timeout_s: float,
             cpus=None, python: str = sys.executable, child: Path = HERE / "child.py",
             record_timeout: bool = True, ext_root=None) -> dict | None:
    """Time ``task`` (a :class:`l1bench.release.Task`) in ``mode`` through the harness in a
    fresh process and write its result atomically; returns the result. A run killed at
    ``timeout_s`` is a ``timeout`` result, unless ``record_timeout`` is false (the run's own
    deadline cut it, not the task's limit): then nothing is written and None returned."""
    from l1bench.io import atomic_write_json, atomic_write_text

    tid = task.tid
    base = {"tid": tid, "mode": mode, "harness_sha256": harness_sha, "setup": SETUPS[mode]}
    if task.custom_code is None:
        res = no_run(base, "no_code", "CUDA-L1 does not yield performance boost on this task on this gpu architecture.")
    elif baseline_field(mode) and task.baselines.get(mode) is None:
        res = no_run(base, "no_baseline", f"the release has no {baseline_field(mode)} for this task")
    else:
        ldir = log_dir(out_root, device, mode, tid)
        if ldir.exists():
            for old in ("events.jsonl", "harness_log.jsonl"):
                (ldir / old).unlink(missing_ok=True)
        ldir.mkdir(parents=True, exist_ok=True)
        original = task.baselines[mode] if baseline_field(mode) else task.ref_code
        job = base | PIPELINE_ARGS | {
            "harness": str(Path(harness).resolve()),
            "warmup_src": task.ref_code,
            "original_src": original,
            "custom_src": task.custom_code,
            "events_path": str((ldir / "events.jsonl").resolve()),
            "log_path": str((ldir / "harness_log.jsonl").resolve()),
            "cpus": cpus,
        }
        proc = run_child(job, ldir, timeout_s, python=python, child=child, env=extensions_env(ext_root, tid))
        if proc["timed_out"] and not record_timeout:
            (ldir / "job.json").unlink(missing_ok=True)
            return None
        harness_log = read_jsonl(ldir / "harness_log.jsonl")
        res = record_from(job, read_jsonl(ldir / "events.jsonl"), harness_log, proc, timeout_s)
        # the release's code is not kept in the tree: the job, and the log's copy of the code
        (ldir / "job.json").unlink(missing_ok=True)
        if harness_log:
            text = "".join(json.dumps({k: v for k, v in r.items() if k != "code"}) + "\n" for r in harness_log)
            atomic_write_text(ldir / "harness_log.jsonl", text)
    atomic_write_json(result_path(out_root, device, mode, tid), res)
    return res


def no_run(base: dict, status: str, reason: str) -> dict:
    return {"kind": "time", "tid": base["tid"], "status": status, "reason": reason, "mode": base["mode"],
            "protocol": "paper", "score": None, "score_std": None, "n_timings": 0, "flags": [],
            "harness": "published", "harness_sha256": base["harness_sha256"], "harness_setup": base["setup"],
            "verdict": None, "trial_scores": [], "params": dict(PARAMS)}


# --------------------------------------------------------------------------- command line

#: With ``--deadline``, no task starts with less than this many seconds left.
MIN_TASK_S = 20


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True, help="the release file (optimized_cuda_code/<device>.json)")
    ap.add_argument("--harness", help="eval_cuda.py (default: fetched from the pinned commit into --cache)")
    ap.add_argument("--any-harness", action="store_true", help="accept a harness whose sha256 is not the pinned one")
    ap.add_argument("--cache", default=".cache/published_harness", help="where a fetched harness is kept")
    ap.add_argument("--tasks", required=True, help="a YAML file with a tasks: list, or ids (L1_T012,1/19,...)")
    ap.add_argument("--limit", type=int, help="only the first N tasks")
    ap.add_argument("--modes", default="default", help="comma-separated: " + ", ".join(SETUPS))
    ap.add_argument("--out", required=True, help="results tree (OUT/<device>/time/paper/<mode>/<tid>.json)")
    ap.add_argument("--device", default="h100", help="the release's device (the tree's device folder)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per task and mode (the process is killed)")
    ap.add_argument("--cpus", help="pin the harness's process to these CPUs (e.g. 15 or 8-15)")
    ap.add_argument("--redo", action="store_true", help="run tasks whose result exists too")
    ap.add_argument("--deadline", type=float, help="Unix time: start no task after it; a task it cuts is not recorded")
    ap.add_argument("--ext-dir", help="each task's TORCH_EXTENSIONS_DIR: EXT_DIR/<tid> (default: torch's, shared)")
    ap.add_argument("--prebuild", type=int, default=0, metavar="N",
                    help="with --ext-dir: run every task's custom code once first, N at a time (its builds)")
    return ap.parse_args(argv)


def cpu_list(spec: str | None):
    if not spec:
        return None
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the command: SIGTERM stops it like SIGINT, the harness's process with it
        signal.signal(signal.SIGTERM, _interrupted)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in SETUPS]
    if bad:
        raise SystemExit(f"--modes: unknown {', '.join(bad)} (expected {', '.join(SETUPS)})")
    harness, digest = harness_file(args.harness, args.cache, args.any_harness)
    tasks = load_tasks(args.release)
    tids = task_ids(args.tasks)[: args.limit]
    missing = [t for t in tids if t not in tasks]
    if missing:
        raise SystemExit(f"{args.release}: no task {', '.join(missing)}")
    if args.prebuild and args.ext_dir:
        t0 = time.time()
        took = prebuild(tasks, tids, args.ext_dir, args.prebuild)
        print(f"prebuilt {len(took)} tasks, {args.prebuild} at a time, in {time.time() - t0:.0f} s", flush=True)
    for tid in tids:
        for mode in modes:
            if result_path(args.out, args.device, mode, tid).exists() and not args.redo:
                print(f"{tid} {mode}: result exists, kept", flush=True)
                continue
            t0 = time.time()
            timeout = args.timeout
            if args.deadline is not None:
                left = args.deadline - t0
                if left < MIN_TASK_S:
                    print(f"deadline: {left:.0f} s left, {tid} {mode} and what follows not started", flush=True)
                    return 0
                timeout = min(timeout, left)
            res = run_task(tasks[tid], mode, args.out, args.device, harness, digest, timeout, cpu_list(args.cpus),
                           record_timeout=timeout == args.timeout, ext_root=args.ext_dir)
            if res is None:
                print(f"{tid} {mode}: cut by the deadline, not recorded [{time.time() - t0:.1f} s]", flush=True)
                return 0
            score = f" {res['score']:.3f}" if res.get("score") is not None else ""
            why = f" ({res['reason'][:100]})" if res.get("reason") else ""
            print(f"{tid} {mode}: {res['status']}{score}{why} [{time.time() - t0:.1f} s]", flush=True)
    return 0


if __name__ == "__main__":
    if not __package__:  # run as a script: the repository's l1bench from src/ unless installed
        sys.path.append(str(HERE.parents[1] / "src"))
    sys.exit(main())
