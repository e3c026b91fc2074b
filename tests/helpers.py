"""Helpers of the end-to-end tests: a copy of the workflow, Snakemake in a subprocess, and the
processes, results and job counts it leaves behind."""

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
#: no GPU, whatever the machine has
CPU_ONLY = dict(os.environ, CUDA_VISIBLE_DEVICES="")
WORKFLOW = ("Snakefile", "rules", "scripts", "config", "profiles", "envs")


def script_module(name):
    """``scripts/<name>.py`` imported as the module ``name`` (once: later calls return the same
    module). The workflow runs these files as scripts; they are not part of the package."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def copy_workflow(dest, src=ROOT, extra=()):
    """The workflow's files (and ``extra`` folders, e.g. results) copied into ``dest``."""
    for name in WORKFLOW + tuple(extra):
        path = Path(src) / name
        (shutil.copytree if path.is_dir() else shutil.copy)(path, Path(dest) / name)


def copy_committed(dest, device="h100", src=None):
    """A fresh clone's results/<device>: the committed files (or those of the tree ``src``), with
    the times a checkout gives them (new, in path order), without the task folders
    (regenerated, never committed)."""
    src = Path(src) if src is not None else ROOT / "results" / device
    out = Path(dest) / "results" / device
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if rel.parts[0] in ("tasks", "attempts", "stale", "tmp") or "ext" in rel.parts or not path.is_file():
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / rel)
    return out


def scratch_left(root, before=()) -> list[Path]:
    """The job scripts' scratch folders below ``root`` (``l1bench-<pid>-…``,
    ``l1bench.pool.runner.scratch_prefix``), not in ``before``, whose process is gone: a job script
    removes its own when it ends, so these were left by one that was killed."""
    from l1bench import lifeline

    left = []
    for path in sorted(Path(root).glob("l1bench-*-*")):
        pid = path.name.split("-")[1]
        if path.is_dir() and pid.isdigit() and path not in before and not lifeline.alive(pid):
            left.append(path)
    return left


def job_counts(text):
    """{rule: count} from snakemake's 'Job stats' table."""
    block = text.split("Job stats:")[-1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M) if m[1] != "total"}


def tree_digest(root, skip=("tasks",)):
    """{relative path: sha256} of every file below ``root`` (but the ``skip`` folders)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in skip
    }


def _proc_text(pid, name):
    try:
        if name == "cwd":
            return os.readlink(f"/proc/{pid}/cwd")
        return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_in(folder):
    """Live processes (not zombies) that run in ``folder`` or name it on their command line."""
    folder, me = str(folder), os.getpid()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        stat = _proc_text(d.name, "stat")
        if not stat or stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            continue
        if folder in _proc_text(d.name, "cmdline") or _proc_text(d.name, "cwd").startswith(folder):
            found.append((int(d.name), _proc_text(d.name, "cmdline")[:200]))
    return found


def wait_for(cond, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def run(cmd, cwd, timeout=600, **kw):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


class MarkerProcess:
    """A child process (``python -c code dir name args...``) that reports its progress by touching
    marker files ``dir/name.<what>`` and is told to go on by ``dir/name.release``."""

    def __init__(self, folder, name, code, *args):
        self.dir, self.name = folder, name
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(folder), *args, name])

    def has(self, what) -> bool:
        return (self.dir / f"{self.name}.{what}").exists()

    def wait(self, what, timeout=60.0) -> bool:
        """Whether marker ``what`` appears within ``timeout`` seconds (the process must live)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.has(what):
                return True
            assert self.proc.poll() is None, f"{self.name} exited early"
            time.sleep(0.005)
        return False

    def touch_release(self) -> None:
        (self.dir / f"{self.name}.release").touch()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def step_results(res):
    """(path, result) of every check and time result of the results tree ``res``."""
    import json

    for path in sorted([*Path(res).glob("check/*.json"), *Path(res).glob("time/*/*/*.json")]):
        yield path, json.loads(path.read_text())


def as_current(res) -> int:
    """Rewrite the check and time results of a copied results tree as the current timing path
    records them (its timing version, inputs drawn on the host, a time result made from its
    check as it is now): a committed tree as it is once re-timed, for the tests of planning with
    every result current. Returns how many changed."""
    import json

    from l1bench.staleness import sha256_bytes
    from l1bench.timing import TIMING_VERSION

    changed = 0
    for path, got in step_results(res):  # the checks first: a time result records its check's sha256
        params = got.get("params")
        old = isinstance(params, dict) and params.pop("inputs_on_device", None) is not None
        if "timing_design" in got or got.get("timing_version", TIMING_VERSION) != TIMING_VERSION:
            got.pop("timing_design", None)
            got["timing_version"] = TIMING_VERSION
            old = True
        check = Path(res) / "check" / path.name
        if path.parent.parent.parent.name == "time" and got.get("upstream_sha256") and check.exists():
            sha = sha256_bytes(check.read_bytes())
            old, got["upstream_sha256"] = old or got["upstream_sha256"] != sha, sha
        if old:
            path.write_text(json.dumps(got, indent=1))
            changed += 1
    return changed


def missed_hand_offs(res, margin_s: float = 15.0) -> list:
    """The steps that a task's worker should have served and did not: each check or time result
    of ``res`` (a results tree) that a task worker served, whose task's step before it ended less
    than the worker's idle time (less ``margin_s``) earlier, by a worker that did not retire,
    and that another worker (or a later step's count) served: ``(tid, seconds between, the
    before's task_worker, the after's)``. Which steps wait longer depends on the machine's load;
    a step that came within the idle time must find its task's worker."""
    from datetime import datetime
    from itertools import pairwise

    from l1bench.pool.client import IDLE_S

    served = {}
    for _, got in step_results(res):
        if got.get("provenance", {}).get("task_worker"):
            served.setdefault(got["tid"], []).append(got["provenance"])
    missed, at = [], datetime.fromisoformat
    for tid, steps in served.items():
        steps.sort(key=lambda p: (p["started"], p["task_worker"]["pid"], p["task_worker"]["step"]))
        for before, after in pairwise(steps):
            w0, w1 = before["task_worker"], after["task_worker"]
            waited = (at(after["started"]) - at(before["finished"])).total_seconds()
            same = (w1["pid"], w1["step"]) == (w0["pid"], w0["step"] + 1)
            if waited < IDLE_S - margin_s and "retired_after" not in w0 and not same:
                missed.append((tid, waited, w0, w1))
    return missed
