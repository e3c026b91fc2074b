"""The workflow planned and refused from the command line, beside the demo's end-to-end run
(test_pipeline_demo.py; a file of its own so that the two run in parallel): a GPU release on a
machine without a GPU, every release's plan, bad input as one line, committed results not
planned again, the strict modes.
"""

import hashlib
import json
import re
import shutil
import subprocess

import pytest
import yaml
from helpers import ROOT, SNAKEMAKE, copy_workflow, job_counts


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


def test_the_demo_reads_the_release_dir_it_is_given(tmp_path):
    """device=demo (the default) with release_dir: that folder is the demo's release, as
    config/demo is without it. One that is not there, or holds a broken release, stops the run
    with one line naming it; a shortened copy plans its own tasks. Nothing is written."""
    copy_workflow(tmp_path)
    mine = tmp_path / "my-demo/optimized_cuda_code"
    mine.mkdir(parents=True)
    lines = (ROOT / "config/demo/optimized_cuda_code/demo.json").read_text().splitlines()

    def plan(release_dir):
        cmd = SNAKEMAKE + ["-n", "--cores", "2", "--config", f"release_dir={release_dir}"]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    rc, out = plan("/no/such/dir")
    assert rc != 0 and "release_dir=/no/such/dir: no such folder (a demo release folder holds " \
        "optimized_cuda_code/demo.json, as config/demo does)" in out, out[-1500:]
    (mine / "demo.json").write_text(lines[0] + "\n" + lines[1][:150] + "\n")  # truncated line 2
    rc, out = plan(mine.parent)
    assert rc != 0 and f"{mine / 'demo.json'}:2: invalid JSON" in out, out[-1500:]
    (mine / "demo.json").write_text("\n".join(lines[:3]) + "\n")  # its first three tasks
    rc, out = plan(mine.parent)
    assert rc == 0 and job_counts(out)["check_task"] == 3, out[-1500:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def test_strict_modes_limit_the_strict_jobs(tmp_path):
    """protocol=both with strict.modes=[default]: every mode paper-timed, only default strictly."""
    copy_workflow(tmp_path)
    (tmp_path / "strict.yaml").write_text("protocol: both\nstrict:\n  modes: [default]\n")
    proc = subprocess.run(SNAKEMAKE + ["-n", "--cores", "2", "--configfile", "strict.yaml", "--config", "device=demo"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    release = ROOT / "config/demo/optimized_cuda_code/demo.json"
    n_tasks = sum(1 for line in release.read_text().splitlines() if line.strip())
    assert job_counts(proc.stdout)["time_task"] == n_tasks * (5 + 1)
    planned = set(re.findall(r"results/demo/time/(\w+)/(\w+)/L\d_T\d{3}\.json", proc.stdout))
    assert ("strict", "default") in planned and ("strict", "cudnn") not in planned
    assert ("paper", "cudnn") in planned
