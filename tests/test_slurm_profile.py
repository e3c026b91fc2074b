"""The SLURM profile, its requirements and the local test cluster's configuration, without SLURM.

The profile is rendered as Snakemake renders it (YTE) from L1_SLURM_* settings, and the sbatch
command of each rule is built by the pinned plugin's own functions, so a resource name the
plugin does not know (or a renamed one) shows here. tests/test_slurm.py runs it for real.
"""

import ast
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import SNAKEMAKE, copy_workflow, script_module

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "slurm" / "config.yaml"
SITE = {"L1_SLURM_GPU_PARTITION": "gpuq", "L1_SLURM_CPU_PARTITION": "cpuq", "L1_SLURM_GPU_MODEL": "h100",
        "L1_SLURM_ACCOUNT": "proj1"}


def render(monkeypatch, **env):
    """The profile as Snakemake reads it, with exactly these L1_SLURM_* settings."""
    import yte

    for key in list(os.environ):
        if key.startswith("L1_SLURM_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with open(PROFILE) as fh:
        return yte.process_yaml(fh, require_use_yte=True)


class Resources(dict):
    """A job's resources as the plugin reads them (``.get`` and attributes)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Job:
    def __init__(self, resources, threads=1):
        self.resources = Resources(resources)
        self.threads = threads


def job_of(profile, rule, threads=1):
    """A job of ``rule`` with the profile's default-resources and set-resources (strings are
    Python literals, as Snakemake evaluates them)."""
    res = dict(profile["default-resources"]) | dict(profile["set-resources"].get(rule, {}))
    values = {k: ast.literal_eval(v) if isinstance(v, str) else v for k, v in res.items()}
    if rule in ("check_task", "time_task"):
        values.setdefault("gpu", 1)  # the rule's own resources: gpu=1
    return Job(values, threads)


def sbatch(profile, rule, threads=1):
    """The sbatch command line the pinned plugin builds for a job of ``rule``."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = job_of(profile, rule, threads)
    part = job.resources.get("slurm_partition")
    params = {"run_uuid": "RUN", "slurm_logfile": "LOG", "comment_str": f"rule_{rule}",
              "account": f" -A {job.resources['slurm_account']}" if job.resources.get("slurm_account") else "",
              "partition": f" -p {part}" if part else "", "workdir": "WD"}
    return get_submit_command(job, params) + set_gres_string(job)


def test_profile_sends_builds_to_cpu_and_checks_and_times_to_gpu(monkeypatch):
    profile = render(monkeypatch, **SITE)
    assert profile["executor"] == "slurm" and profile["retries"] >= 1 and profile["keep-going"]
    for rule in ("check_task", "time_task"):
        cmd = sbatch(profile, rule)
        assert " -p gpuq" in cmd and " -A proj1" in cmd and "--gpus=h100:1" in cmd, cmd
        assert "--cpus-per-gpu=4" in cmd and "--mem 32000" in cmd and "--cpus-per-task" not in cmd, cmd
    for rule, cpus in (("build_task", 4), ("scan_references", 4), ("aggregate_results", 1)):
        cmd = sbatch(profile, rule)
        assert " -p cpuq" in cmd and "--gpus" not in cmd and f"--cpus-per-task={cpus}" in cmd, cmd
        assert "--mem 8000" in cmd and " -t " in cmd, cmd


def test_profile_defaults_and_overrides(monkeypatch):
    profile = render(monkeypatch, L1_SLURM_GPU_PARTITION="gpu")
    assert "slurm_account" not in profile["default-resources"]  # the plugin's own guess
    cmd = sbatch(profile, "time_task")
    assert " -p gpu" in cmd and "--gpus=1" in cmd and " -A " not in cmd, cmd  # any GPU model
    assert "-p" not in sbatch(profile, "build_task").split("--ntasks")[0].split("--comment")[1]  # cluster default
    profile = render(monkeypatch, L1_SLURM_GPU_PARTITION="gpu", L1_SLURM_CPUS_PER_GPU="8",
                     L1_SLURM_GPU_MEM_MB="64000", L1_SLURM_JOBS="12", L1_SLURM_CPUS="16")
    assert "--cpus-per-gpu=8" in sbatch(profile, "check_task") and "--mem 64000" in sbatch(profile, "check_task")
    assert "--cpus-per-task=16" in sbatch(profile, "build_task") and profile["jobs"] == 12
    # no GPU (the CPU demo on a CPU-only cluster): no GPU request, CPUs per task instead
    cmd = sbatch(render(monkeypatch, L1_SLURM_GPU_PARTITION="cpu", L1_SLURM_GPUS="0"), "check_task")
    assert "--gpus" not in cmd and "--cpus-per-task=4" in cmd, cmd


