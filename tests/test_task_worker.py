"""The task worker: one process per task serves its check and its eager-mode time steps, one
after another, on the CPU backend. What must hold: steps share the process and say so; a crash,
a timeout or a patch of torch costs only the step that ran (the next step gets a fresh worker);
settings a step changed are put back; the worker ends when idle and with its workflow; only the
checks and eager-mode time jobs go to it."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_worker
from helpers import wait_for

from l1bench import lifeline, plan
from l1bench.job import stamped
from l1bench.pool import idle, state
from l1bench.pool.client import gpu_alone, run_in_task_worker, worker_name
from l1bench.pool.runner import JobFailed
from l1bench.timing import TIMING_VERSION

ROOT = Path(__file__).resolve().parents[1]
# test_worker's protocol parameters, fewer trials: several steps run per test
PAPER = test_worker.PAPER | {"correctness_trials": 2, "inner_trials": 2}
STRICT = test_worker.STRICT | {"max_reps": 10, "budget_s": 2}

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="abstract Unix sockets, /proc")


def variant(tasks, tmp_path, tid, prefix: str) -> str:
    """A copy of demo task ``tid`` whose custom code starts with ``prefix``; its new tid."""
    new = f"{tid[:-3]}9{tid[-2:]}"
    dest = tmp_path / "variants" / new
    shutil.copytree(tasks / tid, dest)
    custom = dest / "custom.py"
    custom.write_text(prefix + "\n" + custom.read_text())
    meta = json.loads((dest / "meta.json").read_text())
    (dest / "meta.json").write_text(json.dumps(meta | {"tid": new}))
    return str(dest)


def job(tasks, tmp_path, tid, kind="check", task_dir=None, **extra):
    passed = tmp_path / "pass.json"
    passed.write_text(json.dumps({"kind": "check", "status": "pass", "reason": ""}))
    built = tmp_path / "built.json"
    built.write_text(json.dumps({"kind": "build", "status": "ok", "reason": ""}))
    j = {
        "kind": kind,
        "backend": "cpu",
        "tid": tid,
        "task_dir": task_dir or str(tasks / tid),
        "ext_dir": str(tmp_path / "ext" / tid),
        "params": dict(PAPER),
        "lock_dir": str(tmp_path),
    }
    if kind == "check":
        j["build_result"] = str(built)
    else:
        j |= {"check_result": str(passed), "mode": "default", "protocol": "paper"}
    return j | extra


def served(tmp_path, j, timeout=60, idle_s=20.0, max_idle=0):
    """The step's result, stamped as the job stamps it."""
    return stamped(j, run_in_task_worker(j, timeout, tmp_path / f"{j['tid']}.log", tmp_path / "tw", idle_s=idle_s,
                                         max_idle=max_idle))


def gone(pid: int) -> bool:
    """The process has ended (a zombie counts as ended), by the lifeline's own test."""
    return not lifeline.alive(lifeline.process_token(pid))


def stop(res):
    """End the worker that made ``res`` (tests leave none behind)."""
    pid = res["provenance"]["task_worker"]["pid"]
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ the jobs it serves


def test_only_the_checks_and_eager_time_jobs_go_to_the_task_worker(tmp_path, monkeypatch):
    """The job (l1bench.job) sends a check and an eager-mode time job to its task's worker, a
    compile-mode time job and a build to a worker of their own; no params key says which."""
    import l1bench.pool.client
    import l1bench.pool.runner
    from l1bench.job import JobSpec, run_in_worker

    went = []
    monkeypatch.setattr(l1bench.pool.client, "run_in_task_worker", lambda job, *a, **k: went.append("task") or {})
    monkeypatch.setattr(l1bench.pool.runner, "run_worker", lambda job, *a, **k: went.append("own") or {})
    for kind, mode, want in (("check", None, "task"), ("time", "cudnn", "task"), ("time", "default", "task"),
                             ("time", "torch_compile", "own"), ("build", None, "own")):
        params = plan.evaluation_params(kind, "sha", {"paper": {}, "build": {"max_jobs": 1, "cuda_arch_list": ""},
                                                      "protocol": "paper"})
        assert "timing" not in params
        spec = JobSpec(rule=f"{kind}_task", kind=kind, tid="L1_T001", output=str(tmp_path / "h100/out.json"),
                       log=str(tmp_path / "log"), results=tmp_path / "h100", backend="cuda", protocol_params=params,
                       ext_dir="e", timeout=60, max_attempts=3, mode=mode, protocol="paper")
        job = {"kind": kind, "tid": "L1_T001"} | ({"mode": mode} if mode else {})
        run_in_worker(spec, job)
        assert went.pop() == want, (kind, mode)


