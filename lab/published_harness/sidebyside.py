"""Both harnesses on one GPU in alternating blocks, two passes each, within a deadline.

    python3 lab/published_harness/sidebyside.py --n 16 --block 6 --deadline $(( $(date +%s) + 480 ))
    (lab/published_harness/gpu_run.sh calls it on a bare GPU node)

The task list (``--first`` ids, then the rest of ``--tasks``, the first ``--n``) is cut into
blocks. Each block runs four segments: the published harness (:mod:`run`, one process per
task, unpinned as a user runs it) and the workflow (``python -m snakemake`` on the block's time
results, default profile), then both again, each into a tree of its own pass (``PREFIX-pub1``,
``PREFIX-wf1``, ``PREFIX-pub2``, ``PREFIX-wf2``). ``--pinned-cpus`` adds a third arm, the
published harness pinned to those CPUs (``PREFIX-pin1``, ``-pin2``): six segments a block. The
arm that goes first rotates from block to block, so a slow drift of the host falls on all alike.
Tasks whose results are in every tree are
left out, so the same command continues an earlier call's trees. The ordered list is recorded
beside the trees (``PREFIX-tasks.txt``); a call without ``--tasks`` continues that list (the slice
where there is none), so continuing never mixes another list into the trees unasked.

A block starts only when its estimated time fits before ``--deadline`` (priors from the
published harness's ~12 s a task and the workflow's per-call start; each harness's estimate is
scaled by what its segments took so far, those of ``LOG_DIR/timeline.tsv`` from earlier passes and
calls included); a segment that starts is cut at the deadline (the
published harness records nothing for the task it cuts; the workflow is stopped with SIGINT and
keeps what finished). Every segment's start, end and task count go to ``LOG_DIR/timeline.tsv``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    from . import run
except ImportError:  # run as a script
    import run

#: The task list where neither ``--tasks`` nor a recorded list gives one.
SLICE = "config/slices/h100_slice41.yaml"
#: The ten tasks of the first side-by-side run (issue 40), the three far apart first.
FIRST = ("L1_T012", "L1_T019", "L2_T001", "L1_T040", "L3_T001", "L2_T012", "L3_T020", "L3_T031", "L3_T039", "L2_T040")

#: Priors of the time estimate (seconds), from a first run on an H100 (2026-12-06; L1_T012,
#: L1_T019, L2_T001: published 44 s and 32 s for its two passes, the workflow 35 s a pass): the
#: published harness per task and per task whose code can build an extension, on its first
#: pass (a failing build is retried at each of its 10 executions of the code: ~25 s); the
#: workflow per call (snakemake, workers' start), per task, and per call with extensions to
#: build (built in parallel: one build's time). Conservative: that run took 0.7 × the estimate.
PRIOR = {"pub_task": 6.0, "pub_build": 25.0, "wf_call": 20.0, "wf_task": 4.0, "wf_build": 25.0}
#: The workflow is sent SIGINT at the deadline and killed this much later.
WF_GRACE_S = 25


def ordered_tasks(first, listed, n: int | None) -> list[str]:
    """The tasks of ``listed`` that are in ``first``, in ``first``'s order, then the rest of
    ``listed``; the first ``n``."""
    out = list(dict.fromkeys([t for t in first if t in set(listed)] + list(listed)))
    return out[:n] if n else out


def blocks(tids: list[str], size: int) -> list[list[str]]:
    return [tids[i : i + size] for i in range(0, len(tids), max(1, size))]


#: The arms of a run: the published harness as a user runs it (unpinned unless ``--pub-cpus``)
#: and the workflow; with ``--pinned-cpus``, the published harness pinned to those CPUs as well.
ARMS = ("pub", "wf")
ARMS_PINNED = ("pub", "pin", "wf")


def arms(args) -> tuple[str, ...]:
    return ARMS_PINNED if getattr(args, "pinned_cpus", None) else ARMS


def trees(prefix: str, harnesses=ARMS) -> dict[tuple[str, int], str]:
    """{(harness, pass): results_dir}."""
    return {(h, p): f"{prefix}-{h}{p}" for p in (1, 2) for h in harnesses}


def pending(tids, prefix: str, device: str, modes, passes=(1, 2), harnesses=ARMS) -> list[str]:
    """The tasks some tree of ``passes`` lacks a result of (a mode's time result)."""
    roots = [root for (_, pss), root in trees(prefix, harnesses).items() if pss in passes]
    return [t for t in tids if not all(run.result_path(root, device, m, t).exists() for root in roots for m in modes)]


def segment_order(index: int, passes=(1, 2), harnesses=ARMS) -> list[tuple[str, int]]:
    """The segments of block ``index`` (every arm, each pass of ``passes``): the arm that goes
    first rotates from block to block (with two arms: alternates)."""
    k = index % len(harnesses)
    first = tuple(harnesses[k:]) + tuple(harnesses[:k])
    return [(h, pss) for pss in passes for h in first]


def program(harness: str) -> str:
    """The program an arm runs (``pin`` is the published harness, pinned): the estimate's key."""
    return "pub" if harness == "pin" else harness


class Estimate:
    """Seconds a segment is expected to take: the priors, scaled per harness by measured/predicted."""

    def __init__(self, prior=None):
        self.prior = dict(PRIOR if prior is None else prior)
        self.predicted = {"pub": 0.0, "wf": 0.0}
        self.measured = {"pub": 0.0, "wf": 0.0}

    def raw(self, harness: str, n: int, n_build: int, first_pass: bool) -> float:
        p = self.prior
        if harness == "pub":
            return n * p["pub_task"] + (n_build * p["pub_build"] if first_pass else 0.0)
        return p["wf_call"] + n * p["wf_task"] + (p["wf_build"] if n_build else 0.0)

    def factor(self, harness: str) -> float:
        if self.predicted[harness] <= 0:
            return 1.0
        return min(3.0, max(0.5, self.measured[harness] / self.predicted[harness]))

    def seconds(self, harness: str, n: int, n_build: int, first_pass: bool) -> float:
        return self.raw(harness, n, n_build, first_pass) * self.factor(harness)

    def record(self, harness: str, n: int, n_build: int, first_pass: bool, took: float) -> None:
        self.predicted[harness] += self.raw(harness, n, n_build, first_pass)
        self.measured[harness] += took


def selector(tid: str) -> str:
    """``L1_T012`` → ``1/12`` (the workflow's ``tasks:`` entries)."""
    level, task = tid.split("_")
    return f"{int(level[1:])}/{int(task[1:])}"


def run_published(block_tids, tree, args, deadline: float, log, cpus=None) -> None:
    """The published harness on the block (in this process; one child process per task), its
    processes pinned to ``cpus`` where given."""
    argv = ["--release", args.release, "--harness", args.harness, "--tasks", ",".join(block_tids),
            "--modes", ",".join(args.modes), "--out", tree, "--device", args.device,
            "--timeout", str(args.task_timeout), "--deadline", str(deadline)]
    if args.any_harness:
        argv.append("--any-harness")
    if cpus:
        argv += ["--cpus", cpus]
    if args.ext_dir:
        argv += ["--ext-dir", args.ext_dir]
    log.write(f"$ run.py {' '.join(argv)}\n")
    log.flush()
    stdout = sys.stdout
    try:
        sys.stdout = log
        run.main(argv)
    finally:
        sys.stdout = stdout


def run_workflow(block_tids, all_tids, tree, args, deadline: float, log) -> int:
    """The workflow on the block's time results (default profile); SIGINT at the deadline."""
    targets = [f"{tree}/{args.device}/time/paper/{m}/{t}.json" for t in block_tids for m in args.modes]
    cmd = [sys.executable, "-m", "snakemake", *targets, "--config", f"device={args.device}",
           f"release_dir={args.release_dir}", f"results_dir={tree}",
           "tasks=" + json.dumps([selector(t) for t in all_tids]), "modes=" + json.dumps(list(args.modes)),
           *args.wf_config]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        log.write("sidebyside: deadline reached: SIGINT to the workflow\n")
        log.flush()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            return proc.wait(timeout=WF_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def builds(tids, tasks) -> int:
    """How many of ``tids`` compile an inline extension (the workflow's own test)."""
    from l1bench.results import builds_extensions

    return sum(1 for t in tids if tasks[t].custom_code and builds_extensions(tasks[t].custom_code))


def learn_from_timeline(est: Estimate, tsv: Path, tasks) -> None:
    """Teach ``est`` what the segments already in ``tsv`` took: an earlier pass or call of the same
    trees (``KEEP=1``, or gpu_run.sh's next ``PASSES`` group) on the same node."""
    lines = tsv.read_text().splitlines()[1:] if tsv.exists() else []
    for line in lines:
        cells = line.split("\t")
        if len(cells) < 7 or cells[1] not in ARMS_PINNED or not cells[6]:
            continue
        blk = cells[3].split(",")
        n_build = builds([b for b in blk if b in tasks], tasks)
        est.record(program(cells[1]), len(blk), n_build, cells[2] == "1", float(cells[6]))


def task_list(args) -> list[str]:
    """The ordered task list of this call, recorded in ``PREFIX-tasks.txt``: ``--tasks`` where
    given, else the list recorded by an earlier call of the same trees, else the slice."""
    record = Path(f"{args.prefix}-tasks.txt")
    if args.tasks is None and record.exists():
        tids = record.read_text().split()
        say(f"the task list recorded in {record}: {len(tids)} tasks")
        return tids[: args.n] if args.n else tids
    tids = ordered_tasks(args.first, run.task_ids(args.tasks or SLICE), args.n)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("\n".join(tids) + "\n")
    return tids


def drive(args, segment_runners=None, now=time.time) -> list[dict]:
    """Run the blocks; returns the timeline (one dict per segment run or left out)."""
    runners = segment_runners or {"pub": run_published, "wf": run_workflow}
    tasks = run.load_tasks(args.release)
    all_tids = task_list(args)
    harnesses = arms(args)
    todo = pending(all_tids, args.prefix, args.device, args.modes, args.passes, harnesses)
    cpus = {"pub": args.pub_cpus, "pin": getattr(args, "pinned_cpus", None)}
    est = Estimate()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    timeline: list[dict] = []
    tsv = log_dir / "timeline.tsv"
    if not tsv.exists():
        tsv.write_text("block\tharness\tpass\ttasks\tstart\tend\tseconds\tnote\n")
    say(f"{len(all_tids)} tasks, {len(todo)} to run, blocks of {args.block}; "
        f"{args.deadline - now():.0f} s to the deadline")
    if args.prebuild and args.ext_dir and todo:
        t0 = now()
        run.prebuild(tasks, todo, args.ext_dir, args.prebuild)
        say(f"the published harness's extensions of {len(todo)} tasks built, {args.prebuild} at a time, "
            f"in {now() - t0:.0f} s")
        est.prior = est.prior | {"pub_build": 2.0}
    learn_from_timeline(est, tsv, tasks)
    for index, blk in enumerate(blocks(todo, args.block)):
        # Each segment runs the block's tasks its own tree lacks: a segment an earlier call's
        # deadline cut short leaves the other trees' results of those tasks standing.
        order = [(h, p, missing) for h, p in segment_order(index, args.passes, harnesses)
                 if (missing := pending(blk, args.prefix, args.device, args.modes, (p,), (h,)))]
        need = sum(est.seconds(program(h), len(m), builds(m, tasks), p == 1) for h, p, m in order)
        left = args.deadline - now()
        if need > left:
            say(f"block {index + 1} ({', '.join(blk)}): needs ~{need:.0f} s, {left:.0f} s left: stopped here")
            timeline.append({"block": index + 1, "note": f"not started: needs ~{need:.0f} s, {left:.0f} s left"})
            break
        for harness, pss, seg in order:
            tree = trees(args.prefix, harnesses)[(harness, pss)]
            t0 = now()
            with open(log_dir / f"{harness}{pss}-block{index + 1}.log", "a") as log:
                if harness == "wf":
                    runners["wf"](seg, all_tids, tree, args, args.deadline, log)
                else:
                    runners["pub"](seg, tree, args, args.deadline, log, cpus=cpus[harness])
            took = now() - t0
            est.record(program(harness), len(seg), builds(seg, tasks), pss == 1, took)
            row = {"block": index + 1, "harness": harness, "pass": pss, "tasks": ",".join(seg), "start": round(t0),
                   "end": round(now()), "seconds": round(took, 1), "note": ""}
            timeline.append(row)
            with open(tsv, "a") as fh:
                fh.write("\t".join(str(row[k]) for k in ("block", "harness", "pass", "tasks", "start", "end",
                                                          "seconds", "note")) + "\n")
            say(f"block {index + 1} {harness} pass {pss}: {len(seg)} tasks in {took:.0f} s")
    return timeline


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] sidebyside: {text}", flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deadline", type=float, required=True, help="Unix time by which every segment has ended")
    ap.add_argument("--n", type=int, help="only the first N tasks of the ordered list")
    ap.add_argument("--block", type=int, default=6, help="tasks per block")
    ap.add_argument("--passes", default="1,2", help="the passes each block runs: 1,2 (both, the default), 1 or 2")
    ap.add_argument("--tasks", help=f"YAML tasks: list, or ids (default: the list recorded beside the trees, "
                                    f"else {SLICE})")
    ap.add_argument("--first", default=",".join(FIRST), help="ids put first where listed (comma-separated)")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--release-dir", default=".release", help="a copy of the upstream repository (release, eval/)")
    ap.add_argument("--release", help="default: RELEASE_DIR/optimized_cuda_code/DEVICE.json")
    ap.add_argument("--harness", help="default: RELEASE_DIR/eval/eval_cuda.py")
    ap.add_argument("--any-harness", action="store_true")
    ap.add_argument("--modes", default="default", help="comma-separated modes")
    ap.add_argument("--prefix", default="results/sbs", help="trees PREFIX-pub1, -wf1, -pub2, -wf2")
    ap.add_argument("--task-timeout", type=float, default=240, help="seconds per task in the published harness")
    ap.add_argument("--log-dir", default="logs/sbs")
    ap.add_argument("--pub-cpus", help="pin the published harness's processes to these CPUs (run.py --cpus); "
                                       "default: unpinned, as a user runs it")
    ap.add_argument("--pinned-cpus", help="a third arm: the published harness again, pinned to these CPUs, into "
                                          "trees PREFIX-pin1, -pin2 (e.g. 15, the CPU the workflow times on)")
    ap.add_argument("--ext-dir", help="the published harness's TORCH_EXTENSIONS_DIR per task: EXT_DIR/<tid>")
    ap.add_argument("--prebuild", type=int, default=0, metavar="N",
                    help="with --ext-dir: build every task's extensions for the published harness first, N at a time")
    ap.add_argument("--wf-config", action="append", default=[], metavar="KEY=VALUE",
                    help="more --config for the workflow, e.g. 'paper={outer_trials: 3}' (repeatable)")
    args = ap.parse_args(argv)
    args.first = [t for t in args.first.split(",") if t.strip()]
    args.modes = [m for m in args.modes.split(",") if m.strip()]
    args.passes = tuple(int(x) for x in args.passes.split(",") if x.strip())
    args.release = args.release or f"{args.release_dir}/optimized_cuda_code/{args.device}.json"
    args.harness = args.harness or f"{args.release_dir}/eval/eval_cuda.py"
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    drive(args)
    return 0


if __name__ == "__main__":
    if not __package__:
        sys.path.append(str(Path(__file__).resolve().parents[2] / "src"))
    sys.exit(main())
