"""lab/repeat_runs.sh without a GPU: a stand-in device_run.sh that writes one time result
per run (and records how it was started), the real l1lab retime prepare and spread repeat.
The first run's builds must reach the later runs, each run its own results_dir inside
--config, ":serial" one GPU job at a time, and the spreads written to OUT."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# device_run.sh BUDGET OUT ARGS...: one task's build, check and default-mode result (c1 1.0,
# every later run 1.1), and a record of how it was started (was the build already there? GPU_JOBS?)
DEVICE_RUN = r"""#!/usr/bin/env bash
budget=$1 out=$2; shift 2
res=; for a in "$@"; do case $a in results_dir=*) res=${a#results_dir=} ;; esac; done
tree=$res/h100
prepared=no; [ -f "$tree/build/L1_T001.json" ] && prepared=yes
ext=no; [ -f "$tree/build/ext/L1_T001/x.so" ] && ext=yes
mkdir -p "$out" "$tree/build/ext/L1_T001" "$tree/check" "$tree/time/paper/default"
[ -f "$tree/build/L1_T001.json" ] || echo '{"status": "ok"}' >"$tree/build/L1_T001.json"
[ -f "$tree/build/ext/L1_T001/x.so" ] || echo so >"$tree/build/ext/L1_T001/x.so"
echo '{"status": "pass"}' >"$tree/check/L1_T001.json"
score=1.1; case $res in *-c1) score=1.0 ;; esac
echo "{\"status\": \"ok\", \"score\": $score, \"trial_scores\": [$score], \"params\": {\"outer_trials\": 1}}" \
    >"$tree/time/paper/default/L1_T001.json"
