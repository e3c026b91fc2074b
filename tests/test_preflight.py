"""What the workflow says before and after a run (l1bench.preflight)."""

import json
import os
import signal
from pathlib import Path

import pytest

from l1bench import attempts, preflight

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config/schemas/config.schema.yaml"


def test_a_bad_config_value_is_named_in_one_line():
    assert preflight.config_error({"device": "h100"}, SCHEMA) is None
    assert preflight.config_error({"device": "h200"}, SCHEMA).startswith("config device: 'h200' is not one of")
    line = preflight.config_error({"timeouts": {"check": -5}}, SCHEMA)
    assert line == "config timeouts.check: -5 is less than or equal to the minimum of 0"
    assert preflight.config_error({"nope": 1}, SCHEMA).startswith("config: Additional properties")
    assert "\n" not in preflight.config_error({"max_attempts": "three"}, SCHEMA)


def test_a_release_dir_must_hold_the_release(tmp_path):
    assert preflight.release_dir_problem(tmp_path / "nope", "optimized_cuda_code/h100.json") == (
        f"release_dir={tmp_path / 'nope'}: no such folder ({preflight.RELEASE_LAYOUT})")
    msg = preflight.release_dir_problem(tmp_path, "optimized_cuda_code/h100.json")
    assert msg.startswith(f"release_dir={tmp_path}: {tmp_path}/optimized_cuda_code/h100.json not found")
    (tmp_path / "optimized_cuda_code").mkdir()
    (tmp_path / "optimized_cuda_code/h100.json").write_text("{}\n")
    assert preflight.release_dir_problem(tmp_path, "optimized_cuda_code/h100.json") is None
    # the demo's own layout: its one file, as config/demo holds it
    assert preflight.release_dir_problem(tmp_path, "optimized_cuda_code/demo.json") == (
        f"release_dir={tmp_path}: {tmp_path}/optimized_cuda_code/demo.json not found ({preflight.DEMO_LAYOUT})")


def put(path, status):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status}))


def test_which_planned_jobs_need_a_gpu(tmp_path):
    res = tmp_path / "results/h100"
    put(res / "build/L1_T001.json", "ok")
    put(res / "build/L1_T002.json", "compile_error")
    put(res / "check/L1_T003.json", "incorrect")
    put(res / "check/L1_T004.json", "pass")
    ledger = attempts.ledger_path(res, res / "check/L1_T009.json")
    for _ in range(3):
        attempts.record(ledger, "boom", "crash")
    planned = [res / "check/L1_T001.json", res / "check/L1_T002.json", res / "time/paper/default/L1_T003.json",
               res / "time/paper/default/L1_T004.json", res / "check/L1_T007.json", res / "check/L1_T009.json"]
    needed = preflight.gpu_jobs(planned, res, no_code_tids={"L1_T007"}, max_attempts=3)
    # a passed build or check: a worker on the GPU; a negative one, no code, given up: none
    assert needed == [str(res / "check/L1_T001.json"), str(res / "time/paper/default/L1_T004.json")]
    # an earlier result this run makes again decides nothing yet
    pending = {str(res / "check/L1_T003.json")}
    assert str(res / "time/paper/default/L1_T003.json") in preflight.gpu_jobs(planned, res, pending=pending)
    line = preflight.no_gpu_message("h100", needed)
    assert "\n" not in line and "for 2 check/time jobs" in line and "and 1 more" in line


def snakemake_log(blocks):
    """A Snakemake log with one error block (and the job log after it) per (rule, output, log text)."""
    text = ""
    for rule, output, log_text in blocks:
        text += (f"[Thu Dec  3 16:14:38 2026]\nError in rule {rule}:\n    jobid: 1\n    output: {output}\n"
                 f"    log: {output}.log (check log file(s) for error details)\n")
        text += f"Logfile {output}.log:\n{'=' * 80}\n{log_text}{'=' * 80}\n"
    return text


def test_the_hint_names_what_failed_and_why():
    log = snakemake_log([
        ("check_task", "results/demo/check/L1_T006.json",
         "$ python -m l1bench.worker j r\nworker exit -9 after 1.0 s\n2026-12-03 16:14:38,982 FAILED (no result "
         "written; the next run retries, attempt 1 of 3): L1_T006: worker crashed (signal SIGKILL), see log\n"),
        ("check_task", "results/demo/check/L1_T005.json",
         "2026-12-03 16:14:38,982 FAILED (no result written; the next run retries, attempt 1 of 3): "
         "L1_T005: held the CPU lock for more than 10 s\n"),
        ("fetch_release_file", "resources/cuda-l1/x/optimized_cuda_code/h100.json", "ERROR download failed\n"),
    ])
    failed = preflight.failed_jobs([log])
    assert list(failed) == sorted(failed)
    hint = preflight.failure_hint("demo", failed, max_attempts=3)
    lines = hint.splitlines()
    assert lines[0] == "3 jobs failed; every other result is kept."
    assert "download failed (no network?)" in lines[1] and "release_dir=FOLDER" in hint
    assert lines[2] == ("  check_task results/demo/check/L1_T005.json: L1_T005: held the CPU lock for more than 10 s, "
                        "log results/demo/check/L1_T005.json.log")
    assert "L1_T006: worker crashed (signal SIGKILL)" in lines[3]
    assert "CUDA fault" not in hint