def test_worker_names_are_per_results_folder_and_task(tmp_path):
    a = worker_name(tmp_path / "a", "L1_T001")
    assert a == worker_name(tmp_path / "a", "L1_T001")
    assert a != worker_name(tmp_path / "a", "L1_T002") and a != worker_name(tmp_path / "b", "L1_T001")
    assert len(a) < 100  # an abstract socket name well under the 107 bytes


def test_replaced_counts_rebound_and_removed_names_not_new_ones():
    f, g = (lambda: 1), (lambda: 2)
    before = {"torch.relu": f, "torch.nn.functional.gelu": g}
    assert state.replaced(before, dict(before)) == []
    assert state.replaced(before, before | {"torch.new": f}) == []
    assert state.replaced(before, {"torch.relu": g, "torch.nn.functional.gelu": g}) == ["torch.relu"]
    assert state.replaced(before, {"torch.relu": f}) == ["torch.nn.functional.gelu"]


def test_the_watched_bindings_are_stable():
    """Reading torch's namespaces twice sees the same objects (a check that can fail only on a patch)."""
    first = state.bindings(state.watched_namespaces())
    assert "torch.nn.functional.relu" in first and "torch.nn.Conv2d.forward" in first
    assert state.replaced(first, state.bindings(state.watched_namespaces())) == []


def test_step_labels():
    assert state.step_label({"kind": "check"}) == "check"
    assert state.step_label({"kind": "time", "protocol": "strict", "mode": "default"}) == "time strict/default"


# ------------------------------------------------------------------ one worker, several steps


def test_a_tasks_steps_share_one_worker(tasks, tmp_path):
    check = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
    paper = served(tmp_path, job(tasks, tmp_path, "L1_T001", "time"))
    strict = served(tmp_path, job(tasks, tmp_path, "L1_T001", "time", protocol="strict", strict=STRICT))
    try:
        assert check["status"] == "pass" and paper["status"] == "ok" and strict["status"] == "ok"
        ways = [r["provenance"]["task_worker"] for r in (check, paper, strict)]
        assert len({w["pid"] for w in ways}) == 1 and ways[0]["pid"] != os.getpid()
        assert [w["step"] for w in ways] == [1, 2, 3]
        assert ways[2]["earlier_steps"] == ["check", "time paper/default"]
        assert all(r["timing_version"] == TIMING_VERSION for r in (check, paper, strict))
        assert not any("retired_after" in w for w in ways)
        log = (tmp_path / "L1_T001.log").read_text()
        assert "step 3 (time strict/default)" in log  # the worker's own output is in the job's log
    finally:
        stop(strict)


def test_other_tasks_get_other_workers(tasks, tmp_path):
    one = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
    two = served(tmp_path, job(tasks, tmp_path, "L1_T002"))
    try:
        assert one["provenance"]["task_worker"]["pid"] != two["provenance"]["task_worker"]["pid"]
        assert two["provenance"]["task_worker"]["step"] == 1
    finally:
        stop(one), stop(two)


def test_a_killed_worker_costs_only_its_step(tasks, tmp_path):
    first = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
    pid = first["provenance"]["task_worker"]["pid"]
    os.kill(pid, 9)
    assert wait_for(lambda: gone(pid), 10)
    again = served(tmp_path, job(tasks, tmp_path, "L1_T001", "time"))
    try:
        assert again["status"] == "ok"
        assert again["provenance"]["task_worker"]["pid"] != pid and again["provenance"]["task_worker"]["step"] == 1
    finally:
        stop(again)


