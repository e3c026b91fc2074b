"""The line a successful run ends with (l1bench.lastline), the progress lines of a long run
(l1bench.progress) and the broken results' list (l1bench.failed)."""

import json
import logging
from collections import Counter

from l1bench import failed, lastline, progress


def result(path, status):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": status}))
    return str(path)


def demo_tree(res):
    """A small results tree: L1_T001 measured, L1_T005 broke in its check (carried into its
    time results), L1_T008's cudnn time job broke alone."""
    paths = [result(res / "build/L1_T001.json", "ok"), result(res / "check/L1_T001.json", "pass"),
             result(res / "check/L1_T005.json", "timeout"), result(res / "check/L1_T008.json", "pass")]
    for mode, status in (("default", "ok"), ("cudnn", "unsupported")):
        paths.append(result(res / f"time/paper/{mode}/L1_T001.json", status))
        paths.append(result(res / f"time/paper/{mode}/L1_T005.json", "timeout"))
    paths.append(result(res / "time/paper/default/L1_T008.json", "ok"))
    paths.append(result(res / "time/paper/cudnn/L1_T008.json", "crashed"))
    return paths


def test_the_success_line_counts_what_was_measured_and_names_what_broke(tmp_path):
    res = tmp_path / "results/demo"
    paths = demo_tree(res)
    made = lastline.made_results([("time_task", [p]) for p in paths if "/time/" in p and "L1_T001" not in p]
                                + [("aggregate_results", [str(res / "summary.md")])])
    line = lastline.success_line("demo", str(res), "logs/demo", paths + [str(res / "check/L1_T009.json")], made)
    assert "\n" not in line
    assert line.startswith(
        "Done: 6 time results (4 made in this run, 2 kept: ok 2, timeout 2, crashed 1, unsupported 1)"
    )
    assert f"; tables in {res}/ (README.md, summary.md, per_task.md)" in line
    assert line.endswith(
        "; 2 tasks broke (L1_T005 timeout, L1_T008 crashed; logs in logs/demo/), "
        "retry: l1bench failed --remove results/demo && snakemake --config device=demo"
    )
    # all broken at one stage: its logs' folder; nothing broken: said so
    only_check = [p for p in paths if "L1_T008" not in p]
    assert "logs in logs/demo/check_task/" in lastline.success_line("demo", str(res), "logs/demo", only_check, made)
    fine = [p for p in paths if "L1_T001" in p]
    assert lastline.success_line("demo", str(res), "logs/demo", fine, set()).endswith(
        "(0 made in this run, 2 kept: ok 1, unsupported 1); tables in "
        f"{res}/ (README.md, summary.md, per_task.md); nothing broke.")


def test_failed_lists_and_removes_the_broken_results(tmp_path, capsys):
    res = tmp_path / "results/demo"
    demo_tree(res)
    result(res / "build/ext/L1_T001/L1_T002.json", "crashed")  # not a result
    broken = failed.broken_results(res)
    assert [p.removeprefix(f"{res}/") for p in broken] == [
        "check/L1_T005.json", "time/paper/cudnn/L1_T005.json", "time/paper/cudnn/L1_T008.json",
        "time/paper/default/L1_T005.json"]
    assert failed.main([str(res)]) == 0 and capsys.readouterr().out.splitlines() == broken
    assert failed.main([str(res), "--remove"]) == 0
    assert not any(map(lambda p: (tmp_path / p).exists(), broken)) and failed.broken_results(res) == []
    assert (res / "check/L1_T001.json").exists()
    assert failed.retry_command("h100", "results/mine") == (
        "l1bench failed --remove results/mine/h100 && snakemake --config device=h100 results_dir=results/mine")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def record(event, **fields):
    rec = logging.LogRecord("snakemake.logging", logging.INFO, __file__, 1, None, None, None)
    rec.event = event  # Snakemake's LogEvent is a StrEnum: str() gives these names
    rec.__dict__.update(fields)
    return rec


def test_progress_estimates_the_time_left_from_finished_jobs(capsys):
    clock = Clock()
    jobs = {1: "check_task", 2: "check_task", 3: "time_task", 4: "time_task", 5: "time_task", 6: "time_task"}
    handler = progress.Progress(jobs, every_s=60, clock=clock)
    handler.emit(record("job_started", jobs=[1, 2]))
    clock.now = 30.0
    handler.emit(record("job_finished", job_id=1))
    handler.emit(record("progress", done=1, total=6))
    assert capsys.readouterr().err == ""  # not a minute yet
    clock.now = 60.0
    handler.emit(record("job_finished", job_id=2))
    handler.emit(record("job_started", jobs=[3]))
    handler.emit(record("progress", done=2, total=6))
    line = capsys.readouterr().err.strip()
    # two checks of 30 and 60 s in 60 s: 1.5 jobs at once; 4 time jobs at the mean 45 s
    assert line == "progress: 2 of 6 jobs done in 1 min; about 2 min left (from the finished jobs: check 45 s each)"
    handler.emit(record("progress", done=2, total=6))
    assert capsys.readouterr().err == ""  # at most once a minute


def test_time_left():
    assert progress.time_left(Counter(time_task=3), {}, 10) is None
    assert progress.time_left(Counter(time_task=4), {"time_task": [10.0, 30.0]}, 20.0) == 40.0  # 2 at once
    assert progress.time_left(Counter(build_task=1), {"time_task": [10.0]}, 100.0) == 10.0  # overall mean, ≥1 at once
    assert [progress.minutes(s) for s in (5, 125, 7500)] == ["5 s", "2 min", "2 h 05 min"]


def test_progress_is_attached_to_snakemakes_logger_and_detached():
    handler = progress.start([(1, "check_task")])
    assert handler in logging.getLogger(progress.SNAKEMAKE_LOGGER).handlers
    progress.stop(handler)
    assert handler not in logging.getLogger(progress.SNAKEMAKE_LOGGER).handlers
