"""The demo release through the SLURM profile (profiles/slurm), on a real single-node SLURM.

Opt-in: ``L1_SLURM_TEST=1 python -m pytest tests/test_slurm.py`` as root (CI does). It installs
slurm-wlm, slurmdbd, munge and mariadb-server from Debian's packages where missing, starts a
one-node cluster (tests/slurm_local.py: slurmctld, slurmd in its own PID/UTS namespaces so
its jobs run as on another host, slurmdbd on a private MariaDB so sacct lists every job,
partitions ``cpu`` and ``gpu``, fake GPUs as GRES) and stops it afterwards. Without root, or
where the packages cannot be installed, it skips with one line.

The same demo runs twice from two copies of the workflow: locally (the default profile) and
through SLURM, both on a selection of its tasks and modes (DEMO_CONFIG) that holds every kind of
job the profile runs: a build, a check and a time job that succeed, a task whose check fails
(its time jobs report it), the hanging and crashing tasks (their checks break and are retried),
a task without code, eager modes (served by the task worker) and a torch.compile mode (a process
per job). Both runs time on the CPU, so their scores differ from run to run; the test
compares what must not differ: the set of results and every status (build, check, time, the
reference scan's verdicts, the attempts ledgers of the two broken tasks, and the rows and
statuses of scores.csv), never a timing number. The demo's hanging and crashing tasks fail
their jobs in both runs alike.
"""

import csv
import json
import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import SNAKEMAKE, copy_workflow, missed_hand_offs, step_results, tree_digest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ENABLE_ENV = "L1_SLURM_TEST"
GPU_RULES = {"check_task", "time_task"}
BROKEN = ("L1_T005", "L1_T006")  # the demo's hanging and crashing tasks
#: the demo's tasks that run (L1_T001 ...): correct and faster, correct and slower, incorrect, hangs,
#: crashes, no code; and its modes: one eager, one torch.compile
TASKS = ["1/1", "1/2", "1/3", "1/5", "1/6", "1/7"]
MODES = ["default", "torch_compile"]
#: The hanging task holds the device lock until demo_section (10 s by default) runs out, three
#: times; legitimate demo sections hold it for well under a second.
DEMO_CONFIG = ["device=demo", f"tasks={json.dumps(TASKS)}", f"modes={json.dumps(MODES)}", "timeouts={demo_section: 4}"]
MAX_ATTEMPTS = 3  # config max_attempts: the broken checks' attempts within one run
#: The plugin checks job states every few seconds here (40 s by default), files appear at once.
FAST = ["--slurm-init-seconds-before-status-checks", "3", "--latency-wait", "5"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.environ.get(ENABLE_ENV) != "1":
        pytest.skip(
            f"SLURM end-to-end test off: set {ENABLE_ENV}=1 (as root; installs slurm-wlm, munge, mariadb with apt-get)"
        )
    import slurm_local

    try:
        c = slurm_local.start(tmp_path_factory.mktemp("slurm"))
    except slurm_local.SlurmUnavailable as err:
        pytest.skip(f"no SLURM here: {err}")
    yield c
    c.stop()


def snakemake(workdir, args, env=None, timeout=900):
    proc = subprocess.run(SNAKEMAKE + args, cwd=workdir, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})
    return proc, proc.stdout + proc.stderr