def test_a_crash_in_a_step_fails_that_job_only(tasks, tmp_path):
    """L1_T006 kills its own process (SIGKILL) when its model runs: the step fails as a crash,
    named as a one-shot worker's crash is; the task's next step starts a fresh worker."""
    with pytest.raises(JobFailed, match=r"L1_T006: worker crashed \(signal SIGKILL\), see log"):
        served(tmp_path, job(tasks, tmp_path, "L1_T006"))
    before = json.loads(json.dumps(job(tasks, tmp_path, "L1_T006", "time")))
    with pytest.raises(JobFailed, match=r"worker crashed \(signal SIGKILL\)"):
        served(tmp_path, before)


@pytest.mark.parametrize("code, how", [("os.kill(os.getpid(), signal.SIGKILL)", "signal SIGKILL"),
                                       ("os._exit(3)", "exit code 3")])
def test_how_a_worker_ended_reaches_a_job_side_that_is_not_its_parent(tmp_path, code, how):
    """A later step's job script did not start the worker, so it cannot wait for it: the shell
    that did writes ``<pid> <status>`` when it ends, and the job side reads it from there."""
    import subprocess

    from l1bench.pool import client

    path = client.exit_file(tmp_path / "L1_T001.log")
    script = f"import os, signal; print(os.getpid(), flush=True); {code}"
    proc = subprocess.Popen(["/bin/sh", "-c", client._NANNY, "sh", str(path), sys.executable, "-c", script],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    pid = int(proc.stdout.readline())
    proc.wait(timeout=30)
    assert client.how_it_ended(path, pid) == how
    assert client.how_it_ended(path, pid + 1, wait_s=0.1) is None  # another worker's end
    assert client.how_it_ended(tmp_path / "none.exit", pid, wait_s=0.1) is None


def test_a_timeout_kills_the_worker(tasks, tmp_path):
    """L1_T005 hangs: the step times out, its worker's process group is killed."""
    t0 = time.monotonic()
    with pytest.raises(JobFailed, match="timed out") as err:
        served(tmp_path, job(tasks, tmp_path, "L1_T005"), timeout=6)
    assert err.value.kind == "timeout" and time.monotonic() - t0 < 60
    log = (tmp_path / "L1_T005.log").read_text()
    pid = int(re.search(r"task worker (\d+)", log).group(1))
    assert wait_for(lambda: gone(pid), 10)


def test_a_killed_job_script_ends_its_step(tasks, tmp_path):
    """Snakemake stops a job (Ctrl-C, --keep-going off, a cluster's kill) by killing its job
    script, not the task worker, which runs in a session of its own. The worker sees the job
    script's connection close and ends its process group, so a hung step (L1_T005) does not
    keep the GPU lock or the task's step lock."""
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job(tasks, tmp_path, "L1_T005")))
    code = (
        "import json, sys, pathlib; from l1bench.pool.client import run_in_task_worker; "
        "p = pathlib.Path(sys.argv[1]); "
        "run_in_task_worker(json.loads(p.read_text()), 300, p.parent / 'L1_T005.log', p.parent / 'tw', idle_s=60)"
    )
    # its scratch folder in tmp_path: killed, the job script cannot remove it
    script = subprocess.Popen([sys.executable, "-c", code, str(spec)], env=dict(os.environ, TMPDIR=str(tmp_path)))
    log = tmp_path / "L1_T005.log"
    try:
        assert wait_for(lambda: log.exists() and "step 1 (check)" in log.read_text(), 60)
        pid = int(re.search(r"task worker (\d+)", log.read_text()).group(1))
        assert not gone(pid)
    finally:
        script.kill()
        script.wait()
    assert wait_for(lambda: gone(pid), 10)


NOBODY = 65534
#: A Python that another user may run (this one may live under root's home).
OTHER_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or OTHER_PYTHON is None, reason="runs a process as another user (needs root and a system python3)"
)


def as_nobody(code: str, name: str, **kw):
    """``code`` run by the system's python3 as user nobody, with the abstract socket name in
    ``sys.argv[1]`` (the leading NUL is added there: no NUL can pass in argv)."""
    return subprocess.Popen([OTHER_PYTHON, "-c", code, name], user=NOBODY, cwd="/", text=True, **kw)


