"""The attempts ledger: broken attempts are counted across runs, and a job that breaks every
time ends with a terminal status instead of being retried forever."""

import errno
import json
import re
from pathlib import Path

import pytest

from l1bench import attempts

ROOT = Path(__file__).resolve().parents[1]

WORKER_LOG = """\
2026-12-03 16:14:34,848 job {'kind': 'time', 'tid': 'L1_T081'}
$ python3 -m l1bench.worker /tmp/x/job.json /tmp/x/result.json  (timeout 1800 s)
[W1203 16:13:26.187566739 CUDAGraph.cpp:275] Warning: CUDA warning: operation not permitted when stream is capturing
Traceback (most recent call last):
  File "/work/main/scripts/l1bench/worker.py", line 996, in <module>
    sys.exit(main(sys.argv))
             ^^^^^^^^^^^^^^
RuntimeError: Offset increment outside graph capture encountered unexpectedly.
worker exit 1 after 70.7 s
2026-12-03 16:14:38,982 FAILED (no result written; the next run retries): L2_T062: worker crashed (exit code 1), see log
"""


def snakemake_error_block(stamp, output, log_text):
    """An error block as Snakemake 9 writes it (show-failed-logs), with the job log after it."""
    logged = f"Logfile {output}.log:\n{'=' * 80}\n{log_text}{'=' * 80}\n" if log_text else ""
    return (
        f"[{stamp}]\nError in rule time_task:\n    message: None\n    jobid: 1413\n"
        f"    input: results/h100/tasks/L2_T062/meta.json, results/h100/check/L2_T062.json\n"
        f"    output: {output}\n"
        f"    log: logs/h100/x.log (check log file(s) for error details)\n{logged}"
        "Trying to restart job 1413.\n"
    )


def test_record_counts_attempts_until_given_up(tmp_path):
    ledger = attempts.ledger_path(tmp_path / "results/h100", tmp_path / "results/h100/time/paper/cudnn/L1_T001.json")
    assert ledger == tmp_path / "results/h100/attempts/time/paper/cudnn/L1_T001.json"
    assert attempts.load(ledger) == [] and not attempts.given_up([], 3)
    for n in (1, 2):
        got = attempts.record(ledger, "L1_T001: timed out after 1800 s", "timeout", when=f"2026-12-0{n}T00:00:00+00:00")
        assert len(got) == n and not attempts.given_up(got, 3)
    got = attempts.record(ledger, "L1_T001: worker crashed (signal SIGKILL)", "crash", "Killed")
    assert attempts.given_up(got, 3) and not attempts.given_up(got, 0)  # 0 = retry forever
    assert attempts.load(ledger) == got
    assert attempts.terminal_status(got) == "crashed"  # not every attempt timed out
    assert attempts.terminal_status(got[:2]) == "timeout"
    reason = attempts.terminal_reason(got)
    assert reason.startswith("broke in all 3 attempts (2026-12-01T00:00:00+00:00 .. ")
    assert reason.endswith("last: L1_T001: worker crashed (signal SIGKILL): Killed")


def test_an_unreadable_ledger_counts_as_no_attempts(tmp_path):
    bad = tmp_path / "ledger.json"
    bad.write_text("{not json")
    assert attempts.load(bad) == []


def test_last_error_line_names_the_exception_not_the_noise():
    error = "RuntimeError: Offset increment outside graph capture encountered unexpectedly."
    assert attempts.last_error_line(WORKER_LOG) == error
    assert attempts.log_error(WORKER_LOG) == (
        "L2_T062: worker crashed (exit code 1), see log",
        "RuntimeError: Offset increment outside graph capture encountered unexpectedly.",
    )
    assert attempts.last_error_line("$ python3 -m l1bench.worker\nworker exit 0 after 1 s\n") == ""


def test_failed_jobs_are_read_from_snakemake_logs():
    broken = "results/h100/time/paper/cuda_graph/L2_T062.json"
    text = (
        snakemake_error_block("Thu Dec  3 16:00:42 2026", broken, "")  # stopped by a drain: no job log
        + "Select jobs to execute...\n"
        + snakemake_error_block("Thu Dec  3 16:14:39 2026", broken, WORKER_LOG)
    )
    blocks = attempts.failed_jobs_in_snakemake_log(text)
    assert [(b["rule"], b["output"], b["log"]) for b in blocks] == [("time_task", broken, "logs/h100/x.log")] * 2
    assert blocks[0]["log_text"] == "" and blocks[1]["log_text"] == WORKER_LOG


