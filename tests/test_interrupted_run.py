"""An operator kills or stops a run of the CPU demo: nothing keeps running, nothing completed is
lost, attempts are counted once per real attempt, the next run needs no --unlock, and the
end-of-run hint says what happened."""

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import SNAKEMAKE, copy_workflow, processes_in, run, wait_for

pytestmark = pytest.mark.slow

# max_attempts 0: no retry within a run (l1bench.attempts.in_run_retries), so that each run
# makes at most one attempt per job and the job logs show every attempt
DEMO = SNAKEMAKE + ["--cores", "2", "--retries", "0", "--config", "device=demo", "max_attempts=0"]
BROKEN = ("L1_T005", "L1_T006")  # hangs (holding the lock) / kills its own process
#: run_task's log line for an attempt that broke by itself (not for one that was stopped)
ATTEMPT_LINE = re.compile(r"FAILED \(no result written|FAILED \d+ times: giving up")


def start(work, *args):
    out = open(work / f"run-{len(list(work.glob('run-*.log')))}.log", "w")  # closed by the test
    return subprocess.Popen(DEMO + list(args), cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def results(work):
    """{path: bytes} of every build/check/time result of the demo."""
    res = work / "results/demo"
    return {
        str(p.relative_to(res)): p.read_bytes()
        for stage in ("build", "check", "time")
        for p in res.glob(f"{stage}/**/*.json")
    }


def worker_running(log: Path) -> bool:
    """The job of this log runs its worker now (its latest attempt has not ended)."""
    if not log.exists():
        return False
    last = log.read_text().rsplit("\n$ ", 1)[-1]
    # a worker of its own (l1bench.worker), or a step its task's worker serves (l1bench.pool.server)
    started = re.search(r"l1bench\.worker|l1bench\.timing\.serve|task worker \d+ of", last)
    return bool(started) and not re.search(r"worker exit|FAILED|STOPPED|stopped:|status |step done", last)


def ledger(work, tid):
    path = work / f"results/demo/attempts/check/{tid}.json"
    if path.exists():
        return len(json.loads(path.read_text())["attempts"])
    result = work / f"results/demo/check/{tid}.json"
    return len(json.loads(result.read_text()).get("failed_attempts", [])) if result.exists() else 0


class BrokenAttempts:
    """Attempts that broke by themselves, read from the job logs after each run (Snakemake
    starts a job's log afresh when it runs the job again)."""

    def __init__(self, work):
        self.work, self.seen, self.total = work, {}, dict.fromkeys(BROKEN, 0)

    def after_a_run(self):
        for tid in BROKEN:
            log = self.work / f"logs/demo/check_task/{tid}.log"
            text = log.read_text() if log.exists() else ""
            if text != self.seen.get(tid, ""):
                self.seen[tid] = text
                # every broken attempt's line, the last one's too (run_task gives up with
                # "FAILED N times: giving up" where the others say "FAILED (no result written")
                self.total[tid] += len(ATTEMPT_LINE.findall(text))
        return self.total


def kill_all(work):
    for pid, _ in processes_in(work):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_9_loses_no_result_leaves_no_process_and_counts_attempts_once(tmp_path):
    copy_workflow(tmp_path)
    logs = tmp_path / "logs/demo"
    broken = BrokenAttempts(tmp_path)
    try:
        # 1. kill -9 while the hanging task's worker holds the lock (another job waits for it)
        first = start(tmp_path)
        assert wait_for(lambda: worker_running(logs / "check_task/L1_T005.log"), 300), "the hanging check never ran"
        first.kill()
        first.wait()
        assert wait_for(lambda: not processes_in(tmp_path), 15), f"left running: {processes_in(tmp_path)}"
        assert "not counted as an attempt" in (logs / "check_task/L1_T005.log").read_text()
        after_kill = results(tmp_path)
        counted = broken.after_a_run()
        assert counted["L1_T005"] == 0 == ledger(tmp_path, "L1_T005")  # the killed attempt is none
        assert ledger(tmp_path, "L1_T006") == counted["L1_T006"]

        # 2. a job completes after its Snakemake process stopped recording it (SIGSTOP), then kill -9
        second = start(tmp_path)
        others = lambda: [  # noqa: E731
            log for log in logs.glob("*_task/**/*.log")
            if worker_running(log) and not any(t in log.name for t in BROKEN)
        ]
        for _ in range(100):  # stop it while a job runs its worker
            assert wait_for(others, 300), "no job of the second run started its worker"
            os.kill(second.pid, signal.SIGSTOP)
            running = others()
            if running:
                break
            os.kill(second.pid, signal.SIGCONT)
        assert running
        outputs = [Path(str(log).replace("logs/demo/", "results/demo/").replace("_task/", "/", 1)).with_suffix(".json")
                   for log in running]
        assert wait_for(lambda: all(p.exists() for p in outputs), 120), "the running jobs did not finish"
        # the job scripts end; a task worker waits for its task's next step, so it
        # stays while its workflow is only stopped, and ends with it (below)
        assert wait_for(lambda: not [p for p in processes_in(tmp_path) if p[0] != second.pid
                                     and "l1bench" in p[1] and "l1bench.pool.server" not in p[1]], 60)
        second.kill()
        second.wait()
        assert wait_for(lambda: not processes_in(tmp_path), 15), f"left running: {processes_in(tmp_path)}"
        completed_unrecorded = [str(p.relative_to(tmp_path / "results/demo")) for p in outputs]
        after_stop = results(tmp_path)
        broken.after_a_run()
        assert all(k in after_stop for k in completed_unrecorded)

        # 3. rerun to the end: no --unlock, nothing redone, every result kept
        third = run(DEMO, tmp_path, timeout=900)
        out = third.stdout + third.stderr
        second_out = (tmp_path / "run-1.log").read_text()
        assert "cannot be locked" not in out + second_out
        assert "released the locks of a run that was killed" in second_out
        assert "kept " in out and "that jobs of an interrupted run completed" in out
        final = results(tmp_path)
        for snapshot in (after_kill, after_stop):
            assert {k: v for k, v in final.items() if k in snapshot} == snapshot  # kept, not redone
        assert wait_for(lambda: not processes_in(tmp_path), 15), f"left running: {processes_in(tmp_path)}"
        # attempts: one per attempt that broke by itself, across the runs; a stopped one is none
        counted = broken.after_a_run()
        for tid in BROKEN:
            assert ledger(tmp_path, tid) == counted[tid] >= 1, (tid, counted)
    finally:
        kill_all(tmp_path)


def test_a_run_stopped_by_sigterm_says_so(tmp_path):
    """SIGTERM (an operator, a time budget): Snakemake lets running jobs finish; the hint says
    the run was stopped, not that tasks broke."""
    copy_workflow(tmp_path)
    try:
        proc = start(tmp_path, 'tasks=["1/5"]')
        assert wait_for(lambda: worker_running(tmp_path / "logs/demo/check_task/L1_T005.log"), 300)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=300) != 0
        out = (tmp_path / "run-0.log").read_text()
        assert "Stopped by SIGTERM" in out and "every finished result is kept" in out
        assert "CUDA fault" not in out and "jobs failed" not in out
    finally:
        kill_all(tmp_path)