@as_root
def test_a_worker_refuses_another_users_connection(tasks, tmp_path):
    """An abstract socket has no permissions: another user's process can reach it by name. The
    worker closes such a connection without a greeting and without running anything."""
    res = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
    try:
        name = worker_name(tmp_path / "tw", "L1_T001")
        code = (
            "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(chr(0) + sys.argv[1]); "
            "s.settimeout(10); print(repr(s.recv(100)))"
        )
        out, _ = as_nobody(code, name, stdout=subprocess.PIPE).communicate(timeout=60)
        assert out.strip() == "b''"  # closed, no greeting
        again = served(tmp_path, job(tasks, tmp_path, "L1_T001", "time"))  # ours still served
        assert again["provenance"]["task_worker"]["pid"] == res["provenance"]["task_worker"]["pid"]
        assert "refused a connection of uid 65534" in (tmp_path / "tw" / "L1_T001.log").read_text()
    finally:
        stop(res)


@as_root
def test_a_socket_name_held_by_another_user_is_refused(tasks, tmp_path):
    """Another user's process listening on the task's name first would get its steps and could
    answer them: the job refuses it and stops, not counted as an attempt of the task."""
    from l1bench.pool.runner import JobStopped

    name = worker_name(tmp_path / "tw", "L1_T001")
    code = (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(chr(0) + sys.argv[1]); s.listen(4); "
        "print('up', flush=True); time.sleep(60)"
    )
    squatter = as_nobody(code, name, stdout=subprocess.PIPE)
    try:
        assert squatter.stdout.readline().strip() == "up"
        with pytest.raises(JobStopped, match="held by another user's process \\(uid 65534\\)"):
            served(tmp_path, job(tasks, tmp_path, "L1_T001"))
    finally:
        squatter.kill()
        squatter.wait()


# ------------------------------------------------------------------ what a step may leave behind


def test_settings_a_step_changed_are_put_back(tasks, tmp_path):
    d = variant(tasks, tmp_path, "L1_T001", "import torch\ntorch.set_num_threads(1)")
    first = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    second = served(tmp_path, job(tasks, tmp_path, "L1_T901", "time", task_dir=d))
    try:
        w1, w2 = first["provenance"]["task_worker"], second["provenance"]["task_worker"]
        assert first["status"] == "pass" and second["status"] == "ok"
        assert w1["pid"] == w2["pid"] and "retired_after" not in w1
        assert w1["settings_restored_after"] == ["num_threads"]
    finally:
        stop(second)


def test_a_step_that_patches_torch_retires_the_worker(tasks, tmp_path):
    patch = "import torch\n_silu = torch.nn.functional.silu\ntorch.nn.functional.silu = lambda *a, **k: _silu(*a, **k)"
    d = variant(tasks, tmp_path, "L1_T001", patch)
    first = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    pid = first["provenance"]["task_worker"]["pid"]
    assert first["status"] == "pass"
    assert "torch.nn.functional.silu" in first["provenance"]["task_worker"]["retired_after"]
    assert wait_for(lambda: gone(pid), 10)
    second = served(tmp_path, job(tasks, tmp_path, "L1_T901", "time", task_dir=d))
    try:
        assert second["provenance"]["task_worker"]["pid"] != pid and second["provenance"]["task_worker"]["step"] == 1
    finally:
        stop(second)


def test_torchs_own_wrappers_do_not_retire_the_worker(tasks, tmp_path):
    """Importing torch._dynamo (custom codes that use torch.compile do) makes torch wrap
    torch.manual_seed: torch's code, wrapping what was there. Recorded, kept, not a retirement;
    the same wrapping by the snippet's own code retires the worker."""
    d = variant(tasks, tmp_path, "L1_T001", "import torch._dynamo")
    first = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    second = served(tmp_path, job(tasks, tmp_path, "L1_T901", "time", task_dir=d))
    try:
        w1, w2 = first["provenance"]["task_worker"], second["provenance"]["task_worker"]
        assert w1["pid"] == w2["pid"] and "retired_after" not in w1 and "retired_after" not in w2
        assert "torch.manual_seed" in w1["torch_rewrapped_after"] and "torch_rewrapped_after" not in w2
    finally:
        stop(second)
    hack = "import functools, torch\n_seed = torch.manual_seed\n"
    hack += "torch.manual_seed = functools.wraps(_seed)(lambda s: _seed(s))"
    d = variant(tasks, tmp_path / "hack", "L1_T001", hack)
    res = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    assert "torch.manual_seed" in res["provenance"]["task_worker"]["retired_after"]


