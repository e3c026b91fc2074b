"""End to end on the embedded CPU demo release: statuses, failure isolation, reruns.

Runs the real workflow (snakemake in a subprocess) in a copy of the repository. The tests
that need the demo's first run (about two minutes on two cores) are marked slow.
"""

import json
import os
import re
import shutil
import subprocess

import pytest
from helpers import ROOT, SNAKEMAKE, copy_workflow, job_counts

#: What each demo task must end up as (see scripts/make_demo_release.py).
EXPECTED_CHECK = {
    "L1_T001": "pass",
    "L1_T002": "pass",
    "L1_T003": "incorrect",
    "L1_T004": "runtime_error",
    "L1_T007": "no_code",
    "L2_T001": "lazy",
    "L2_T002": "missing_model_new",
    "L2_T003": "compile_error",
    "L2_T004": "no_code",
}
#: hangs / kills its process: each attempt of its check breaks, the last one (max_attempts, 3)
#: writes the terminal status, carried into its time jobs
BROKEN = {"L1_T005": ("timeout", "section_timeout"), "L1_T006": ("crashed", "crash")}


def snakemake(workdir, *args, check=None, env=None):
    cmd = SNAKEMAKE + ["--cores", "2", "--config", "device=demo", *args]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900, env=env)
    if check is not None:
        assert proc.returncode == check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    copy_workflow(work)
    # where a machine-wide lock would go: a CPU (demo) run must not use it (l1bench run_task)
    machine_wide = tmp_path_factory.mktemp("machine-wide-locks")
    first = snakemake(work, env=dict(os.environ, L1BENCH_LOCK_DIR=str(machine_wide)))
    assert not list(machine_wide.iterdir())
    return work, first


def readme_block(marker):
    """The lines of the README's fenced block after ``marker``, stripped."""
    block = (ROOT / "README.md").read_text().split(marker, 1)[1].split("```", 2)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_first_run_ends_as_the_readme_says(demo_run):
    """The Quick start's one command exits 0 and ends as the README quotes it: exactly these
    lines, in order, the one-line outcome among them."""
    _, first = demo_run
    assert first.returncode == 0, first.stderr[-3000:]
    printed = [line.strip() for line in (first.stdout + first.stderr).splitlines()]
    at = 0
    for line in readme_block("demo-first-run-ending"):
        if "…" not in line:
            assert line in printed[at:], (line, printed[-15:])
            at = printed.index(line, at) + 1
        else:
            at += 1
    assert at == len(printed)  # and nothing after them


@pytest.mark.slow
def test_first_run_gives_the_broken_tasks_failed_rows(demo_run):
    """The hanging and the crashing task break in every attempt: retried within the run, the
    third attempt writes the terminal result, carried into every mode, and the tables follow."""
    work, _ = demo_run
    res = work / "results/demo"
    for tid, status in EXPECTED_CHECK.items():
        check = json.loads((res / f"check/{tid}.json").read_text())
        assert check["status"] == status, (tid, check)
    for tid, (status, kind) in BROKEN.items():
        check = json.loads((res / f"check/{tid}.json").read_text())
        assert check["status"] == status and check["reason"].startswith("broke in all 3 attempts"), check
        assert [a["kind"] for a in check["failed_attempts"]] == [kind] * 3
        assert not (res / f"attempts/check/{tid}.json").exists()  # moved into the result
        times = [json.loads(p.read_text())["status"] for p in res.glob(f"time/paper/*/{tid}.json")]
        assert times == [status] * 5
    hung = json.loads((res / "check/L1_T005.json").read_text())["failed_attempts"]
    assert all("held the GPU lock for more than 10 s" in a["error"] for a in hung)  # timeouts.demo_section
    log = (work / "logs/demo/check_task/L1_T005.log").read_text()  # the last attempt's
    assert "held the GPU lock for more than 10 s" in log and "giving up, status timeout" in log
    assert "SIGKILL" in (work / "logs/demo/check_task/L1_T006.log").read_text()
    assert "| timeout" in (res / "per_task.md").read_text() and "| crashed" in (res / "per_task.md").read_text()
    assert (res / "figures/measured_vs_published.png").stat().st_size > 1000