def test_default_cpus_per_gpu_leave_a_timing_cpu(monkeypatch):
    """A GPU job's CPUs are enough for the worker to reserve one for the timing thread
    (timingcpus.core_plan: fewer than four CPUs reserve none)."""
    from l1bench.gpu import timingcpus

    res = job_of(render(monkeypatch, L1_SLURM_GPU_PARTITION="gpu"), "time_task").resources
    timing, rest = timingcpus.core_plan(set(range(res["cpus_per_gpu"])), res["gpu"], siblings=lambda c: {c})
    assert timing and rest


def test_runtime_limits_cover_the_jobs_own_timeouts(monkeypatch):
    """SLURM must not kill a job before the workflow's own timeout does (that one records the
    attempt); a minute and more of margin for start-up."""
    profile = render(monkeypatch, L1_SLURM_GPU_PARTITION="gpu")
    timeouts = yaml.safe_load((ROOT / "config/config.yaml").read_text())["timeouts"]
    for rule, kind in (("build_task", "build"), ("check_task", "check"), ("time_task", "time")):
        runtime = job_of(profile, rule).resources["runtime"]
        assert runtime * 60 >= timeouts[kind] + 120, (rule, runtime)


@pytest.mark.parametrize("env, message", [
    ({}, "set L1_SLURM_GPU_PARTITION to the partition of the GPU jobs"),
    (
        {"L1_SLURM_GPU_PARTITION": "gpu", "L1_SLURM_CPUS_PER_GPU": "four"},
        "L1_SLURM_CPUS_PER_GPU='four': expected an integer >= 1",
    ),
    ({"L1_SLURM_GPU_PARTITION": "gpu", "L1_SLURM_GPUS": "-1"}, "L1_SLURM_GPUS='-1': expected an integer >= 0"),
])
def test_bad_settings_stop_with_one_line(monkeypatch, env, message):
    with pytest.raises(Exception, match=re.escape(message)):
        render(monkeypatch, **env)