def test_a_step_that_leaves_a_thread_running_retires_the_worker(tasks, tmp_path):
    spin = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), name='left', daemon=True).start()"
    d = variant(tasks, tmp_path, "L1_T001", spin)
    res = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    assert "threads the step started still run: left" in res["provenance"]["task_worker"]["retired_after"]
    assert wait_for(lambda: gone(res["provenance"]["task_worker"]["pid"]), 10)


def test_a_step_that_changes_the_environment_retires_the_worker(tasks, tmp_path):
    setenv = "import os\nos.environ['CUDA_MODULE_LOADING'] = 'EAGER'"
    d = variant(tasks, tmp_path, "L1_T001", setenv)
    res = served(tmp_path, job(tasks, tmp_path, "L1_T901", task_dir=d))
    assert "the step changed the environment: CUDA_MODULE_LOADING" in res["provenance"]["task_worker"]["retired_after"]
    assert wait_for(lambda: gone(res["provenance"]["task_worker"]["pid"]), 10)


def test_a_worker_serves_one_task_only(tasks, tmp_path):
    worker = state.TaskWorker()
    worker.prepare({"tid": "L1_T001"})
    with pytest.raises(ValueError, match="task worker of L1_T001"):
        worker.prepare({"tid": "L1_T002"})


# ------------------------------------------------------------------ the worker's life


def test_the_worker_ends_when_idle(tasks, tmp_path):
    res = served(tmp_path, job(tasks, tmp_path, "L1_T001"), idle_s=1.0)
    assert wait_for(lambda: gone(res["provenance"]["task_worker"]["pid"]), 15)


def test_idle_tokens_bound_the_workers_waiting_per_gpu(tmp_path):
    """Tokens are flocks on files beside the GPU's lock: n of them per GPU, given back when a
    step comes (or when the process ends); 0 sets no bound."""
    a, b, c = (idle.IdleTokens(2) for _ in range(3))
    assert a.take(tmp_path, "cpu") and b.take(tmp_path, "cpu")
    assert not c.take(tmp_path, "cpu")
    assert idle.IdleTokens(2).take(tmp_path / "other-machine", "cpu")  # another lock folder: other tokens
    a.give_back()
    assert c.take(tmp_path, "cpu")
    assert c.take(tmp_path, "cpu")  # already holds one: still one
    assert sorted(p.name for p in tmp_path.glob("l1bench-cpu.idle*")) == ["l1bench-cpu.idle0", "l1bench-cpu.idle1"]
    assert all(idle.IdleTokens(0).take(tmp_path, "cpu") for _ in range(5))
    b.give_back(), c.give_back()
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "l1bench-cpu.idle0").mkdir()  # cannot be opened as a file: taken, not a crash
    assert not idle.IdleTokens(1).take(blocked, "cpu")


def test_auto_idle_bound_is_the_workers_that_fit_a_fifth_of_the_gpu(tmp_path):
    """The AUTO bound (-1, the job side's default): 20 % of the GPU's memory at 850 MiB a worker (an idle
    worker held 714-852 MiB on an H100), at least one; decided once the GPU is known, no bound
    on a CPU (CUDA never started)."""
    assert idle.auto_idle_bound(81559) == 19  # H100 80 GB (nvidia-smi's total)
    assert idle.auto_idle_bound(143771) == 33  # H200: more than its 32 job slots
    assert idle.auto_idle_bound(46068) == 10 and idle.auto_idle_bound(24576) == 5
    assert idle.auto_idle_bound(4096) == 1
    asked = []
    tokens = idle.IdleTokens(idle.AUTO, total_mib=lambda: asked.append(1) or 81559)
    assert tokens.n == idle.AUTO and tokens.bound() == 19 and tokens.bound() == 19 and len(asked) == 1
    cpu = idle.IdleTokens(-1, total_mib=lambda: None)
    assert cpu.bound() == 0 and all(cpu.take(tmp_path, "cpu") for _ in range(3))
    one = idle.IdleTokens(idle.AUTO, total_mib=lambda: 1000.0)  # bound 1: the second finds it taken
    assert one.take(tmp_path, "cuda:0")
    assert not idle.IdleTokens(idle.AUTO, total_mib=lambda: 1000.0).take(tmp_path, "cuda:0")
    one.give_back()