def slurm_args(*extra):
    return ["--workflow-profile", "profiles/slurm", *FAST, "--config", *DEMO_CONFIG, *extra]


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The demo run locally and through SLURM at the same time (each with a device lock of its
    own, so neither waits for the other's hanging task): each ends in one run, with its tables."""
    local, remote = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("remote")
    copy_workflow(local)
    copy_workflow(remote)
    local_env = {"L1BENCH_LOCK_DIR": str(tmp_path_factory.mktemp("lock-local"))}
    env = {**cluster.profile_env(), "L1BENCH_LOCK_DIR": str(tmp_path_factory.mktemp("lock-remote"))}
    took = {}

    def run(name, workdir, args, env):
        t0 = time.monotonic()
        took[name] = snakemake(workdir, args, env)
        print(f"demo {name}: {time.monotonic() - t0:.0f} s")

    beside = threading.Thread(target=run, args=("locally", local, ["--cores", "2", "--config", *DEMO_CONFIG],
                                                local_env))
    beside.start()
    try:
        run("through SLURM", remote, slurm_args(), env)
    finally:
        beside.join()
    (first, local_log), (s_first, s_log) = took["locally"], took["through SLURM"]
    print(f"sacct:\n{cluster.sacct_lines()}")
    return {"local": local, "remote": remote, "local_rc": first.returncode, "remote_rc": s_first.returncode,
            "logs": [s_log], "local_log": local_log, "env": env}


def statuses(root):
    """{result path: status} of every build, check and time result below results/demo."""
    res = Path(root) / "results/demo"
    return {
        str(p.relative_to(res)): json.loads(p.read_text())["status"]
        for stage in ("build", "check", "time")
        for p in sorted(res.glob(f"{stage}/**/*.json"))
    }


def ledgers(root):
    res = Path(root) / "results/demo/attempts"
    return {str(p.relative_to(res)): [a["kind"] for a in json.loads(p.read_text())["attempts"]]
            for p in sorted(res.rglob("*.json"))}


def score_rows(root):
    with open(Path(root) / "results/demo/scores.csv", newline="") as fh:
        return {(r["tid"], r["mode"], r["protocol"]): (r["status"], r["check_status"]) for r in csv.DictReader(fh)}


def scan_verdicts(root):
    scan = json.loads((Path(root) / "results/demo/reference_scan.json").read_text())
    return {tid: v["verdict"] for tid, v in scan.items()}


def submitted(log_text):
    """{SLURM job id: Snakemake job id} of every job the run submitted (its log)."""
    return {m[2]: m[1] for m in re.finditer(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log_text)}


def run_ids(log_text):
    return set(re.findall(r"SLURM run ID: (\S+)", log_text))


def test_demo_through_slurm_ends_as_the_local_run(runs):
    """Same results, same statuses, the broken tasks retried within the run the same way until
    their last attempt writes their terminal result."""
    local, remote = runs["local"], runs["remote"]
    assert runs["local_rc"] == 0 and runs["remote_rc"] == 0, runs["logs"][0][-3000:]
    want = statuses(local)
    n = len(TASKS)
    assert len(want) == n + n + n * len(MODES)  # builds, checks and time results of every task
    assert statuses(remote) == want
    assert {want[f"check/{t}.json"] for t in BROKEN} == {"timeout", "crashed"}
    assert ledgers(remote) == ledgers(local) == {}  # the terminal results replace the ledgers
    for tree in (local, remote):
        for tid in BROKEN:
            reason = json.loads((tree / f"results/demo/check/{tid}.json").read_text())["reason"]
            assert reason.startswith(f"broke in all {MAX_ATTEMPTS} attempts"), reason
    assert score_rows(remote) == score_rows(local) and len(score_rows(local)) == n * len(MODES)
    assert scan_verdicts(remote) == scan_verdicts(local)
    # each job is an allocation of its own: its task worker served its one step only; locally, a
    # task's step that came within its worker's idle time found that worker (which steps come
    # later depends on the load: in CI the local run shares the machine with the cluster)
    served = [w for _, r in step_results(remote / "results/demo") if (w := r.get("provenance", {}).get("task_worker"))]
    assert served and all(w["step"] == 1 and w["retired_after"].startswith("served 1 step") for w in served)
    assert not missed_hand_offs(local / "results/demo")


def test_every_job_went_through_sbatch(runs, cluster):
    """sacct lists one SLURM job per Snakemake job, each on its rule's partition; check and
    time jobs got a GPU (a fake one) and build jobs none."""
    logs = "\n".join(runs["logs"])
    ids = submitted(logs)
    records = [r for r in cluster.sacct() if r["JobName"] in run_ids(logs)]
    assert len(ids) == len(set(ids)) and {r["JobIDRaw"] for r in records} == set(ids)
    rules = Counter(re.match(r"rule_(\w+?)(_wildcards_.*)?$", r["Comment"]).group(1) for r in records)
    # every job the local run executed (a broken check once per attempt): no job ran outside SLURM
    ran = Counter(m for m in re.findall(r"^(?:rule|localrule) (\w+):", runs["local_log"], re.MULTILINE) if m != "all")
    retried = Counter({"check_task": len(BROKEN) * (MAX_ATTEMPTS - 1)})
    assert set(rules) == set(ran) and all(rules[k] == ran[k] for k in ran if k != "check_task"), (rules, ran)
    # a broken check's later attempts run as new submissions or inside its allocation (the job's own
    # Snakemake honours the rule's retries)
    n = len(TASKS)
    assert rules["build_task"] == n and rules["time_task"] == n * len(MODES)
    assert n <= rules["check_task"] <= n + retried["check_task"], rules
    for r in records:
        rule = re.match(r"rule_(\w+?)(_wildcards_|$)", r["Comment"]).group(1)
        gpu = rule in GPU_RULES
        assert r["Partition"] == (cluster.gpu_partition if gpu else cluster.cpu_partition), r
        assert ("gres/gpu=1" in r["AllocTRES"]) == gpu, r
    failed = {r["Comment"] for r in records if r["State"] != "COMPLETED"}
    assert failed <= {f"rule_check_task_wildcards_{t}" for t in BROKEN}  # only the broken checks' attempts


def _watch_and_interrupt(workdir, targets, done, log):
    """Cancel one job (scancel) and requeue another (as preemption does) while their workers
    run: a job counts as running once its log names the worker's command."""
    acted = {}
    deadline = time.monotonic() + 300
    while len(acted) < len(targets) and not done.is_set() and time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True, check=False).stdout
        for line in queue.splitlines():
            jobid, state, comment = (line.split("|") + ["", ""])[:3]
            for key, (action, job_log) in targets.items():
                if key in acted or state != "RUNNING" or not comment.endswith(key):
                    continue
                path = workdir / job_log
                if "l1bench.worker" in (path.read_text(errors="replace") if path.exists() else ""):
                    cmd = ["scancel", jobid] if action == "cancel" else ["scontrol", "requeue", jobid]
                    subprocess.run(cmd, check=True)
                    acted[key] = jobid
                    log.append(f"{' '.join(cmd)} ({key})")
        time.sleep(0.1)
    return acted


