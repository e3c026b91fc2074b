"""lab/device_run.sh's watchdog, without a GPU: a stand-in ``nvidia-smi`` and a stand-in
``snakemake`` (a wheel in the carried wheelhouse) whose jobs all fail. The watchdog must stop
such a run early instead of spending its budget, and the run must still pack what it
has into results.tgz."""

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *"-l 1"*) exec sleep 600 ;;
  *memory.total*) echo 24576 ;;
  *) echo "Stand-in GPU, 0.0, 1980, 3201, 0" ;;
esac
"""

# Snakemake as the watchdog sees it: its log. Checks pass (results written), then every job
# fails; it runs until interrupted (SIGINT, as the watchdog stops it).
SNAKEMAKE_MAIN = """
import pathlib, sys, time
if "--unlock" in sys.argv:
    sys.exit(0)
root = pathlib.Path("results/h100")
for i in range({checks}):
    (root / "check").mkdir(parents=True, exist_ok=True)
    (root / "check" / f"L1_T{{i:03d}}.json").write_text('{{"status": "pass"}}')
for i in range({failures}):
    print(f"Error in rule time_task:\\n    jobid: {{i}}", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _wheel(folder, name="tiny", version="1.0", modules=None):
    """A minimal pure-Python wheel (a stand-in for the wheelhouse of build_wheelhouse.py);
    ``modules``: {file name: text} of the package's other modules."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 1\n",
        **{f"{name}/{module}": text for module, text in (modules or {}).items()},
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


def device_run(tmp_path, checks: int, failures: int, watch_s: int = 5, budget_s: int = 300, **env_extra):
    """device_run.sh in a copy of the repository with the stand-ins: (process, wall seconds)."""
    repo, bin_dir, out = tmp_path / "repo", tmp_path / "bin", tmp_path / "out"
    for name in ("pyproject.toml", "README.md", "scripts/offline_install.sh", "lab/device_run.sh", "lab/l1lab",
                 "src/l1bench"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    (repo / ".whl").mkdir()
    _wheel(repo / ".whl", "snakemake", "0.0", {"__main__.py": SNAKEMAKE_MAIN.format(checks=checks, failures=failures)})
    bin_dir.mkdir()
    for name, text in {"nvidia-smi": NVIDIA_SMI, "python3": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", L1_SITE=str(tmp_path / "site"),
               PIP_NO_INDEX="1", PYTHONPATH="", WATCH_S=str(watch_s), DRAIN_S="5")
    env.update(env_extra)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "lab/device_run.sh", str(budget_s), str(out)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=400, check=False)
    return proc, time.monotonic() - t0


def test_the_watchdog_stops_a_run_whose_time_jobs_all_fail(tmp_path):
    """Checks pass, then 12 jobs fail and nothing more is written: stopped at the first look
    (WATCH_S), not at the 300-s budget; results.tgz holds the checks it wrote."""
    proc, wall = device_run(tmp_path, checks=3, failures=12)
    line = "watchdog: 12 failed jobs and 3 results written after 5 s: stopping"
    assert line in proc.stdout, proc.stdout + proc.stderr
    assert wall < 120
    # a 24 GiB GPU: at most two compile-mode jobs at once (one per 10 GiB), and 3/4 of the CPUs
    ncpu = len(os.sched_getaffinity(0))
    expected = max(1, min(3 * ncpu // 4, 2))
    assert f"compile-mode jobs at once: {expected} (GPU memory 24576 MiB, {ncpu} CPUs)" in proc.stdout
    assert "CPU probe" not in proc.stdout  # HOST_PROBE unset: off
    with tarfile.open(tmp_path / "out" / "results.tgz") as tgz:
        assert "results/h100/check/L1_T002.json" in tgz.getnames()
    assert (tmp_path / "out" / "tree").read_text() == "results/h100\n"  # the tree it wrote, for its caller

