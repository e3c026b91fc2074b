"""No worker outlives its job, and no job its workflow (l1bench.lifeline, runner)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from l1bench import lifeline
from l1bench.pool.runner import JobFailed, JobStopped, run_worker

PAPER = dict(seed=42, correctness_trials=1, atol=1e-2, rtol=1e-2, warmup=1, outer_trials=1, inner_trials=1,
             early_stop_below=None)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process handling is tested on Linux")


def hanging_job(tasks, tmp_path):
    """The demo's task whose forward never returns (it holds the device lock meanwhile)."""
    build = tmp_path / "build.json"
    build.write_text(json.dumps({"kind": "build", "status": "ok", "reason": ""}))
    return {
        "kind": "check",
        "backend": "cpu",
        "tid": "L1_T005",
        "task_dir": str(tasks / "L1_T005"),
        "ext_dir": str(tmp_path / "ext"),
        "params": dict(PAPER),
        "build_result": str(build),
        "lock_dir": str(tmp_path),
    }


def running(pid):
    return lifeline.alive(lifeline.process_token(pid))


def pids_running(needle, guards=True):
    """Live processes whose command line contains ``needle`` (without the guards: only those
    that are not l1bench.lifeline's guard)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmd and running(int(d.name)) and (guards or "l1bench.lifeline" not in cmd):
                out.append(int(d.name))
    return out


def wait_for(cond, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_tokens_tell_a_running_process_from_a_gone_one():
    assert lifeline.alive(lifeline.process_token())
    assert lifeline.alive(None)  # outside a workflow nothing is watched
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    token = lifeline.process_token(child.pid)
    assert wait_for(lambda: not lifeline.alive(token), 10)  # a zombie is gone, too
    child.wait()
    assert not lifeline.alive(token)
    pid, start = lifeline.process_token().split(":")
    assert not lifeline.alive(f"{pid}:{int(start) + 1}")  # the same pid, another process


def test_a_job_is_an_allocation_of_its_own_when_the_workflow_is_not_in_it(monkeypatch):
    """own_allocation: SLURM's job id where it differs from the one the workflow runs in (the
    cluster executor's jobs), None in the workflow's own allocation (a run inside one sbatch)
    or outside SLURM; mark_workflow records the workflow's."""
    own = lifeline.own_allocation
    assert own({}) is None and own({"SLURM_JOB_ID": ""}) is None
    assert own({"SLURM_JOB_ID": "71"}) == "71"
    assert own({"SLURM_JOB_ID": "71", lifeline.WORKFLOW_ALLOCATION_ENV: ""}) == "71"
    assert own({"SLURM_JOB_ID": "71", lifeline.WORKFLOW_ALLOCATION_ENV: "70"}) == "71"
    assert own({"SLURM_JOB_ID": "70", lifeline.WORKFLOW_ALLOCATION_ENV: "70"}) is None
    monkeypatch.setenv("SLURM_JOB_ID", "70")
    monkeypatch.delenv(lifeline.WORKFLOW_ALLOCATION_ENV, raising=False)
    monkeypatch.setattr(lifeline.os, "environ", dict(lifeline.os.environ))  # mark_workflow writes here
    lifeline.mark_workflow()
    assert lifeline.os.environ[lifeline.WORKFLOW_ALLOCATION_ENV] == "70" and own() is None


def test_the_guard_passes_the_exit_status_on():
    exit7 = lifeline.guarded([sys.executable, "-c", "raise SystemExit(7)"])
    assert subprocess.run(exit7).returncode == 7
    for sig in (signal.SIGKILL, signal.SIGTERM):
        kill = f"import os; os.kill(os.getpid(), {int(sig)})"
        assert subprocess.run(lifeline.guarded([sys.executable, "-c", kill])).returncode == -sig