def test_a_job_that_broke_max_attempts_times_gets_a_terminal_result(tmp_path):
    from l1bench.job import without_worker

    (tmp_path / "meta.json").write_text(json.dumps({"snippets": {"custom": {"file": "custom.py", "sha256": "b"}}}))
    (tmp_path / "check.json").write_text(json.dumps({"kind": "check", "status": "pass", "reason": ""}))
    job = {"kind": "time", "tid": "L1_T081", "mode": "cuda_graph", "protocol": "paper", "params": {"seed": 42},
           "task_dir": str(tmp_path), "check_result": str(tmp_path / "check.json")}
    ledger = tmp_path / "ledger.json"
    for _ in range(2):
        got = attempts.record(ledger, "L1_T081: infrastructure failure (CUDA fault or out of memory), see log", "infra")
    assert without_worker(job, got[:1], 2) is None and without_worker(job, got, 0) is None
    res = without_worker(job, got, 2)
    assert res["status"] == "crashed" and res["score"] is None and res["mode"] == "cuda_graph"
    assert res["reason"].startswith("broke in all 2 attempts") and len(res["failed_attempts"]) == 2
    assert res["provenance"]["worker"] is False and res["params"] == {"seed": 42}
    assert json.loads(ledger.read_text())["attempts"] == got


def test_a_job_log_set_up_by_l1bench_log_is_read_back(tmp_path):
    """The job's lines (l1bench.log.setup_logging, appended to the worker's output) are what
    log_error reads: its FAILED reason, and the worker's error line, not a time-stamped one."""
    import logging

    from l1bench.log import setup_logging

    log = tmp_path / "logs" / "check_task" / "L1_T005.log"
    log.parent.mkdir(parents=True)
    log.write_text("$ python -m l1bench.worker job.json result.json\nRuntimeError: CUDA error: misaligned address\n")
    try:
        setup_logging(log)
        logging.error("FAILED (no result written; the next run retries, attempt %d of %s): %s", 1, 3,
                      "L1_T005: worker crashed (signal SIGKILL)")
    finally:
        logging.basicConfig(force=True)  # closes the file
    lines = log.read_text().splitlines()
    assert lines[:2] == [
        "$ python -m l1bench.worker job.json result.json", "RuntimeError: CUDA error: misaligned address"
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} FAILED \(no result written.*SIGKILL\)", lines[2])
    assert attempts.log_error(log.read_text()) == (
        "L1_T005: worker crashed (signal SIGKILL)", "RuntimeError: CUDA error: misaligned address")


OOM_LOG = """\
2026-12-05 21:20:20,901 job {'kind': 'time', 'tid': 'L2_T020'}
task worker 806 of L2_T020: step 2 (waited 9.8 s for the task's earlier steps)
l1bench worker: infrastructure failure: warm-up: OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.
task worker 806: step done in 0.0 s, exit status 3; it retires: infrastructure failure (CUDA fault or out of memory)
"""


def test_out_of_memory_is_torchs_error_not_the_generic_infra_message():
    """The retire line and the job's FAILED line always say "CUDA fault or out of memory": only
    torch's own error marks an attempt that ran out of GPU memory."""
    assert attempts.out_of_memory(OOM_LOG)
    assert attempts.out_of_memory("RuntimeError: CUDA error: out of memory")
    generic = OOM_LOG.replace("OutOfMemoryError: CUDA out of memory", "AcceleratorError: CUDA error: illegal address")
    assert not attempts.out_of_memory(generic)
    assert attempts.gpu_shared(1, "32") and not attempts.gpu_shared(32, "32")
    assert not attempts.gpu_shared(1, None) and not attempts.gpu_shared(None, 32)  # unknown: not shared


def test_out_of_memory_beside_other_jobs_is_recorded_but_not_counted(tmp_path):
    """Attempts that ran out of GPU memory beside other jobs stay in the ledger (and the terminal
    reason) but do not count (2026-12-05, H100: three such attempts had given tasks that fit the
    GPU alone a terminal crashed); one that ran out with the GPU to itself counts."""
    ledger = tmp_path / "ledger.json"
    err = "L2_T020: infrastructure failure (CUDA fault or out of memory), see log"
    for _ in range(3):
        got = attempts.record(ledger, err, "infra", out_of_memory=True, gpu_shared=True, gpu_slots=1)
    assert attempts.ran_out_sharing(got) and attempts.counted(got) == []
    assert not attempts.given_up(got, 3)
    got = attempts.record(ledger, err, "infra", out_of_memory=True, gpu_shared=False, gpu_slots=32)
    got = attempts.record(ledger, "L2_T020: worker crashed (signal SIGKILL)", "crash")
    assert len(attempts.counted(got)) == 2 and not attempts.given_up(got, 3)
    got = attempts.record(ledger, err, "infra")  # a CUDA fault (no out-of-memory mark): counted
    assert attempts.given_up(got, 3)
    reason = attempts.terminal_reason(got)
    assert reason.startswith("broke in all 3 attempts, 3 more out of GPU memory beside other jobs (")


