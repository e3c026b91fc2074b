"""What the docs say a command does is what it does: docs/running.md on the committed h100
results (in a fresh clone of this repository, on a machine without a GPU), the README's set-up in
two commands (the Makefile) and its length.

A number docs/running.md quotes about the committed tree carries a marker right after it, an
HTML comment naming it (``1,500<!--committed.time_task-->``), as the README's numbers do
(tests/test_readme.py); the value of each name is computed here from the committed results and
from a dry run on them. When the committed results change (a GPU run re-times them), these tests
say which sentence of docs/running.md to update.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import CPU_ONLY, ROOT, SNAKEMAKE, job_counts, run

from l1bench.timing import TIMING_VERSION

RUNNING = ROOT / "docs/running.md"
#: a mirror whose host never resolves (RFC 2606): the download fails as without network
NO_NETWORK = "upstream:\n  base_url: http://l1bench-no-network.invalid\n"
#: A quoted number and its marker.
CLAIM = re.compile(r"([\d,]+)<!--([\w.]+)-->")
MAX_README_LINES = 100


def snapshot(root) -> dict[str, tuple[int, int]]:
    """{path: (mtime, size)} of every file below ``root`` but .git/ and .snakemake/."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(Path(root).rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".snakemake")
    }


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh clone of this repository (its committed files only), with a config file that
    stands for a machine without network; and what it holds."""
    work = tmp_path_factory.mktemp("clone") / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
    (work.parent / "offline.yaml").write_text(NO_NETWORK)
    return work, snapshot(work)


def main_command(work, *config, dry=False, offline=True):
    cmd = SNAKEMAKE + ["--cores", "1"] + (["-n"] if dry else [])
    cmd += ["--configfile", str(work.parent / "offline.yaml")] if offline else []
    proc = run(cmd + ["--config", "device=h100", *config], work, env=CPU_ONLY)
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def dry_run(clone):
    """The main command's dry run on the committed h100 results, without network: what it plans."""
    work, before = clone
    proc, out = main_command(work, dry=True)
    assert proc.returncode == 0, out[-2000:]
    assert snapshot(work) == before, "a dry run wrote into the clone"
    return out


def committed_versions(res) -> set:
    """The timing versions the committed check and time results record (None: none recorded)."""
    found = set()
    for path in [*res.glob("check/*.json"), *res.glob("time/*/*/*.json")]:
        got = json.loads(path.read_text())
        found.add(got.get("timing_version", got.get("timing_design")))
    return found


def test_running_md_quotes_the_committed_results_as_they_are(clone, dry_run):
    work, _ = clone
    versions = committed_versions(work / "results/h100") - {None}
    planned = job_counts(dry_run)
    want = {
        "committed.timing_version": str(min(versions)) if versions else "none",  # the oldest
        "timing_version": str(TIMING_VERSION),
        "committed.check_task": f"{planned.get('check_task', 0):,}",
        "committed.time_task": f"{planned.get('time_task', 0):,}",
    }
    found = {name: value for value, name in CLAIM.findall(RUNNING.read_text())}
    assert set(want) <= set(found), f"docs/running.md marks no {sorted(set(want) - set(found))}"
    wrong = [f"{name}: running.md {found[name]!r}, now {want[name]!r}" for name in want if found[name] != want[name]]
    assert not wrong, (
        "docs/running.md, 'The committed `results/h100` results are not current', no longer holds "
        "for the committed results: " + "; ".join(wrong)
    )


def test_the_dry_run_says_why_each_committed_result_is_planned_again(dry_run):
    """The reason line running.md quotes is the dry run's, once for each stale result."""
    quoted = re.search(r"\(`([^`]*) is stale: ([^`…]*?) …`\)", RUNNING.read_text().replace("\n", " "))
    assert quoted, "docs/running.md quotes no `... is stale: ...` line of the dry run"
    result, why = quoted.groups()
    assert f"{result} is stale: {why}" in dry_run
    planned = job_counts(dry_run)
    reasons = re.findall(r"^Job \d+: (check|time)/\S+ is stale: ", dry_run, re.M)
    assert len(reasons) == planned["check_task"] + planned["time_task"]


@pytest.mark.parametrize("where", ["no network", "release_dir"])
def test_without_a_gpu_the_main_command_stops_before_any_job(clone, where, request):
    """The committed results need a GPU to be made current: the run stops within seconds with
    the one line running.md quotes, downloads nothing and changes nothing."""
    work, before = clone
    if where == "release_dir":
        release = request.getfixturevalue("release_dir")
        proc, out = main_command(work, f"release_dir={release}", offline=False)
    else:
        proc, out = main_command(work)
    assert proc.returncode != 0
    lines = [line for line in out.splitlines() if "needs a CUDA GPU for" in line]
    assert len(lines) == 1 and lines[0].startswith("device=h100 needs a CUDA GPU for "), out[-2000:]
    assert "check/time jobs (" in lines[0] and "and none is visible; nothing was run" in lines[0]
    text = " ".join(RUNNING.read_text().split())
    assert "`device=h100 needs a CUDA GPU for … check/time jobs (…), and none is visible; nothing was run`" in text
    assert not (work / "resources").exists() and snapshot(work) == before


def test_aggregate_only_has_nothing_to_do_on_the_committed_results(clone):
    work, before = clone
    proc, out = main_command(work, "aggregate_only=true")
    assert proc.returncode == 0 and "Nothing to be done" in out, out[-2000:]
    assert snapshot(work) == before


# --------------------------------------------------------------------------- the README's set-up


def quick_start_commands() -> list[str]:
    """The first code block of the README's Quick start: its commands, without comments."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_quick_start_is_two_make_commands():
    assert quick_start_commands() == ["make demo", "make test"]


def make_plan(target, tmp_path, *settings) -> list[str]:
    """The commands ``make -n TARGET`` would run into a venv in ``tmp_path`` (none is made)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    venv = tmp_path / "venv"
    proc = run(["make", "-n", target, f"VENV={venv}", *settings], ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not venv.exists()  # -n ran nothing
    return [line.replace(str(venv), ".venv") for line in proc.stdout.splitlines()]


def test_make_demo_installs_torch_for_the_machine_then_runs_the_demo(tmp_path):
    pin = next(x for x in (ROOT / "envs/requirements.txt").read_text().splitlines() if x.startswith("torch=="))
    assert make_plan("demo", tmp_path) == [
        "python3 -m venv .venv",
        f'command -v nvidia-smi >/dev/null || .venv/bin/python -m pip install "{pin}" '
        "--index-url https://download.pytorch.org/whl/cpu",
        ".venv/bin/python -m pip install -r envs/requirements.txt",
        "touch .venv/.installed",
        ".venv/bin/snakemake --cores 2 --config device=demo",
    ]


def test_make_test_installs_the_test_tools_then_runs_the_tests(tmp_path):
    plan = make_plan("test", tmp_path, "PYTEST_ARGS=-m 'not slow'")
    assert plan[-3:] == [
        ".venv/bin/python -m pip install -r envs/requirements-dev.txt",
        "touch .venv/.installed-dev",
        ".venv/bin/python -m pytest tests -m 'not slow'",
    ]
    assert ".venv/bin/python -m pip install -r envs/requirements.txt" in plan


def test_the_readme_stays_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines, at most {MAX_README_LINES}"
