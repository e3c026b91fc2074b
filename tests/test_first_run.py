"""The main command as a new user runs it on a CPU-only clone: the committed h100 results, the
release downloaded (no network) or on disk (release_dir: what a download leaves), bad input.

Whatever happens, no committed file changes, and a GPU is asked for only when a job that
would really run needs one, before anything is downloaded.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import CPU_ONLY, ROOT, SNAKEMAKE, copy_committed, copy_workflow, job_counts, run, tree_digest

#: a mirror whose host never resolves (RFC 2606): the download fails as without network
NO_NETWORK = "upstream:\n  base_url: http://l1bench-no-network.invalid\n"
MISSING = "time/paper/default/L1_T001.json"  # its check passed: only a GPU can make it
EVALUATION = {"build_task", "check_task", "time_task", "scan_references"}


@pytest.fixture
def clone(tmp_path, current_h100):
    """A fresh clone whose committed h100 results are all current (``current_h100``)."""
    copy_workflow(tmp_path)
    copy_committed(tmp_path, src=current_h100)
    (tmp_path / "offline.yaml").write_text(NO_NETWORK)
    return tmp_path


@pytest.fixture
def release_copy(tmp_path, release_dir):
    """A local copy of the release, as a download leaves it (release_dir)."""
    out = tmp_path / "release"
    for rel in ("optimized_cuda_code/h100.json", "more_baselines/cuda_graph.json", "more_baselines/cudnn.json"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(release_dir / rel, out / rel)
    return out


def main_command(work, *config, configfile=None, dry=False):
    cmd = SNAKEMAKE + ["--cores", "1"] + (["-n"] if dry else [])
    cmd += ["--configfile", configfile] if configfile else []
    proc = run(cmd + ["--config", "device=h100", *config], work, env=CPU_ONLY)
    return proc, proc.stdout + proc.stderr


def test_without_network_nothing_is_to_be_done(clone):
    """Every result is committed and current: the main command downloads nothing, plans no job,
    says where the tables come from and how to measure afresh, and changes nothing."""
    before = tree_digest(clone / "results/h100")
    proc, out = main_command(clone, configfile="offline.yaml")
    assert proc.returncode == 0, out[-2000:]
    assert "Nothing to be done" in out and not (clone / "resources").exists()
    line = next(x for x in out.splitlines() if x.startswith("Nothing to do:"))
    assert "the tables in results/h100 are current with its results (measured on NVIDIA" in line
    assert line.endswith("to measure afresh: snakemake --cores 1 --config device=h100 results_dir=results/mine")
    assert tree_digest(clone / "results/h100") == before


def test_without_network_a_gpu_job_stops_the_run_before_any_download(clone):
    (clone / "results/h100" / MISSING).unlink()
    before = tree_digest(clone / "results/h100")
    proc, out = main_command(clone, configfile="offline.yaml")
    assert proc.returncode != 0
    lines = [line for line in out.splitlines() if "needs a CUDA GPU" in line]
    assert len(lines) == 1 and f"for 1 check/time job (results/h100/{MISSING})" in lines[0], out[-2000:]
    assert not (clone / "resources").exists() and not (clone / "logs/fetch_release_file").exists()
    assert tree_digest(clone / "results/h100") == before
    # a dry run still plans everything
    proc, out = main_command(clone, configfile="offline.yaml", dry=True)
    assert proc.returncode == 0, out[-2000:]
    planned = job_counts(out)
    assert planned.get("time_task") == 1 and planned.get("fetch_release_file") == 3


def test_with_the_release_on_disk_nothing_is_to_be_done(clone, release_copy):
    """What the download leaves behind (release_dir): the committed results and tables are
    current, so nothing runs and nothing changes (not even the report's date)."""
    before = tree_digest(clone / "results/h100")
    proc, out = main_command(clone, f"release_dir={release_copy}")
    assert proc.returncode == 0, out[-2000:]
    assert "Nothing to be done" in out
    assert tree_digest(clone / "results/h100") == before


def test_with_the_release_on_disk_a_gpu_job_stops_the_run(clone, release_copy):
    (clone / "results/h100" / MISSING).unlink()
    before = tree_digest(clone / "results/h100")
    proc, out = main_command(clone, f"release_dir={release_copy}")
    assert proc.returncode != 0
    assert f"needs a CUDA GPU for 1 check/time job (results/h100/{MISSING})" in out
    assert tree_digest(clone / "results/h100") == before


def test_the_main_command_runs_gpu_jobs_and_builds_side_by_side(clone, release_copy):
    """Under the main command's `--cores 1`, a check or time job takes no core on a GPU
    (plan.evaluation_threads): the profile's `gpu` slots say how many are in flight. Nor does a
    build that compiles an extension (plan.build_threads): the `builds` slots cap those. With a
    core each, the main command ran GPU jobs one at a time (3.7x slower, #13) and built the 78
    extensions one after another. A build that compiles nothing still takes a core."""
    (clone / "results/h100" / MISSING).unlink()
    (clone / "results/h100/time/paper/cudnn/L1_T001.json").unlink()
    for tid in ("L1_T003", "L1_T002"):  # compiles an extension; compiles nothing
        for stage in ("build", "check"):  # a build is planned for a check to be made
            (clone / f"results/h100/{stage}/{tid}.json").unlink()
    proc, out = main_command(clone, f"release_dir={release_copy}", dry=True)
    assert proc.returncode == 0, out[-2000:]
    jobs = out.split("\nrule ")[1:]
    gpu_jobs = [block for block in jobs if block.startswith(("time_task:", "check_task:"))]
    # the two checks, the two tasks' time jobs after them, L1_T001's two
    assert len(gpu_jobs) >= 6 and all("\n    threads: 0\n" in block for block in gpu_jobs), out[-3000:]
    builds = {b.split("wildcards: tid=")[1].split()[0]: b for b in jobs if b.startswith("build_task:")}
    assert "\n    threads: 0\n" in builds["L1_T003"] and "builds=1" in builds["L1_T003"]
    assert "threads:" not in builds["L1_T002"] and "builds=0" in builds["L1_T002"]  # 1 goes unsaid


def test_a_release_dir_that_is_not_one_is_one_line_whatever_is_committed(clone, tmp_path):
    for dry in (False, True):
        proc, out = main_command(clone, "release_dir=/no/such/dir", dry=dry)
        assert proc.returncode != 0
        assert "release_dir=/no/such/dir: no such folder" in out
        assert "Nothing to be done" not in out
    empty = tmp_path / "not-a-release"
    (empty / "more_baselines").mkdir(parents=True)
    proc, out = main_command(clone, f"release_dir={empty}")
    assert proc.returncode != 0
    assert f"release_dir={empty}: {empty}/optimized_cuda_code/h100.json not found" in out


def test_a_bad_config_value_is_one_line(tmp_path):
    copy_workflow(tmp_path)
    for setting, line in (
        ("device=h200", "config device: 'h200' is not one of"),
        ("max_attempts=-1", "config max_attempts: -1 is less than the minimum of 0"),
    ):
        proc = run(SNAKEMAKE + ["-n", "--config", setting], tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and line in out, out[-1500:]
        assert "Failed validating" not in out and "On instance" not in out


def test_a_forced_check_is_planned_after_the_download_and_split_with_its_time_jobs(clone):
    """A committed result to be redone (here forced) takes its task folder: the release is
    fetched and split first, and the time jobs after the forced checks rerun in the same run."""
    cmd = SNAKEMAKE + ["--cores", "1", "-n", "--configfile", "offline.yaml", "--forcerun", "check_task"]
    proc = run(cmd + ["--config", "device=h100"], clone, env=CPU_ONLY)
    planned = job_counts(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    assert planned.get("fetch_release_file") == 3 and planned.get("split_release") == 1, planned
    assert planned.get("check_task") == 250 and planned.get("time_task") >= 1250, planned
    assert not (clone / "resources").exists()


def snapshot(root):
    """{path: (mtime, size)} of every file below ``root`` but .git/ and .snakemake/."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(Path(root).rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".snakemake")
    }


def committed_results_current(res) -> bool:
    """Whether every committed check and time result is of the current timing version and drew
    its inputs as the protocol draws them now."""
    import json

    from l1bench.timing import TIMING_VERSION

    for path in [*res.glob("check/*.json"), *res.glob("time/*/*/*.json")]:
        got = json.loads(path.read_text())
        if (got.get("params") or {}).get("inputs_on_device"):
            return False
        if any(key in got and got[key] != TIMING_VERSION for key in ("timing_version", "timing_design")):
            return False
    return True


def test_parsing_writes_nothing_and_a_fresh_clone_plans_no_gpu_job(tmp_path, release_dir):
    """A dry run and --lint, for the demo and for h100 with its release on disk, on a fresh
    clone with the committed results: no file outside .snakemake/ is written or touched. The
    h100 dry run has nothing to do when every committed result is current; where some are of
    another timing version or drew their inputs on the GPU (docs/rerun-policy.md), it plans
    their checks and time jobs again, and no build."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    before = snapshot(clone)
    h100 = ["device=h100", f"release_dir={release_dir}"]
    for config in (["device=demo"], h100):
        for flag in ("-n", "--lint"):
            proc = run(SNAKEMAKE + ["--cores", "1", flag, "--config", *config], clone, env=CPU_ONLY)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, out[-2000:]
            if config == h100 and flag == "-n":
                if committed_results_current(ROOT / "results" / "h100"):
                    assert "Nothing to be done" in out and not set(job_counts(out)), out[-2000:]
                else:
                    jobs = job_counts(out)
                    assert jobs.get("mark_stale") and jobs.get("time_task"), out[-2000:]
                    assert set(jobs) <= {"mark_stale", "split_release", "check_task", "time_task",
                                         "aggregate_results", "all"}, jobs
    assert snapshot(clone) == before
    assert not subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
