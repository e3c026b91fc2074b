"""After a killed run (l1bench.recovery): completed results are kept, stale locks released."""

import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.persistence.file import FilePersistence

from l1bench import lifeline, recovery


def mark(workdir, key, name_max=255):
    """An incomplete mark exactly as Snakemake's file persistence writes it."""
    fake = SimpleNamespace(_fetch_max_len=lambda subject: name_max)
    path = Path(FilePersistence._record_path(fake, str(workdir / ".snakemake/incomplete"), key))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"external_jobid": None}))
    return path


def result(path, **fields):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "check", "status": "pass", "release_fingerprint": "ab"} | fields))


def test_marks_are_read_as_snakemake_writes_them(tmp_path):
    long = "results/demo/time/paper/torch_compile_reduce_overhead/" + "x" * 300 + ".json"
    marks = (("results/demo/check/L1_T001.json", 255), (long, 255), ("results/demo/build/L1_T002.json", 12))
    for key, name_max in marks:
        mark(tmp_path, key, name_max)
    assert set(recovery.incomplete_marks(tmp_path)) == {
        "results/demo/check/L1_T001.json", long, "results/demo/build/L1_T002.json"}


def test_completed_results_of_a_killed_run_are_kept(tmp_path):
    res = tmp_path / "results/demo"
    done = ["check/L1_T001.json", "time/paper/default/L1_T001.json", "build/L1_T002.json"]
    for rel in done:
        result(res / rel)
        mark(tmp_path, f"results/demo/{rel}")
    (res / "check/L1_T003.json").write_text('{"kind": "check", "sta')  # not a whole result
    torn = mark(tmp_path, "results/demo/check/L1_T003.json")
    missing = mark(tmp_path, "results/demo/check/L1_T004.json")  # its job never finished
    (res / "scores.csv").write_text("tid\n")  # tables are made again, whole
    table = mark(tmp_path, "results/demo/scores.csv")
    kept = recovery.keep_completed_results("results/demo", tmp_path)
    assert kept == sorted(f"results/demo/{rel}" for rel in done)
    assert torn.exists() and missing.exists() and table.exists()
    assert set(recovery.incomplete_marks(tmp_path)) == {
        "results/demo/check/L1_T003.json", "results/demo/check/L1_T004.json", "results/demo/scores.csv"}
    assert recovery.keep_completed_results("results/demo", tmp_path) == []


def test_locks_of_a_dead_run_are_released_and_nothing_else(tmp_path):
    locks = tmp_path / ".snakemake/locks"
    locks.mkdir(parents=True)
    for name in ("0.input.lock", "0.output.lock", "1.input.lock", "2.input.lock"):
        (locks / name).write_text("results/demo/check/L1_T001.json\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = {"token": f"{gone.pid}:0", "host": socket.gethostname(),
            "locks": [str(locks / "0.input.lock"), str(locks / "0.output.lock")]}
    (locks / "l1bench-owner-1.json").write_text(json.dumps(dead))
    live = dead | {"token": lifeline.process_token(), "locks": [str(locks / "1.input.lock")]}
    (locks / "l1bench-owner-2.json").write_text(json.dumps(live))
    elsewhere = dead | {"host": "another-host", "locks": [str(locks / "2.input.lock")]}
    (locks / "l1bench-owner-3.json").write_text(json.dumps(elsewhere))
    assert recovery.release_locks_of_dead_runs(tmp_path) == [dead]
    assert sorted(p.name for p in locks.iterdir()) == [
        "1.input.lock", "2.input.lock", "l1bench-owner-2.json", "l1bench-owner-3.json"]


def test_a_run_records_the_locks_it_holds(tmp_path):
    lock = tmp_path / ".snakemake/locks/0.input.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("x\n")
    owner = recovery.record_lock_owner([lock], tmp_path)
    record = json.loads(owner.read_text())
    assert record["locks"] == [str(lock.resolve())] and lifeline.alive(record["token"])
    assert recovery.release_locks_of_dead_runs(tmp_path) == [] and lock.exists()
    assert recovery.record_lock_owner([], tmp_path) is None
