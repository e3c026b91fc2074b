"""Test configuration: markers, and where the real release data is. The l1bench package is
imported as installed (pip install -r envs/requirements-dev.txt installs it: -e .)."""

import os
from pathlib import Path

import pytest

from l1bench import release, split

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config/demo/optimized_cuda_code/demo.json"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: end-to-end runs of the workflow (minutes); skip with -m 'not slow', CI runs them"
    )
    config.addinivalue_line(
        "markers", "slurm: runs a real single-node SLURM (opt-in: L1_SLURM_TEST=1, as root; CI runs it)"
    )


#: Set to 1 where the release must be there (CI, .ci/run): a test that reads it fails, not skips.
REQUIRE_RELEASE_ENV = "L1_REQUIRE_RELEASE"
RELEASE_MISSING = "the upstream release is missing"


def _release_dir() -> Path:
    env = os.environ.get("L1_RELEASE_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "cuda-l1"


@pytest.fixture(scope="session")
def release_dir():
    """The upstream release folder (``$L1_RELEASE_DIR``, default ``../shared/cuda-l1``). Without
    it the tests that read it skip, with one reason naming the missing path; where
    ``$L1_REQUIRE_RELEASE`` is 1 (CI) they fail with that line instead."""
    d = _release_dir()
    if not (d / "optimized_cuda_code").is_dir():
        missing = f"{RELEASE_MISSING}: no {d / 'optimized_cuda_code'} (set L1_RELEASE_DIR)"
        if os.environ.get(REQUIRE_RELEASE_ENV) == "1":
            pytest.fail(f"{missing}; {REQUIRE_RELEASE_ENV}=1 requires it", pytrace=False)
        pytest.skip(missing)
    return d


def pytest_terminal_summary(terminalreporter):
    """Without the release, one line at the end says how many tests skipped for it, and why."""
    reasons = [r.longrepr[2] for r in terminalreporter.stats.get("skipped", []) if isinstance(r.longrepr, tuple)]
    missing = [r for r in reasons if RELEASE_MISSING in r]
    if missing:
        terminalreporter.write_line(f"{len(missing)} skipped: {missing[0].removeprefix('Skipped: ')}")


@pytest.fixture(scope="session")
def current_h100(tmp_path_factory, release_dir):
    """The committed results/h100 as it is once every result is current (``helpers.as_current``)
    and its tables are made again from them (``aggregate_only``): the tree the planning tests of
    a committed, current release start from, made once per test process (its tests only read
    it). Equal to the committed tree when that is current."""
    import subprocess

    from helpers import CPU_ONLY, SNAKEMAKE, as_current, copy_committed, copy_workflow

    work = tmp_path_factory.mktemp("current_h100")
    copy_workflow(work)
    res = copy_committed(work)
    if as_current(res):
        cmd = SNAKEMAKE + ["--cores", "1", "--config", "device=h100", f"release_dir={release_dir}"]
        cmd.append("aggregate_only=true")
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600, env=CPU_ONLY, check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    return res


@pytest.fixture(scope="session")
def tasks(tmp_path_factory):
    """The embedded demo release split into task folders, once per test run. Tests
    read it; a test that needs a changed task copies it into its own tmp_path first."""
    root = tmp_path_factory.mktemp("tasks")
    split.split_release(release.load_release(DEMO), root, "demo", {"path": "demo", "sha256": "x"})
    return root


@pytest.fixture(autouse=True)
def _no_scratch_folder_left(monkeypatch):
    """The processes a test starts make their temporary files in a folder of that test's own
    (``TMPDIR``; short, for the task workers' unix sockets), removed after it, so that no test
    leaves files in the machine's temp folder and tests running side by side (xdist, the SLURM
    test) never see each other's; a job script's scratch folder left there by a process that is
    gone fails the test (``helpers.scratch_left``; a stop signal removes it, a SIGKILL cannot). A
    test that SIGKILLs a job script on purpose points that script's ``TMPDIR`` at its tmp_path."""
    import shutil
    import tempfile

    from helpers import scratch_left

    # torch.compile's cache stays where it was (it lives under the temp folder by default):
    # compiling cold in every test would outlast the steps' timeouts
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        import getpass

        inductor = Path(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    own = tempfile.mkdtemp(prefix="l1t-")
    monkeypatch.setenv("TMPDIR", own)
    yield
    left = scratch_left(own)
    shutil.rmtree(own, ignore_errors=True)
    if left:
        pytest.fail(f"left in the temp folder by a killed job script: {', '.join(map(str, left))}", pytrace=False)


@pytest.fixture(autouse=True)
def _timing_plan_kept():
    """Each test leaves the process's timing-CPU plan (``timingcpus._TIMING_PLAN``, set by
    ``reserve_timing_cpus``) as it found it: a plan left by a test of a fake 16-CPU machine made
    the next tests pin their sections to a CPU this machine does not have."""
    from l1bench.gpu import timingcpus

    plan = list(timingcpus._TIMING_PLAN)
    yield
    timingcpus._TIMING_PLAN[:] = plan