@pytest.mark.slow
def test_task_workers_serve_the_checks_and_eager_steps(demo_run):
    """Checks and eager-mode time results say which task worker served them, some after an
    earlier step of their task; compile-mode results name none; every result records the timing
    version; no worker outlives the run."""
    from helpers import processes_in, wait_for

    from l1bench.timing import TIMING_VERSION

    work, _ = demo_run
    assert wait_for(lambda: not [p for p in processes_in(work) if "timing.serve" in p[1]], 15)
    res = work / "results/demo"
    steps = []
    for path in sorted(res.glob("time/paper/*/L1_T00[12].json")) + sorted(res.glob("check/L1_T00[12].json")):
        got = json.loads(path.read_text())
        assert got["timing_version"] == TIMING_VERSION, path
        if "torch_compile" in str(path):
            assert "task_worker" not in got["provenance"], path
        else:
            steps.append(got["provenance"]["task_worker"]["step"])
    assert max(steps) >= 2, steps
    fast = json.loads((res / "time/paper/default/L1_T001.json").read_text())
    assert fast["status"] == "ok" and fast["score"] > 0 and fast["n_timings"] == 70


@pytest.mark.slow
def test_time_results(demo_run):
    work, _ = demo_run
    res = work / "results/demo/time/paper"
    fast = json.loads((res / "default/L1_T001.json").read_text())
    assert fast["status"] == "ok" and fast["score"] > 0  # timings are not asserted in tests
    assert len(fast["ref_ms"]) == 7 and all(len(r) == 10 for r in fast["ref_ms"])
    assert fast["n_timings"] == 70
    assert fast["provenance"]["torch"] and fast["params"]["outer_trials"] == 7
    slow = json.loads((res / "default/L1_T002.json").read_text())
    assert slow["status"] == "ok" and slow["score"] > 0
    for mode in ("cuda_graph", "cudnn"):
        assert json.loads((res / f"{mode}/L1_T001.json").read_text())["status"] == "unsupported"
    wrong = json.loads((res / "torch_compile/L1_T003.json").read_text())
    assert wrong["status"] == "incorrect" and wrong["score"] is None
    assert json.loads((res / "default/L1_T007.json").read_text())["status"] == "no_code"


@pytest.mark.slow
def test_a_second_run_has_nothing_to_do(demo_run):
    work, _ = demo_run
    dry = snakemake(work, "-n", check=0)
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.slow
def test_aggregate_only_renders_partial_results(demo_run, tmp_path):
    copy_workflow(tmp_path, demo_run[0], extra=("results", ".snakemake"))  # with the recorded params
    res = tmp_path / "results/demo"
    (res / "check/L1_T002.json").unlink()
    for p in res.glob("time/paper/*/L1_T002.json"):
        p.unlink()
    snakemake(tmp_path, "aggregate_only=true", check=0)
    summary = (res / "summary.md").read_text()
    assert "| Mean" in summary and "Missing" in summary
    csv = (res / "scores.csv").read_text()
    assert "L1_T002" in csv and "missing" in csv and "timeout" in csv
    # a narrower selection never drops the device's other results from its tables
    snakemake(tmp_path, "aggregate_only=true", 'tasks=["1/1"]', check=0)
    assert "L1_T005" in (res / "scores.csv").read_text()
    # a changed protocol parameter makes the results stale, yet aggregate_only plans no job for it
    (tmp_path / "changed.yaml").write_text("paper:\n  outer_trials: 6\n")
    changed = ["--configfile", "changed.yaml"]
    dry = snakemake(tmp_path, "-n", *changed, check=0)
    assert "is stale: protocol parameters changed (outer_trials)" in dry.stdout
    only = job_counts(snakemake(tmp_path, "aggregate_only=true", "-n", *changed, check=0).stdout)
    assert not {"build_task", "check_task", "time_task"} & set(only)