printf '%s\n' "budget=$budget" "prepared=$prepared" "ext=$ext" "gpu_jobs=${GPU_JOBS:-}" "$@" >"$out/started.txt"
echo "$tree" >"$out/tree"  # as device_run.sh names the tree it wrote
"""


def repeat_runs(tmp_path, *argv):
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    shutil.copytree(ROOT / "lab", repo / "lab", ignore=shutil.ignore_patterns("tests", "evidence", "__pycache__"))
    (repo / "lab" / "device_run.sh").write_text(DEVICE_RUN)
    (repo / "scripts" / "offline_install.sh").write_text(": the package is installed already\n")
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "lab/repeat_runs.sh", *argv], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120, check=False), repo


def test_later_runs_reuse_the_first_runs_builds_and_the_spread_is_written(tmp_path):
    proc, repo = repeat_runs(tmp_path, "out", "d7", "c1:305", "c2:220", "s1:400:serial", "--",
                             "--configfile", "lab/runs/h100_isolation.yaml", "--config", "release_dir=.release",
                             "device=h100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = {c: (repo / "out" / c / "started.txt").read_text().splitlines() for c in ("c1", "c2", "s1")}
    assert started["c1"][:4] == ["budget=305", "prepared=no", "ext=no", "gpu_jobs="]
    assert started["c2"][:4] == ["budget=220", "prepared=yes", "ext=yes", "gpu_jobs="]
    assert started["s1"][:4] == ["budget=400", "prepared=yes", "ext=yes", "gpu_jobs=1"]
    assert started["c2"][4:] == ["--configfile", "lab/runs/h100_isolation.yaml", "--config", "release_dir=.release",
                               "device=h100", "results_dir=results/d7-c2"]
    # the later runs' checks are their own: only builds are copied in
    assert (repo / "results/d7-c2/h100/build/ext/L1_T001/x.so").stat().st_ino == \
        (repo / "results/d7-c1/h100/build/ext/L1_T001/x.so").stat().st_ino
    spread = (repo / "out" / "SPREAD-c1-c2.md").read_text()
    assert "median **10.0 %**" in spread and "`results/d7-c1/h100` and `results/d7-c2/h100`" in spread
    assert (repo / "out" / "SPREAD-c1-s1.md").exists()
    assert "c1 vs c2: * all 1: median **10.0 %**" in proc.stdout
    assert "c1 vs c2: * the run-to-run targets: median ≤ 5 %: NOT met (10.0 %)" in proc.stdout


def test_without_config_one_is_added_and_the_device_folder_is_found(tmp_path):
    proc, repo = repeat_runs(tmp_path, "out", "x", "a:10", "b:10", "--", "--configfile", "c.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "out" / "b" / "started.txt").read_text().splitlines()[4:] == \
        ["--configfile", "c.yaml", "--config", "results_dir=results/x-b"]
    assert (repo / "out" / "SPREAD-a-b.md").exists()


@pytest.mark.parametrize("argv, message", [
    (["c1:30", "--", "--config", "a=1", "--forceall"], "option --forceall follows --config"),
    (["c1", "--", "--config"], "run 'c1' is not LABEL:BUDGET_S[:serial]"),
    (["c1:30:twice", "--"], "run 'c1:30:twice' is not LABEL:BUDGET_S[:serial]"),
    (["c1:30", "--", "--config", "results_dir=results/y"], "results_dir= is set per run"),
    (["c1:30", "--config"], "'--config' comes before '--'"),
    (["c1:30"], "usage: lab/repeat_runs.sh OUT NAME"),
    (["--", "--config"], "no run named"),
])
def test_bad_arguments_stop_before_any_run_in_one_line(tmp_path, argv, message):
    proc, repo = repeat_runs(tmp_path, "out", "x", *argv)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (repo / "out").exists()


def test_a_later_run_follows_an_earlier_first_run(tmp_path):
    """FIRST_TREE: the first run came from an earlier start of the script; the one named now reuses its builds
    and is compared with it. Without the earlier tree's extensions it stops in one line."""
    proc, repo = repeat_runs(tmp_path, "out", "d7", "c1:305", "--", "--config", "device=h100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", FIRST_TREE="results/d7-c1/h100/")
    proc = subprocess.run(["bash", "lab/repeat_runs.sh", "out2", "d7", "s1:400:serial", "--", "--config",
                           "device=h100"], cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (repo / "out2" / "s1" / "started.txt").read_text().splitlines()[:4] == \
        ["budget=400", "prepared=yes", "ext=yes", "gpu_jobs=1"]
    assert "c1 vs s1: * all 1: median **10.0 %**" in proc.stdout
    assert (repo / "out2" / "SPREAD-c1-s1.md").exists()
    shutil.rmtree(repo / "results/d7-c1/h100/build/ext")
    proc = subprocess.run(["bash", "lab/repeat_runs.sh", "out3", "d7", "s2:400", "--", "--config", "device=h100"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "has no built extensions (build/ext/)" in proc.stderr
    assert not (repo / "out3" / "s2").exists()


def test_a_first_tree_the_device_kept_only_the_extensions_of_is_restored_or_stops(tmp_path):
    """A lent node's working tree follows the caller's at each run: a tree the node wrote keeps
    only its ignored build/ext/ unless extracted there, and later runs would copy nothing and
    build everything again. The node's own copy (.devstate/results.tgz, which device_run.sh
    packs) is unpacked first; without one the script stops before any run."""
    proc, repo = repeat_runs(tmp_path, "out", "d7", "c1:305", "--", "--config", "device=h100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = repo / "results/d7-c1/h100"
    (repo / ".devstate").mkdir()
    subprocess.run(["tar", "czf", ".devstate/results.tgz", "--exclude=*/build/ext", "results"], cwd=repo, check=True)
    shutil.rmtree(tree / "check")
    (tree / "build" / "L1_T001.json").unlink()
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", FIRST_TREE=str(tree))

    def follow(out):
        return subprocess.run(["bash", "lab/repeat_runs.sh", out, "d7", "s1:400:serial", "--", "--config",
                               "device=h100"], cwd=repo, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    proc = follow("out2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = (repo / "out2" / "s1" / "started.txt").read_text().splitlines()
    assert started[:3] == ["budget=400", "prepared=yes", "ext=yes"]
    (repo / ".devstate" / "results.tgz").unlink()
    shutil.rmtree(tree / "check")
    (tree / "build" / "L1_T001.json").unlink()
    proc = follow("out3")
    assert proc.returncode == 2 and "has no build or check results" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (repo / "out3" / "s1").exists()