def test_a_worker_dies_with_its_job_script(tasks, tmp_path):
    """kill -9 of the process that runs the job (the job script): its worker, and what the
    worker started, go too instead of running on (on a GPU: holding the lock)."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps(hanging_job(tasks, tmp_path)))
    script = (
        "import json, sys;"
        "from l1bench.pool.runner import run_worker;"
        "run_worker(json.load(open(sys.argv[1])), 600, sys.argv[2])"
    )
    log = tmp_path / "job.log"
    # its scratch folder in tmp_path: killed, the job script cannot remove it
    job_script = subprocess.Popen([sys.executable, "-c", script, str(job), str(log)],
                                  env=dict(os.environ, TMPDIR=str(tmp_path)))
    worker_job = "(not started)"
    try:
        # the worker's job file lies in a scratch folder named in the log's "$ ..." line
        assert wait_for(lambda: log.exists() and "l1bench.worker" in log.read_text(), 60)
        worker_job = log.read_text().split("l1bench.worker ", 1)[1].split()[0]
        assert wait_for(lambda: pids_running(worker_job), 30)
        assert wait_for(lambda: (tmp_path / "l1bench-cpu.lock").exists(), 60)  # in its GPU section
        job_script.kill()
        job_script.wait()
        assert wait_for(lambda: not pids_running(worker_job), 10), "the worker outlived its job"
    finally:  # leave nothing behind, whatever happened
        job_script.kill()
        for pid in pids_running(worker_job):
            os.kill(pid, signal.SIGKILL)


def test_a_scratch_folder_left_by_a_killed_job_script_is_found(tmp_path):
    """What the check after each test (conftest) looks for: a job script's scratch folder whose
    process is gone; not one in use, nor a lock file."""
    from helpers import scratch_left

    from l1bench.pool.runner import scratch_prefix

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = tmp_path / f"l1bench-{gone.pid}-abc"
    for path in (left, tmp_path / f"{scratch_prefix()}def"):  # the second is this process's
        path.mkdir()
    (tmp_path / "l1bench-cpu.lock").touch()
    assert scratch_left(tmp_path) == [left]
    assert scratch_left(tmp_path, before={left}) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_removes_the_job_scripts_scratch_folder_and_still_ends_it(tmp_path, sig):
    """A cluster's cancel or requeue sends SIGTERM: the job script removes its scratch folder and
    ends by the signal, as it did before (no result; its worker ends with it)."""
    code = (
        "import time\n"
        "from l1bench.pool import runner\n"
        "runner.remove_scratch_on_stop()\n"
        "with runner.scratch_folder() as tmp:\n"
        "    print(tmp, flush=True)\n"
        "    time.sleep(60)\n"
    )
    # The signal's default action in the script, whatever the suite runs under: under nohup
    # SIGHUP is ignored, and a script that inherits that keeps ignoring it (the next test).
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)),
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        scratch = Path(proc.stdout.readline().strip())
        assert scratch.is_dir() and scratch.parent == tmp_path
        proc.send_signal(sig)
        assert proc.wait(30) == -sig
        assert not scratch.exists()
    finally:
        proc.kill()


def test_a_job_script_started_under_nohup_keeps_ignoring_sighup(tmp_path):
    code = ("import signal\nfrom l1bench.pool import runner\nrunner.remove_scratch_on_stop()\n"
            "print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, callable(signal.getsignal(signal.SIGTERM)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)).stdout.split()
    assert out == ["True", "True"]  # SIGHUP still ignored; SIGTERM handled


def test_a_job_stops_when_its_workflow_is_gone(tasks, tmp_path, monkeypatch):
    """The Snakemake process ends (kill -9): a running job stops its worker at once and ends
    without a result, as a stop, not as a broken attempt (JobFailed). The worker has been sent
    SIGKILL when the job ends; a process with torch loaded can take a moment to be torn down
    after that (on a loaded CI machine it was still listed right after), so the test waits."""
    workflow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    monkeypatch.setenv(lifeline.WORKFLOW_ENV, lifeline.process_token(workflow.pid))
    log = tmp_path / "job.log"
    t0 = time.monotonic()
    with pytest.raises(JobStopped):
        run_worker(hanging_job(tasks, tmp_path), 20, log)
    assert time.monotonic() - t0 < 15  # well before its own timeout (not a timing assertion)
    worker_job = log.read_text().split("l1bench.worker ", 1)[1].split()[0]
    assert wait_for(lambda: not pids_running(worker_job), 10)
    assert "not an attempt" in log.read_text()
    workflow.wait()


def test_a_job_of_a_running_workflow_is_not_stopped(tasks, tmp_path, monkeypatch):
    monkeypatch.setenv(lifeline.WORKFLOW_ENV, lifeline.process_token())
    with pytest.raises(JobFailed, match="SIGKILL"):
        job = hanging_job(tasks, tmp_path) | {"tid": "L1_T006", "task_dir": str(tasks / "L1_T006")}
        run_worker(job, 60, tmp_path / "crash.log")


def test_the_command_dies_with_its_guard(tmp_path):
    """A guard killed outright (SIGKILL: a timeout's kill) takes its command along."""
    marker = f"sleep-{tmp_path.name}"
    guard = subprocess.Popen(lifeline.guarded([sys.executable, "-c", "import time; time.sleep(300)", marker]))
    try:
        assert wait_for(lambda: pids_running(marker, guards=False), 30)
        guard.kill()
        guard.wait()
        assert wait_for(lambda: not pids_running(marker), 10)
    finally:
        for pid in pids_running(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_job_script_ends_with_its_workflow(tmp_path):
    """exit_with_workflow: a job script doing its work in its own children (the reference scan)
    ends once the workflow is gone, and its guarded children with it."""
    workflow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    env = dict(os.environ, **{lifeline.WORKFLOW_ENV: lifeline.process_token(workflow.pid)})
    marker = f"child-{tmp_path.name}"
    script = (
        "import subprocess, sys, time; from l1bench import lifeline; lifeline.exit_with_workflow(0.1);"
        f"subprocess.Popen(lifeline.guarded([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}']));"
        "time.sleep(300)"
    )
    job = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        assert wait_for(lambda: pids_running(marker, guards=False), 30)
        assert job.wait(timeout=30) == 1
        assert wait_for(lambda: not pids_running(marker), 10)
    finally:
        job.kill()
        workflow.wait()
        for pid in pids_running(marker):
            os.kill(pid, signal.SIGKILL)