def test_a_worker_that_finds_the_idle_bound_full_exits_after_its_step(tasks, tmp_path):
    """max_idle 1: the first task's worker waits idle (holding the token); the second task's
    worker serves its step and then exits at once, though its idle time (20 s) has not run
    out; once the first is gone, a third task's worker may wait again."""
    one = served(tmp_path, job(tasks, tmp_path, "L1_T001"), max_idle=1)
    first = one["provenance"]["task_worker"]["pid"]
    try:
        two = served(tmp_path, job(tasks, tmp_path, "L1_T002"), max_idle=1)
        second = two["provenance"]["task_worker"]["pid"]
        assert two["status"] == "pass" and second != first
        assert wait_for(lambda: gone(second), 10)
        assert "workers already wait idle on this GPU: exiting" in (tmp_path / "tw" / "L1_T002.log").read_text()
        assert not gone(first)
        again = served(tmp_path, job(tasks, tmp_path, "L1_T001", "time"), max_idle=1)  # the idle one serves
        assert again["provenance"]["task_worker"]["pid"] == first
    finally:
        stop(one)
    assert wait_for(lambda: gone(first), 10)
    three = served(tmp_path, job(tasks, tmp_path, "L1_T003"), max_idle=1)
    try:
        time.sleep(1.5)
        assert not gone(three["provenance"]["task_worker"]["pid"])  # the token came free with the kill
    finally:
        stop(three)


def test_a_request_to_leave_names_a_live_process(tmp_path):
    """idle.asked_to_leave: the workers' folder holds ALONE_FILE naming a process that runs;
    none, one left by a process that is gone, or one that names no process asks nothing."""
    assert not idle.asked_to_leave(tmp_path)
    alone = tmp_path / idle.ALONE_FILE
    alone.write_text(json.dumps({"token": lifeline.process_token(os.getpid())}))
    assert idle.asked_to_leave(tmp_path)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    alone.write_text(json.dumps({"token": f"{done.stdout.strip()}:1"}))
    assert not idle.asked_to_leave(tmp_path)
    for bad in ("", "{", json.dumps({"token": ""}), json.dumps({"token": "x"}), json.dumps(["token"])):
        alone.write_text(bad)
        assert not idle.asked_to_leave(tmp_path), bad


def test_idle_tokens_held_counts_the_idle_workers_of_every_gpu(tmp_path):
    a, b = idle.IdleTokens(2), idle.IdleTokens(2)
    assert idle.idle_tokens_held(tmp_path) == 0
    assert a.take(tmp_path, "cpu") and b.take(tmp_path, "cuda:0")
    assert idle.idle_tokens_held(tmp_path) == 2
    assert idle.idle_tokens_held(tmp_path) == 2  # the test took none for good
    a.give_back()
    assert idle.idle_tokens_held(tmp_path) == 1
    b.give_back()
    assert idle.idle_tokens_held(tmp_path) == 0


def test_a_job_that_takes_the_gpu_alone_sends_the_idle_workers_away(tasks, tmp_path):
    """gpu_alone: the run's idle task workers leave (their logs say so) and free their tokens
    within the wait; the request ends with the block, and a later worker waits idle again."""
    ones = [served(tmp_path, job(tasks, tmp_path, tid), max_idle=2) for tid in ("L1_T001", "L1_T002")]
    pids = [r["provenance"]["task_worker"]["pid"] for r in ones]
    try:
        assert idle.idle_tokens_held(tmp_path) == 2
        with gpu_alone(tmp_path / "tw", tmp_path) as (held, waited):
            assert held == 0 and 1.0 <= waited < 10 and all(gone(pid) for pid in pids)
            assert (tmp_path / "tw" / idle.ALONE_FILE).exists()
        assert not (tmp_path / "tw" / idle.ALONE_FILE).exists()
        for tid in ("L1_T001", "L1_T002"):
            assert "a job takes the GPU alone: leaving" in (tmp_path / "tw" / f"{tid}.log").read_text()
    finally:
        for r in ones:
            stop(r)
    three = served(tmp_path, job(tasks, tmp_path, "L1_T003"), max_idle=2)
    try:
        time.sleep(1.5)
        assert not gone(three["provenance"]["task_worker"]["pid"])
    finally:
        stop(three)