def test_a_cancelled_or_preempted_job_is_retried_and_nothing_is_lost(runs, cluster):
    """scancel of a running time job: Snakemake submits it again (retries: 1 in the profile);
    requeue of another (what preemption with PreemptMode=REQUEUE does; sbatch --requeue):
    SLURM starts it again. Both results come back with the statuses of the first run, every
    other result stays as it was, neither interruption counts as a broken attempt, and no
    worker outlives its job."""
    remote = runs["remote"]
    res = remote / "results/demo"
    redo = {"paper_torch_compile_L1_T001": "time/paper/torch_compile/L1_T001.json",
            "paper_torch_compile_L1_T002": "time/paper/torch_compile/L1_T002.json",
            "paper_default_L1_T001": "time/paper/default/L1_T001.json"}
    before = statuses(remote)
    for rel in redo.values():
        (res / rel).unlink()
    untouched = tree_digest(res, skip=("tasks", "tmp"))
    targets = {"paper_torch_compile_L1_T001": ("cancel", "logs/demo/time_task/paper/torch_compile/L1_T001.log"),
               "paper_torch_compile_L1_T002": ("requeue", "logs/demo/time_task/paper/torch_compile/L1_T002.log")}
    for _, job_log in targets.values():
        (remote / job_log).unlink(missing_ok=True)
    done, actions, acted = threading.Event(), [], {}
    watcher = threading.Thread(target=lambda: acted.update(_watch_and_interrupt(remote, targets, done, actions)))
    watcher.start()
    try:
        proc, out = snakemake(remote, [f"results/demo/{rel}" for rel in redo.values()] + slurm_args(), runs["env"],
                              timeout=600)
    finally:
        done.set()
        watcher.join()
    print("\n".join(actions), "\n", cluster.sacct_lines(duplicates=True))
    assert set(acted) == set(targets), (actions, out[-3000:])
    assert proc.returncode == 0, out[-3000:]
    assert statuses(remote) == before  # they come back, as they were
    after = tree_digest(res, skip=("tasks", "tmp"))
    assert {k: v for k, v in after.items() if k not in redo.values()} == untouched  # the rest as it was
    assert not (res / "attempts/time").exists()  # not attempts of the task
    records = {r["JobIDRaw"]: r for r in cluster.sacct(jobs=",".join(acted.values()), all_records=True)}
    cancelled = acted["paper_torch_compile_L1_T001"]
    assert cluster.sacct(jobs=cancelled)[0]["State"].startswith("CANCELLED")
    again = [r for r in cluster.sacct() if r["Comment"].endswith("paper_torch_compile_L1_T001")
             and r["JobName"] in run_ids(out)]
    assert [r["State"] for r in again] == [cluster.sacct(jobs=cancelled)[0]["State"], "COMPLETED"]
    requeued = [r["State"] for r in cluster.sacct(jobs=acted["paper_torch_compile_L1_T002"], all_records=True)]
    assert requeued == ["REQUEUED", "COMPLETED"], records
    assert not workers_of(remote)


def workers_of(folder):
    """Live worker processes (or their guards) of jobs submitted from ``folder``."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (d / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ("l1bench.worker" in cmd or "l1bench.pool.server" in cmd) and str(folder) in env:
            found.append((d.name, cmd[:200]))
    return found