def test_snakemake_plans_with_the_profile(tmp_path):
    """Snakemake reads the profile (the plugin installed) and plans the demo; without the GPU
    partition it stops before planning, the setting named in its last line."""
    copy_workflow(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("L1_SLURM_")}
    cmd = SNAKEMAKE + ["--workflow-profile", "profiles/slurm", "-n", "--config", "device=demo"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                          env=env | {"L1_SLURM_GPU_PARTITION": "gpu"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r"time_task\s+55", proc.stdout)
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode != 0
    assert "set L1_SLURM_GPU_PARTITION" in proc.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------ requirements, wheelhouse


@pytest.fixture(scope="module")
def wheelhouse():
    return script_module("build_wheelhouse")


def installed_requires(name, version):
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return (dist.requires or []) if dist.version == version else None


def test_slurm_pins_close_the_node_wheelhouse(wheelhouse):
    """The GPU-node list plus the SLURM list pin everything the plugin needs (read from the
    installed metadata: what --slurm downloads is closed); without the SLURM list it is not."""
    slurm = wheelhouse.read_requirements(wheelhouse.SLURM_REQUIREMENTS)
    assert all("==" in r for r in slurm)
    for line in slurm:  # installed as pinned (requirements-dev.txt includes the list)
        name, version = line.split("==")
        assert importlib.metadata.version(name) == version, line
    both = wheelhouse.merge_requirements([wheelhouse.DEFAULT_REQUIREMENTS, wheelhouse.SLURM_REQUIREMENTS])
    assert wheelhouse.missing_from_pins(both, installed_requires) == []
    plugin_only = wheelhouse.read_requirements(wheelhouse.DEFAULT_REQUIREMENTS) + slurm[:1]
    gaps = wheelhouse.missing_from_pins(plugin_only, installed_requires)
    assert any("requires pandas" in g and "(not pinned)" in g for g in gaps), gaps


def test_conflicting_pins_are_one_line(tmp_path, wheelhouse):
    (tmp_path / "a.txt").write_text("pandas==3.1.1\n")
    (tmp_path / "b.txt").write_text("# same\npandas==3.1.1\nnumpy==2.4.6\n")
    assert wheelhouse.merge_requirements([tmp_path / "a.txt", tmp_path / "b.txt"]) == ["pandas==3.1.1", "numpy==2.4.6"]
    (tmp_path / "c.txt").write_text("pandas==2.0.0\n")
    with pytest.raises(ValueError, match=r"c.txt: pandas==2.0.0 conflicts with pandas==3.1.1 in .*a.txt"):
        wheelhouse.merge_requirements([tmp_path / "a.txt", tmp_path / "c.txt"])


def test_wheelhouse_slurm_option_adds_the_plugin(tmp_path, wheelhouse, monkeypatch):
    """--slurm downloads the SLURM list too (pip is not run here: the command is recorded)."""
    calls = []
    monkeypatch.setattr(
        wheelhouse.subprocess, "run", lambda cmd: calls.append(cmd) or subprocess.CompletedProcess(cmd, 1)
    )
    assert wheelhouse.main(["--dest", str(tmp_path), "--slurm"]) == 1  # the recorded pip "failed"
    assert "snakemake-executor-plugin-slurm==2.8.0" in calls[0] and "snakemake==9.27.1" in calls[0]
    calls.clear()
    wheelhouse.main(["--dest", str(tmp_path)])
    assert not [c for c in calls[0] if c.startswith("snakemake-executor-plugin")]


# ------------------------------------------------------------------ the local test cluster

SLURMD_C = (
    "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105\n"
    "UpTime=0-01:33:34\n"
)


def test_local_cluster_configuration(tmp_path):
    import slurm_local as sl

    hw = sl.parse_slurmd_c(SLURMD_C)
    assert hw["CPUs"] == "2" and hw["RealMemory"] == "24105"
    with pytest.raises(sl.SlurmUnavailable, match="no NodeName= line"):
        sl.parse_slurmd_c("slurmd: error: something\n")
    lay = sl.Layout(tmp_path, "vm", ports={"slurmctld": 1, "slurmd": 2, "slurmdbd": 3, "mysql": 4})
    conf = sl.slurm_conf(lay, hw, 2)
    lines = [line for line in conf.splitlines()[1:] if not line.startswith(("NodeName", "Partition"))]
    settings = dict(line.split("=", 1) for line in lines)
    assert settings["SlurmctldHost"] == "vm(127.0.0.1)"
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["AccountingStoragePort"] == "3" and settings["AccountingStorageTRES"] == "gres/gpu"
    assert settings["SelectType"] == "select/cons_tres" and settings["GresTypes"] == "gpu"
    assert "NodeName=l1node NodeAddr=127.0.0.1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 " \
           "RealMemory=24105 Gres=gpu:fake:2 State=UNKNOWN" in conf
    assert "PartitionName=cpu Nodes=l1node Default=YES" in conf and "PartitionName=gpu Nodes=l1node " in conf
    assert "StoragePort=4" in sl.slurmdbd_conf(lay) and "StorageType=accounting_storage/mysql" in sl.slurmdbd_conf(lay)
    gres = sl.gres_conf(lay, 2, files=("/dev/null", "/nonexistent", "/dev/zero"))
    assert gres.splitlines()[1:] == ["NodeName=l1node Name=gpu Type=fake File=/dev/null",
                                     "NodeName=l1node Name=gpu Type=fake File=/dev/zero"]
    for text in (conf, gres, sl.slurmdbd_conf(lay)):
        (tmp_path / "x.conf").write_text(text)
        assert sl.written_by_us(tmp_path / "x.conf") == tmp_path
    (tmp_path / "x.conf").write_text("ClusterName=theirs\n")
    assert sl.written_by_us(tmp_path / "x.conf") is None
    assert sl.fake_gpu_count(8, files=("/dev/null", "/dev/zero")) == 2 and sl.fake_gpu_count(1) == 1


def test_local_cluster_needs_root(tmp_path, monkeypatch):
    import slurm_local as sl

    monkeypatch.setattr(sl.os, "geteuid", lambda: 1000)
    with pytest.raises(sl.SlurmUnavailable, match="needs root"):
        sl.start(tmp_path)


# ------------------------------------------------------------------ jobs on another host


def test_a_job_on_another_host_does_not_watch_the_workflow(monkeypatch):
    """The workflow's token names its host; a cluster job elsewhere cannot see that process
    (sbatch passes the environment on) and must not take it for gone."""
    from l1bench import lifeline

    monkeypatch.delenv(lifeline.WORKFLOW_ENV, raising=False)  # restored afterwards
    token = lifeline.mark_workflow()
    assert token.endswith(f"@{socket.gethostname()}") and os.environ[lifeline.WORKFLOW_ENV] == token
    assert lifeline.alive(token)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{lifeline.process_token(gone.pid)}@{socket.gethostname()}"
    assert not lifeline.alive(dead)
    assert lifeline.alive(f"{gone.pid}:1@another-node")  # not visible from here: never stop for it
