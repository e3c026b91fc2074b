"""One run brings every result up to date (docs/rerun-policy.md): one test per row of the rerun
table, on the demo's CPU backend. After each change, ONE run leaves ``snakemake -n`` with
nothing to do, every result carries the new hashes or params, and only the jobs the change
concerns ran.

A module-scoped first run of three demo tasks in one mode is shared; each test changes a copy.
"""

import json
import os
import re
import shutil
import subprocess

import pytest
from helpers import SNAKEMAKE, copy_workflow, job_counts

from l1bench import release as rel
from l1bench import staleness

pytestmark = pytest.mark.slow

SUBSET = 'tasks: ["1/1", "1/2", "1/3"]\nmodes: [default]\n'
RES = "results/demo"
EVALUATION = ("build_task", "check_task", "time_task")
DEMO_RELEASE = "config/demo/optimized_cuda_code/demo.json"


def snakemake(work, *args, configfile=None):
    # one --configfile with every file: a second flag would replace the first
    cmd = SNAKEMAKE + ["--cores", "2", "--retries", "0", "--configfile", "subset.yaml"]
    cmd += [configfile] if configfile else []
    cmd += list(args) + ["--config", "device=demo"]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)


def run_once(work, configfile=None):
    """One run (it must succeed), then a dry run that must have nothing to do; the jobs the run
    ran ({rule: count})."""
    proc = snakemake(work, configfile=configfile)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    dry = snakemake(work, "-n", configfile=configfile)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]
    return {k: v for k, v in job_counts(out).items() if k != "all"}


def results(work):
    return {str(p.relative_to(work)): json.loads(p.read_text())
            for kind in ("build", "check", "time") for p in sorted((work / RES / kind).rglob("*.json"))}


def mtimes(work):
    return {str(p.relative_to(work)): p.stat().st_mtime_ns
            for kind in ("build", "check", "time") for p in (work / RES / kind).rglob("*.json")}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    work = tmp_path_factory.mktemp("reruns")
    copy_workflow(work)
    (work / "subset.yaml").write_text(SUBSET)
    run_once(work)
    return work


@pytest.fixture
def work(first, tmp_path):
    copy = tmp_path / "w"
    shutil.copytree(first, copy, symlinks=True)
    return copy


def edit_release(work, tid, field, text):
    path = work / DEMO_RELEASE
    lines = []
    for line in path.read_text().splitlines():
        obj = json.loads(line) if line.strip() else None
        if obj and rel.task_id(obj["level_id"], obj["task_id"]) == tid:
            obj[field] += text
            line = json.dumps(obj)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def release_hashes(work, tid):
    return next(staleness.snippet_hashes(t) for t in rel.load_release(work / DEMO_RELEASE) if t.tid == tid)


def test_one_tasks_code_reruns_that_tasks_jobs_only(work):
    before = mtimes(work)
    edit_release(work, "L1_T001", "custom_code", "\n# edited\n")
    ran = run_once(work)
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": 1, "check_task": 1, "time_task": 1}
    assert ran.get("aggregate_results") == 1
    after = mtimes(work)
    assert sorted(p for p in after if after[p] != before[p]) == sorted(p for p in after if "L1_T001" in p)
    want = release_hashes(work, "L1_T001")
    assert all(r["snippet_sha256"] == want for p, r in results(work).items() if "L1_T001" in p)


def test_release_content_reruns_the_changed_tasks(work):
    edit_release(work, "L1_T002", "ref_code", "\n# edited\n")
    edit_release(work, "L1_T003", "ref_code", "\n# edited\n")
    ran = run_once(work)
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": 2, "check_task": 2, "time_task": 2}
    for tid in ("L1_T002", "L1_T003"):
        want = release_hashes(work, tid)
        assert all(r["snippet_sha256"] == want for p, r in results(work).items() if tid in p)


def test_a_protocol_parameter_reruns_checks_and_times_in_one_run(work):
    (work / "paper.yaml").write_text("paper: {outer_trials: 5}\n")
    ran = run_once(work, configfile="paper.yaml")
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": None, "check_task": 3, "time_task": 3}
    assert all(r["params"]["outer_trials"] == 5 for p, r in results(work).items() if "/build/" not in p)


def test_a_build_setting_reruns_builds_checks_and_times_and_a_speed_setting_nothing(work):
    (work / "speed.yaml").write_text("build: {max_jobs: 1}\ntimeouts: {time: 1700}\nmax_attempts: 5\n")
    dry = snakemake(work, "-n", configfile="speed.yaml")
    assert "Nothing to be done" in dry.stdout + dry.stderr
    (work / "build.yaml").write_text('build: {cuda_arch_list: "8.0"}\n')
    ran = run_once(work, configfile="build.yaml")
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": 3, "check_task": 3, "time_task": 3}
    assert all(r["params"]["cuda_arch_list"] == "8.0" for p, r in results(work).items() if "/build/" in p)