def test_jobs_not_started_by_a_draining_run_are_not_called_broken():
    drained = (
        "2026-12-04 03:30:29,629 not started: the run is draining (/w/.devstate/drain exists); "
        "the next run does this job\n"
    )
    log = snakemake_log([
        ("time_task", "results/demo/time/paper/default/L1_T001.json", drained),
        ("time_task", "results/demo/time/paper/default/L1_T003.json", drained),
    ])
    failed = preflight.failed_jobs([log])
    assert all(j["drained"] for j in failed.values())
    hint = preflight.failure_hint("demo", failed, max_attempts=3)
    assert hint.splitlines()[0] == ("2 jobs not started: the run was draining (the end of its time budget); "
                                    "not counted as attempts.")
    assert "broke" not in hint and "failed" not in hint.splitlines()[0] and "retry only what failed" in hint
    # one broken job besides: it is named, the drained ones are counted
    log += snakemake_log([("check_task", "results/demo/check/L1_T006.json",
                           "2026-12-03 16:14:38,982 FAILED (no result written; the next run retries, attempt 1 of 3): "
                           "L1_T006: worker crashed (signal SIGKILL), see log\n")])
    lines = preflight.failure_hint("demo", preflight.failed_jobs([log]), max_attempts=3).splitlines()
    assert lines[0] == "1 job failed; every other result is kept." and lines[1].startswith("2 jobs not started")
    assert "L1_T006: worker crashed" in lines[2] and not any("L1_T001" in x for x in lines)


def test_the_hint_after_a_stop_blames_no_task():
    hint = preflight.failure_hint("demo", {}, stopped_by="SIGTERM")
    assert hint.startswith(
        "Stopped by SIGTERM: the jobs that were running were let finish; every finished result is kept."
    )
    assert "failed" not in hint.split("\n")[0]


def test_stop_signals_are_noted_and_still_handled(monkeypatch):
    monkeypatch.setattr(preflight, "STOPPED_BY", [])
    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        preflight.note_stop_signals([signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
        assert preflight.STOPPED_BY == ["SIGTERM"] and seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("name", ["config_error", "release_dir_problem", "gpu_jobs", "failure_hint"])
def test_documented(name):
    assert getattr(preflight, name).__doc__


def test_gpu_guard_and_timing_cpus_only_where_the_gpu_jobs_run():
    # the main command on a GPU host: guard and reservation apply
    assert preflight.gpus_are_local(local_exec=True, is_demo=False, aggregate_only=False)
    # a SLURM head node sends check/time jobs to GPU nodes: neither applies here
    assert not preflight.gpus_are_local(local_exec=False, is_demo=False, aggregate_only=False)
    # the CPU demo and a table rebuild time nothing on a GPU
    assert not preflight.gpus_are_local(local_exec=True, is_demo=True, aggregate_only=False)
    assert not preflight.gpus_are_local(local_exec=True, is_demo=False, aggregate_only=True)


def test_a_full_disk_is_named_not_blamed_on_the_task(tmp_path):
    """A job whose log says ENOSPC and has no FAILED line (run_task could not write it) is named
    as a full disk; a nearly full disk heads the hint."""
    log = snakemake_log([
        ("time_task", "results/demo/time/paper/default/L1_T001.json",
         "OSError: [Errno 28] No space left on device: 'results/demo/time/paper/default/L1_T001.json.tmp'\n"),
    ])
    failed = preflight.failed_jobs([log])
    assert failed["results/demo/time/paper/default/L1_T001.json"]["error"] == attempts.DISK_FULL
    assert preflight.disk_full_note(tmp_path) is None  # this disk has room
    note = preflight.disk_full_note(tmp_path / "not/yet", low=2**62)  # nearest existing parent
    assert note.startswith(f"The disk holding {tmp_path} is full (") and "ENOSPC" in note
    hint = preflight.failure_hint("demo", failed, max_attempts=3, disk=note).splitlines()
    assert hint[0] == note and hint[1] == "1 job failed; every other result is kept."
    assert "disk full (ENOSPC" in hint[2] and "CUDA fault" not in "\n".join(hint)