@pytest.mark.slow
def test_fresh_clone_with_results_plans_no_evaluation(demo_run, tmp_path):
    """Results copied into a fresh checkout (new mtimes, no .snakemake) are not re-timed."""
    work, _ = demo_run
    clone = tmp_path / "clone"
    clone.mkdir()
    copy_workflow(clone, work, extra=("results",))
    # make every source and release file newer than every result
    for p in (clone / "config").rglob("*"):
        p.touch()
    counts = job_counts(snakemake(clone, "-n", check=0).stdout)
    assert not {"build_task", "check_task", "time_task"} & set(counts)


@pytest.mark.slow
def test_the_broken_tasks_are_retried_by_one_command(demo_run, tmp_path):
    """The Done line's retry command removes the broken results (l1bench failed --remove) and
    the run makes them again, each job with max_attempts new attempts; nothing else reruns."""
    work, first = demo_run
    copy_workflow(tmp_path, work, extra=("results", "logs"))
    res = tmp_path / "results/demo"
    retry = "l1bench failed --remove results/demo && snakemake --config device=demo"
    assert f"retry: {retry}" in first.stderr
    removed = subprocess.run([*SNAKEMAKE[:1], "-m", "l1bench", "failed", "--remove", "results/demo"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout
    assert len(removed.splitlines()) == len(BROKEN) * 6  # each task's check and its 5 time results
    counts = job_counts(snakemake(tmp_path, "-n", check=0).stdout)
    assert counts["check_task"] == len(BROKEN) and counts["time_task"] == len(BROKEN) * 5
    assert "build_task" not in counts
    # one attempt each now: the crashing task alone, so the run stays short
    run = snakemake(tmp_path, "max_attempts=1", 'tasks=["1/6"]', check=0)
    crashed = json.loads((res / "check/L1_T006.json").read_text())
    assert crashed["status"] == "crashed" and len(crashed["failed_attempts"]) == 1
    assert "broke in all 1 attempts" in crashed["reason"] and "SIGKILL" in crashed["reason"]
    assert "1 task broke (L1_T006 crashed; logs in logs/demo/check_task/)" in run.stderr


def test_gpu_release_without_gpu_stops_before_any_job(tmp_path, release_dir):
    """device != demo on a CPU-only machine: one line saying a GPU is needed, nothing run."""
    copy_workflow(tmp_path)
    cmd = SNAKEMAKE + ["--cores", "1", "--config", "device=h100", f"release_dir={release_dir}", 'tasks=["1/1"]']
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "needs a CUDA GPU" in out and "device=demo" in out
    res = tmp_path / "results/h100"
    assert not any((res / stage).exists() for stage in ("build", "check", "time"))  # no job ran
    dry = subprocess.run(cmd + ["-n"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and "time_task" in dry.stdout


@pytest.mark.slow
def test_results_decided_without_a_gpu_fill_in_on_a_cpu_machine(tmp_path, release_dir):
    """A task without code needs no GPU: device=h100 completes it here, every stage no_code."""
    copy_workflow(tmp_path)
    cmd = SNAKEMAKE + ["--cores", "1", "--config", "device=h100", f"release_dir={release_dir}", 'tasks=["1/8"]']
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = tmp_path / "results/h100"
    statuses = {json.loads(p.read_text())["status"] for p in res.glob("time/paper/*/L1_T008.json")}
    assert statuses == {"no_code"} and len(list(res.glob("time/paper/*/L1_T008.json"))) == 5
    assert json.loads((res / "check/L1_T008.json").read_text())["provenance"]["worker"] is False


def test_every_release_plans_from_the_command_line(tmp_path, release_dir):
    """device=3090 arrives from --config as an integer; every release plans all its jobs."""
    copy_workflow(tmp_path)
    for device in ("3090", "a100"):
        cmd = SNAKEMAKE + ["-n", "-q", "rules", "--config", f"device={device}", f"release_dir={release_dir}"]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
        assert re.search(r"time_task\s+1250", proc.stdout + proc.stderr)


def test_a_missing_slice_report_file_is_one_clear_line(tmp_path):
    cmd = SNAKEMAKE + ["-n", "--config", "device=demo", 'slice_reports=["nope/tasks.yaml"]']
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "config slice_reports: nope/tasks.yaml: no such file" in proc.stdout + proc.stderr


def test_bad_release_stops_with_one_line_and_writes_nothing(tmp_path):
    copy_workflow(tmp_path)
    rel = tmp_path / "myrelease/optimized_cuda_code"
    rel.mkdir(parents=True)
    good = (ROOT / "config/demo/optimized_cuda_code/demo.json").read_text().splitlines()
    (rel / "h100.json").write_text(good[0] + "\n" + good[1][:200] + "\n")  # truncated line 2
    cmd = SNAKEMAKE + ["--cores", "1", "-n", "--config", "device=h100", f"release_dir={tmp_path / 'myrelease'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "does not match the pinned" in proc.stdout + proc.stderr  # checksum first
    # accept this file's checksum: then the parser names the truncated line
    import hashlib

    sha = hashlib.sha256((rel / "h100.json").read_bytes()).hexdigest()
    (tmp_path / "accept.yaml").write_text(f'release_sha256:\n  "optimized_cuda_code/h100.json": "{sha}"\n')
    accepted = cmd[:-3] + ["--configfile", "accept.yaml"] + cmd[-3:]
    proc = subprocess.run(accepted, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f"{rel / 'h100.json'}:2: invalid JSON" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_committed_gpu_results_are_not_replanned(tmp_path, release_dir, current_h100):
    """A fresh clone with the committed h100 results, all current, plans only the slice's missing
    check/time jobs."""
    committed = current_h100
    copy_workflow(tmp_path)
    shutil.copytree(committed, tmp_path / "results/h100", ignore=shutil.ignore_patterns("tasks"))
    slice_cfg = "config/slices/h100_slice41.yaml"
    cmd = SNAKEMAKE + ["-n", "--cores", "1", "--configfile", slice_cfg]
    cmd += ["--config", "device=h100", f"release_dir={release_dir}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    counts = job_counts(proc.stdout)
    import yaml

    tasks = yaml.safe_load((ROOT / slice_cfg).read_text())["tasks"]
    tids = [f"L{lv}_T{int(tk):03d}" for lv, tk in (t.split("/") for t in tasks)]
    n_check = sum((committed / "check" / f"{t}.json").exists() for t in tids)
    n_time = sum((committed / "time/paper" / m / f"{t}.json").exists() for t in tids for m in
                 ("default", "torch_compile", "torch_compile_reduce_overhead", "cuda_graph", "cudnn"))
    n_build = sum((committed / "build" / f"{t}.json").exists() for t in tids)
    assert n_check and n_time  # the committed tree holds results of the slice
    assert counts.get("check_task", 0) == 41 - n_check
    assert counts.get("time_task", 0) == 41 * 5 - n_time
    assert counts.get("build_task", 0) == 41 - n_build
    # the task folders are split for the jobs that run, by a job
    assert counts.get("split_release") == (1 if counts.get("check_task") or counts.get("time_task") else None)


def test_strict_modes_limit_the_strict_jobs(tmp_path):
    """protocol=both with strict.modes=[default]: every mode paper-timed, only default strictly."""
    copy_workflow(tmp_path)
    (tmp_path / "strict.yaml").write_text("protocol: both\nstrict:\n  modes: [default]\n")
    proc = snakemake(tmp_path, "-n", "--configfile", "strict.yaml", check=0)
    release = ROOT / "config/demo/optimized_cuda_code/demo.json"
    n_tasks = sum(1 for line in release.read_text().splitlines() if line.strip())
    assert job_counts(proc.stdout)["time_task"] == n_tasks * (5 + 1)
    planned = set(re.findall(r"results/demo/time/(\w+)/(\w+)/L\d_T\d{3}\.json", proc.stdout))
    assert ("strict", "default") in planned and ("strict", "cudnn") not in planned
    assert ("paper", "cudnn") in planned