def test_another_timing_version_reruns_that_time_job(work):
    path = work / RES / "time/paper/default/L1_T002.json"
    res = json.loads(path.read_text())
    res["timing_design"] = 5
    path.write_text(json.dumps(res))
    ran = run_once(work)
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": None, "check_task": None, "time_task": 1}
    assert json.loads(path.read_text()).get("timing_design") != 5


def test_table_code_and_new_file_dates_rerun_nothing(work):
    for path in [work / "scripts/aggregate_results.py", *(work / RES).rglob("*.json")]:
        path.touch()
    dry = snakemake(work, "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]


def test_a_hand_edited_snippet_is_split_anew_from_the_release(work):
    snippet = work / RES / "tasks/L1_T001/custom.py"
    snippet.write_text(snippet.read_text() + "\n# edited by hand\n")
    dry = snakemake(work, "-n")
    assert "tasks is stale: L1_T001/custom.py differs from the release: re-split from it" in dry.stdout
    ran = run_once(work)
    assert ran.get("split_release") == 1 and not {k: ran.get(k) for k in EVALUATION if ran.get(k)}
    assert "# edited by hand" not in snippet.read_text()


def test_a_missing_result_reruns_its_job_and_the_jobs_after_it(work):
    (work / RES / "check/L1_T002.json").unlink()
    ran = run_once(work)
    assert {k: ran.get(k) for k in EVALUATION} == {"build_task": None, "check_task": 1, "time_task": 1}
    assert ran.get("aggregate_results") == 1
    time = json.loads((work / RES / "time/paper/default/L1_T002.json").read_text())
    assert time["upstream_sha256"] == staleness.sha256_bytes((work / RES / "check/L1_T002.json").read_bytes())


def test_nothing_to_do_says_so_and_how_to_measure_afresh(work):
    proc = snakemake(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0
    line = next(x for x in out.splitlines() if x.startswith("Nothing to do:"))
    assert "measured on the CPU" in line and "results_dir=results/mine" in line
    (work / "mine.yaml").write_text("results_dir: results/mine\n")
    fresh = snakemake(work, "-n", configfile="mine.yaml")
    counts = job_counts(fresh.stdout)
    assert counts.get("build_task") == 3 and counts.get("time_task") == 3, fresh.stdout[-2000:]


def stale_time_result(work, tid="L1_T002"):
    """Make ``tid``'s time result stale (another timing version); returns its path."""
    path = work / RES / f"time/paper/default/{tid}.json"
    res = json.loads(path.read_text())
    res["timing_design"] = 5
    path.write_text(json.dumps(res))
    return path


def test_a_narrower_run_leaves_stale_results_outside_it_even_in_a_fresh_clone(work):
    """A stale result of a task the run does not select is kept (the tables read it), also when
    the task folders are missing and split anew, as in a fresh clone: the split then updates every
    folder, which must not plan the jobs of results outside the selection."""
    stale_time_result(work, "L1_T002")
    shutil.rmtree(work / RES / "tasks")
    (work / "narrow.yaml").write_text('tasks: ["1/1"]\n')
    counts = job_counts(snakemake(work, "-n", configfile="narrow.yaml").stdout)
    assert counts.get("split_release") == 1 and not {k: counts.get(k) for k in EVALUATION if counts.get(k)}, counts
    # the run that selects it re-times it
    counts = job_counts(snakemake(work, "-n").stdout)
    assert counts.get("time_task") == 1, counts


def test_a_marker_left_by_a_killed_run_reruns_its_job_after_the_result_is_copied(work):
    """A killed run leaves its stale markers behind. Snakemake reruns a job whose marker is newer
    than its output; a result copied or checked out since is newer than that marker, and must
    still be re-timed: the marker's name carries the result's date, so the run makes a new one."""
    path = stale_time_result(work, "L1_T002")
    dry = snakemake(work, "-n").stdout
    left = sorted(set(re.findall(r"results/demo/stale/time/paper/default/L1_T002\.\w+\.txt", dry)))
    assert len(left) == 1, dry[-2000:]
    marker = work / left[0]
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("left by a killed run\n")
    os.utime(marker, (1, 1))
    path.touch()  # the result copied or checked out after the killed run
    counts = job_counts(snakemake(work, "-n").stdout)
    assert counts.get("time_task") == 1, counts
