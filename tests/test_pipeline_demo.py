"""End to end on the embedded CPU demo release: statuses, failure isolation, reruns.

Runs the real workflow (snakemake in a subprocess) in a copy of the repository. The tests
that need the demo's first run (about two minutes on two cores) are marked slow.
"""

import json
import os
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
    # where a machine-wide lock would go: a CPU (demo) run must not use it (l1bench.job)
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
    assert all("held the CPU lock for more than 10 s" in a["error"] for a in hung)  # timeouts.demo_section
    log = (work / "logs/demo/check_task/L1_T005.log").read_text()  # the last attempt's
    assert "held the CPU lock for more than 10 s" in log and "giving up, status timeout" in log
    assert "SIGKILL" in (work / "logs/demo/check_task/L1_T006.log").read_text()
    assert "| timeout" in (res / "per_task.md").read_text() and "| crashed" in (res / "per_task.md").read_text()
    assert (res / "figures/measured_vs_published.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_demo_names_the_device_and_torch_it_ran_on(demo_run):
    """The report says the demo was measured on the CPU; the extension page names the torch (and
    CUDA) of the results, from their provenance."""
    import torch

    work, _ = demo_run
    report = (work / "results/demo/README.md").read_text()
    assert "Measured on the CPU, published on the release's GPU" in report and "this GPU" not in report
    assert "at timing version" in report and " (CPU)" in report and "GPU recorded" not in report
    page = (work / "results/demo/extension_failures.md").read_text()
    cuda = f" / CUDA {torch.version.cuda}" if torch.version.cuda else " without CUDA"
    assert f"that torch {torch.__version__}{cuda} (what these results ran on) no longer offers" in page


@pytest.mark.slow
def test_task_workers_serve_the_checks_and_eager_steps(demo_run):
    """Checks and eager-mode time results say which task worker served them; a task's step that
    came while the worker of its step before was still waiting (its idle time not run out, and not
    retired) was served by that worker; compile-mode results name none; every result records the
    timing version; no worker outlives the run."""
    from helpers import missed_hand_offs, processes_in, wait_for

    from l1bench.timing import TIMING_VERSION

    work, _ = demo_run
    assert wait_for(lambda: not [p for p in processes_in(work) if "pool.server" in p[1]], 15)
    res = work / "results/demo"
    for path in sorted(res.glob("time/paper/*/L1_T00[12].json")) + sorted(res.glob("check/L1_T00[12].json")):
        got = json.loads(path.read_text())
        assert got["timing_version"] == TIMING_VERSION, path
        assert ("task_worker" in got["provenance"]) != ("torch_compile" in str(path)), path
    assert not missed_hand_offs(res)
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