def test_a_job_that_is_an_allocation_of_its_own_has_a_worker_of_its_own(tasks, tmp_path, monkeypatch):
    """Under the SLURM executor (SLURM_JOB_ID other than the workflow's): the worker serves the
    job's one step and has ended when the job returns; another allocation's job of the same task
    gets a worker of its own, never the first one's."""
    monkeypatch.delenv(lifeline.WORKFLOW_ALLOCATION_ENV, raising=False)
    pids = []
    for alloc in ("71", "72"):
        monkeypatch.setenv(lifeline.SLURM_JOB_ENV, alloc)
        res = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
        w = res["provenance"]["task_worker"]
        assert res["status"] == "pass" and w["step"] == 1, w
        assert w["retired_after"] == "served 1 step, the most one worker serves"
        assert gone(w["pid"])  # at once: the job side waited for its end
        pids.append(w["pid"])
    assert pids[0] != pids[1]
    assert worker_name(tmp_path / "tw", "L1_T001", "71") != worker_name(tmp_path / "tw", "L1_T001", "72")
    assert worker_name(tmp_path / "tw", "L1_T001") != worker_name(tmp_path / "tw", "L1_T001", "71")


def test_the_worker_ends_with_its_workflow(tasks, tmp_path, monkeypatch):
    workflow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        monkeypatch.setenv(lifeline.WORKFLOW_ENV, lifeline.process_token(workflow.pid))
        res = served(tmp_path, job(tasks, tmp_path, "L1_T001"))
        pid = res["provenance"]["task_worker"]["pid"]
        assert not gone(pid)
    finally:
        workflow.kill()
        workflow.wait()
    assert wait_for(lambda: gone(pid), 15)


# ------------------------------------------------------------------ the GPU paths, with fakes


def test_later_steps_take_the_first_steps_probe_verdict(monkeypatch):
    """CustomBuilder.probe needs CUDA not yet started; in a task worker's later step it has: the
    verdict of the task's first step (the same class: its module is named after the snippet's
    hash) is taken, instead of constructing every instance inside the lock."""
    import torch

    from l1bench.timing import harness

    state = {"init": False}
    monkeypatch.setattr(harness, "cuda_initialized", lambda: state["init"])
    monkeypatch.setattr(harness, "_PROBED", {})
    Net = type("ModelNew", (torch.nn.Module,), {"__module__": "l1snip_custom_0123456789ab"})
    first = harness.CustomBuilder(Net, [], "cuda:0")
    first.probe(42)
    assert first.cpu_safe and first.probe_note == "__init__ is CPU-only: constructed outside the lock"
    state["init"] = True  # the next step: CUDA runs since the first one
    Again = type("ModelNew", (torch.nn.Module,), {"__module__": "l1snip_custom_0123456789ab"})
    later = harness.CustomBuilder(Again, [], "cuda:0")
    later.probe(42)
    assert later.cpu_safe and later.probe_note.endswith("(probed in an earlier step of this process)")
    Other = type("ModelNew", (torch.nn.Module,), {"__module__": "l1snip_custom_ba9876543210"})
    other = harness.CustomBuilder(Other, [], "cuda:0")
    other.probe(42)
    assert not other.cpu_safe and other.probe_note.startswith("CUDA initialised before the probe")


def test_later_steps_take_the_lock_of_the_gpu_the_first_one_took(monkeypatch):
    worker = state.TaskWorker()
    first = {"tid": "L1_T001", "kind": "check"}
    worker.prepare(first)
    assert "lock_device" not in first  # placed by its first section (claim_gpu)
    first["lock_device"] = "cuda:2"
    res = {"status": "pass", "gpu_id": "2", "provenance": {}}
    worker.record(first, res)
    assert res["provenance"]["task_worker"] | {"pid": 0, "started": ""} == {
        "pid": 0, "started": "", "step": 1, "earlier_steps": [], "gpu_id": "2"
    }
    later = {"tid": "L1_T001", "kind": "time", "protocol": "paper", "mode": "cudnn"}
    worker.prepare(later)
    assert later["lock_device"] == "cuda:2"
