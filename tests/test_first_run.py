"""The main command as a new user runs it on a CPU-only clone: the committed h100 results, the
release downloaded (no network) or on disk (release_dir: what a download leaves), bad input.

Whatever happens, no committed file changes, and a GPU is asked for only when a job that
would really run needs one, before anything is downloaded.
"""

import os
import shutil

import pytest
from helpers import SNAKEMAKE, copy_committed, copy_workflow, job_counts, run, tree_digest

#: no GPU, whatever the machine has
CPU_ONLY = dict(os.environ, CUDA_VISIBLE_DEVICES="")
#: a mirror whose host never resolves (RFC 2606): the download fails as without network
NO_NETWORK = "upstream:\n  base_url: http://l1bench-no-network.invalid\n"
MISSING = "time/paper/default/L1_T001.json"  # its check passed: only a GPU can make it
EVALUATION = {"build_task", "check_task", "time_task", "scan_references"}


@pytest.fixture
def clone(tmp_path):
    copy_workflow(tmp_path)
    copy_committed(tmp_path)
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


def test_without_network_no_committed_result_is_replanned(clone):
    """Every result is committed: nothing needs a GPU; the run fails only on the download,
    at once, saying what to do, and changes nothing."""
    before = tree_digest(clone / "results/h100")
    proc, out = main_command(clone, configfile="offline.yaml")
    assert proc.returncode != 0
    planned = job_counts(out)
    assert planned.get("fetch_release_file") == 3 and not EVALUATION & set(planned), planned
    assert "download failed (no network?)" in out and "release_dir=FOLDER" in out
    assert "needs a CUDA GPU" not in out and "CUDA fault" not in out
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


def test_without_network_a_forced_result_asks_to_split_first(clone):
    """A committed result to be redone (here forced) while the release is still to be fetched
    and split: one line saying to split first, before any download; nothing changes."""
    before = tree_digest(clone / "results/h100")
    cmd = SNAKEMAKE + ["--cores", "1", "--configfile", "offline.yaml", "--forcerun", "check_task"]
    cmd += ["--config", "device=h100"]
    proc = run(cmd, clone, env=CPU_ONLY)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "results/h100/check/L1_T001.json and 249 more would be redone before the release is split" in out
    assert "--until split_release" in out and not (clone / "resources").exists()
    assert tree_digest(clone / "results/h100") == before


def test_a_bad_environment_setting_stops_the_run_in_one_line_before_any_job(tmp_path):
    copy_workflow(tmp_path)
    for name, value, line in (
        ("L1BENCH_COMPILE_THREADS", "0", "L1BENCH_COMPILE_THREADS='0': expected a whole number of threads"),
    ):
        proc = run(SNAKEMAKE + ["-n", "--config", "device=demo"], tmp_path, env=dict(os.environ, **{name: value}))
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and line in out, out[-1500:]
        assert "Building DAG" not in out