DISK_FULL_LOG = """\
$ python3 -m l1bench.worker /tmp/x/job.json /tmp/x/result.json  (timeout 90 s)
Traceback (most recent call last):
  File "/work/src/l1bench/io.py", line 20, in atomic_write_text
OSError: [Errno 28] No space left on device: '/tmp/x/result.json.tmp'
worker exit 1 after 0.4 s
"""


def failing_job(tmp_path, log_text=""):
    """(a check job's rule, output, log and results folder, its ledger) with ``log_text`` in its log."""
    from l1bench.job import JobSpec

    log = tmp_path / "logs/check_task/L1_T006.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(log_text)
    res = tmp_path / "results/demo"
    out = res / "check/L1_T006.json"
    spec = JobSpec(rule="check_task", kind="check", tid="L1_T006", output=str(out), log=str(log), results=res,
                   backend="cuda", protocol_params={}, ext_dir=str(res / "build/ext/L1_T006"), timeout=60,
                   max_attempts=3, gpu_slots=1)
    return spec, attempts.ledger_path(res, out)


def record_failure(spec, err, ledger) -> list:
    """The job's record of the broken attempt ``err`` (runner.JobFailed), its whole log read."""
    from l1bench.job import attempt_log, gpu_slots

    return attempts.record_broken(ledger, str(err), err.kind, attempt_log(spec.log, 0), spec.results, gpu_slots(spec))


def test_a_full_disk_in_a_worker_is_named_and_not_counted(tmp_path):
    """A worker that found the disk full (OSError errno 28) failed for the machine, not for its
    task: the ledger names the full disk, and the attempt does not count towards giving up."""
    from l1bench.pool.runner import JobFailed

    assert attempts.disk_full(DISK_FULL_LOG) and not attempts.disk_full(WORKER_LOG)
    spec, ledger = failing_job(tmp_path, DISK_FULL_LOG)
    for _ in range(3):
        got = record_failure(spec, JobFailed("L1_T006: worker crashed (exit code 1), see log"), ledger)
    assert got[-1]["error"] == (
        "L1_T006: disk full (ENOSPC: No space left on device); worker crashed (exit code 1), see log"
    )
    assert got[-1]["kind"] == "disk_full" and got[-1]["disk_full"] is True
    assert got[-1]["detail"] == "OSError: [Errno 28] No space left on device: '/tmp/x/result.json.tmp'"
    assert attempts.counted(got) == [] and not attempts.given_up(got, 3)
    assert attempts.not_counted(got[-1]).startswith("; the disk is full: not counted")
    # a crash of the task itself still counts, and the terminal reason names the others
    spec, _ = failing_job(tmp_path, WORKER_LOG)
    got = record_failure(spec, JobFailed("L1_T006: worker crashed (exit code 1), see log"), ledger)
    assert len(attempts.counted(got)) == 1 and "disk_full" not in got[-1]
    assert ", 3 more disk full (" in attempts.terminal_reason(got)


def test_a_full_disk_in_the_job_process_ends_it_with_one_line(tmp_path):
    """errno 28 while the job writes (the result, the ledger): one line naming the full disk,
    in the job log and as the job's exit message, and no ledger entry (not an attempt)."""
    from l1bench.job import name_a_full_disk

    spec, ledger = failing_job(tmp_path)

    def full(_spec):
        raise OSError(errno.ENOSPC, "No space left on device", "results/demo/check/L1_T006.json.tmp")

    try:
        name_a_full_disk(full, spec)
    except SystemExit as stop:
        line = str(stop.code)
    assert line == (
        f"check_task {spec.output}: disk full (ENOSPC: No space left on device) "
        "(results/demo/check/L1_T006.json.tmp); not counted as an attempt"
    )
    assert "\n" not in line and line in Path(spec.log).read_text()
    assert attempts.log_error(Path(spec.log).read_text())[0] == line
    assert not ledger.exists()

    def other(_spec):
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):  # any other OSError stays what it is
        name_a_full_disk(other, spec)


def test_a_crash_while_the_disk_is_full_is_not_counted(tmp_path, monkeypatch):
    """A worker that broke without saying why (its output lost, or written elsewhere) while the
    results' disk is full: a full disk, not counted."""
    from l1bench.pool.runner import JobFailed

    spec, ledger = failing_job(tmp_path, "$ python3 -m l1bench.worker job.json result.json\nworker exit -9\n")
    crash = JobFailed("L1_T006: worker crashed (signal SIGKILL), see log")
    got = record_failure(spec, crash, ledger)
    assert len(attempts.counted(got)) == 1  # room on the disk: the task's own crash
    monkeypatch.setattr(attempts, "DISK_LOW_BYTES", 2**62)  # every disk is full now
    got = record_failure(spec, crash, ledger)
    assert got[-1]["disk_full"] and got[-1]["error"].startswith("L1_T006: disk full (ENOSPC")
    assert len(attempts.counted(got)) == 1
