"""The job script's side of a task worker.

A check or an eager-mode time job (:func:`l1bench.plan.serves_task_worker`) does not start a
worker of its own: :func:`run_in_task_worker` takes its task's step lock (one step at a time),
connects to the task's worker (an abstract Unix socket named after the results folder and the
task) or starts one, sends the job and waits for the reply as :func:`l1bench.pool.runner.run_worker`
waits for a one-shot worker (lock waits not counted, timeouts kill the worker's process group).
The outcome is the same: what the step found (a dict), :class:`JobFailed` or
:class:`JobStopped`; a broken worker costs only its step.

A job that takes its run's every GPU slot first asks the run's idle task workers to leave
(:func:`gpu_alone`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from l1bench import lifeline
from l1bench.io import atomic_write_text
from l1bench.pool.idle import ALONE_FILE, AUTO, idle_tokens_held
from l1bench.pool.runner import (
    JobFailed,
    JobStopped,
    WorkflowGone,
    absolute_paths,
    device_word,
    exit_text,
    job_error,
    overdue,
    scratch_folder,
    worker_env,
)
from l1bench.pool.server import foreign_uid, read_line
from l1bench.pool.state import MAX_STEPS
from l1bench.worker import EXIT_INFRA

#: Seconds a new worker may take to listen (imports torch and the worker's modules).
START_TIMEOUT_S = 120.0

#: Seconds a task worker waits for its task's next step before it exits (it holds a CUDA
#: context while it waits).
IDLE_S = 60.0


def worker_name(home, tid: str, allocation: str | None = None) -> str:
    """The abstract socket name of a task's worker: one per results folder and task, and per
    cluster allocation for a job that is one of its own (:func:`l1bench.lifeline.own_allocation`):
    no job reaches a worker of another allocation."""
    key = f"{Path(home).resolve()}|{tid}" + (f"|{allocation}" if allocation else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return f"l1bench-task-{digest}"


def _connect(name: str) -> socket.socket | None:
    """A connection to the worker listening on ``name``, None when none listens. A listener of
    another user (the abstract name taken before ours: no file, so no permissions keep it) is
    refused (:class:`JobStopped`): it would get our steps and could answer them."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + name)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    uid = foreign_uid(sock)
    if uid is not None:
        sock.close()
        # nothing about the task broke: not an attempt of it
        raise JobStopped(f"the task worker socket {name} is held by another user's process (uid {uid}): refused")
    return sock


def kill_worker(pid: int | None) -> None:
    """Kill a task worker's process group: its own session's, led by the shell that waits for it
    (:func:`start_worker`)."""
    if not pid:
        return
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


#: The shell that starts a task worker and, when it ends, writes ``<pid> <status>`` to the file
#: named first (atomically): how a worker ended reaches a later step's job side, which is not
#: its parent and so cannot wait for it (a one-shot worker's job side is: "worker crashed
#: (signal SIGKILL)").
_NANNY = 'f=$1; shift; "$@" & p=$!; wait "$p"; s=$?; echo "$p $s" >"$f.tmp" && mv -f "$f.tmp" "$f"; exit "$s"'


def status_text(status: int) -> str:
    """A shell's exit status as a one-shot worker's crash names it (:func:`l1bench.pool.runner.exit_text`):
    the shell reports a child ended by signal n as 128 + n."""
    if status > 128 and status - 128 in signal.valid_signals():
        return exit_text(128 - status)
    return exit_text(status)


def exit_file(server_log: Path) -> Path:
    """Where the shell of :data:`_NANNY` writes how the task's worker ended (absolute: the shell
    runs in the task's extension folder)."""
    return Path(server_log).resolve().with_suffix(".exit")


def how_it_ended(path: Path, pid: int, wait_s: float = 2.0) -> str | None:
    """How worker ``pid`` ended, as a one-shot worker's crash says it ("signal SIGKILL", "exit
    code 3"), from its shell's :func:`exit_file` (waited for up to ``wait_s``); None when the
    file does not name it (the shell was killed too, or the worker still runs)."""
    until = time.monotonic() + wait_s
    while True:
        try:
            got_pid, status = (int(x) for x in Path(path).read_text().split())
        except (OSError, ValueError):
            got_pid, status = None, None
        if got_pid == pid:
            return status_text(status)
        if time.monotonic() > until:
            return None
        time.sleep(0.05)


class StepLock:
    """The task's step lock: one step at a time goes to its worker. Waiting checks the
    workflow's lifeline (:class:`JobStopped` once it is gone)."""

    def __init__(self, path: Path, poll_s: float = 0.05):
        self.path, self.poll_s, self.fh = Path(path), poll_s, None
        self.waited_s = 0.0

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        t0, token = time.monotonic(), lifeline.workflow_token()
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not lifeline.alive(token):
                    self.fh.close()
                    raise JobStopped(f"{self.path.stem}: stopped, the workflow that started it is gone") from None
                time.sleep(self.poll_s)
        self.waited_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def start_worker(
    name: str, job: dict, env: dict, server_log: Path, idle_s: float, log, max_idle: int = 0,
    max_steps: int = MAX_STEPS,
) -> tuple[socket.socket, int]:
    """Start the task's worker and connect to it: (connection, pid). ``max_idle``: how many
    workers may wait idle on its GPU at once (:class:`l1bench.pool.idle.IdleTokens`; -1: as
    many as fit its memory, :func:`l1bench.pool.idle.auto_idle_bound`); ``max_steps``: the
    steps it serves before it retires."""
    scratch = Path(job.get("ext_dir") or tempfile.gettempdir()).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    server_log.parent.mkdir(parents=True, exist_ok=True)
    # the workers' folder (this log's) last: the idle workers of a run leave when a job of it
    # takes the GPU alone (gpu_alone)
    cmd = [sys.executable, "-m", "l1bench.pool.server", name, f"{idle_s:g}", str(int(max_steps)), str(int(max_idle)),
           str(server_log.parent.resolve())]
    device = device_word(job)  # the CPU: no memory bound (IdleTokens.bound)
    bound = f", at most {int(max_idle)} idle on its {device}" if max_idle > 0 else ""
    bound = ", idle on its GPU at most as many as fit its memory" if max_idle < 0 and device == "GPU" else bound
    log.write(f"$ {' '.join(cmd)}  (task worker of {job['tid']}, idle exit after {idle_s:g} s{bound})\n")
    log.flush()
    nanny = ["/bin/sh", "-c", _NANNY, "sh", str(exit_file(server_log)), *cmd]
    with open(server_log, "a") as out:
        proc = subprocess.Popen(
            nanny, cwd=scratch, stdout=out, stderr=subprocess.STDOUT, env=worker_env(env), start_new_session=True
        )
    t0 = time.monotonic()
    while True:
        sock = _connect(name)
        if sock is not None:
            return sock, proc.pid
        if proc.poll() is not None:
            raise JobFailed(
                f"{job['tid']}: the task worker exited ({status_text(proc.returncode)}) before it listened, "
                f"see {server_log}"
            )
        if time.monotonic() - t0 > START_TIMEOUT_S:
            kill_worker(proc.pid)
            raise JobFailed(f"{job['tid']}: the task worker did not listen within {START_TIMEOUT_S:.0f} s", "timeout")
        time.sleep(0.05)


def connect(
    name: str, job: dict, env: dict, server_log: Path, idle_s: float, log, max_idle: int = 0,
    max_steps: int = MAX_STEPS,
) -> tuple[socket.socket, dict]:
    """A connection to the task's worker, started if none listens, and its greeting (``pid``,
    ``steps`` served so far). A worker that ends as it is reached (its idle time ran out just
    then) closes without a greeting: a fresh one is started."""
    for _ in range(3):
        sock = _connect(name)
        if sock is None:
            sock, _pid = start_worker(name, job, env, server_log, idle_s, log, max_idle, max_steps)
        until = time.monotonic() + START_TIMEOUT_S

        def patience(until=until):
            if time.monotonic() > until:
                raise JobFailed(f"{job['tid']}: the task worker did not answer within {START_TIMEOUT_S:.0f} s")

        try:
            line = read_line(sock, patience)
        except OSError:
            line = b""
        if line:
            return sock, json.loads(line)
        sock.close()
        time.sleep(0.1)
    raise JobFailed(f"{job['tid']}: no task worker could be reached (three tries)")


#: How long the job side of a cluster allocation's worker waits for it to end after its one step
#: (it then kills what is left of it).
ALLOCATION_EXIT_WAIT_S = 10.0


#: How long :func:`gpu_alone` waits at least (an idle worker looks for the file every 0.5 s, and
#: workers without an idle bound hold no token to watch), and at most.
ALONE_SETTLE_S = 1.0
ALONE_WAIT_S = 10.0


@contextlib.contextmanager
def gpu_alone(home, lock_dir=None, settle_s: float | None = None, wait_s: float | None = None,
              poll_s: float = 0.1):
    """For a job that takes its run's every GPU slot: ask the run's idle task workers (of ``home``) to
    leave and wait (``settle_s`` at least, then until no idle token of ``lock_dir`` is held,
    ``wait_s`` at most); yields ``(tokens still held, seconds waited)``. The request ends with the
    block or this process.
    """
    settle_s = ALONE_SETTLE_S if settle_s is None else settle_s
    wait_s = ALONE_WAIT_S if wait_s is None else wait_s
    path = Path(home) / ALONE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = lifeline.process_token(os.getpid())
    atomic_write_text(path, json.dumps({"token": mine}) + "\n")
    try:
        t0 = time.monotonic()
        while True:
            held, waited = idle_tokens_held(lock_dir), time.monotonic() - t0
            if waited >= wait_s or (waited >= settle_s and not held):
                break
            time.sleep(poll_s)
        yield held, waited
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("token") == mine:
                path.unlink()


def run_in_task_worker(
    job: dict,
    timeout: float,
    log_path,
    home,
    env: dict | None = None,
    section_timeout: float | None = None,
    idle_s: float = IDLE_S,
    max_idle: int = AUTO,
) -> dict:
    """Run one step in its task's worker and return what it found (see the module's doc). ``home``:
    the folder of the step locks and the workers' logs. A job that is a cluster allocation of its
    own (:func:`l1bench.lifeline.own_allocation`) has a worker that serves its one step and ends
    before the job does.
    """
    home = Path(home)
    job = absolute_paths(job)
    allocation = lifeline.own_allocation()
    max_steps = 1 if allocation else MAX_STEPS
    name, token = worker_name(home, job["tid"], allocation), lifeline.workflow_token()
    if not lifeline.alive(token):  # stopped before it began: no worker is started for it
        raise job_error(job["tid"], WorkflowGone, timeout, section_timeout)
    with StepLock(home / f"{job['tid']}.lock") as step_lock, scratch_folder() as tmp:
        out_path, status = Path(tmp) / "result.json", Path(tmp) / "lock-status.json"
        with open(log_path, "a") as log:
            sock, hello = connect(name, job, dict(env or {}), home / f"{job['tid']}.log", idle_s, log, max_idle,
                                  max_steps)
            with sock:
                pid = hello["pid"]
                log.write(
                    f"task worker {pid} of {job['tid']}: step {hello.get('steps', 0) + 1}"
                    f" (waited {step_lock.waited_s:.1f} s for the task's earlier steps)\n"
                )
                log.flush()
                request = {
                    "job": job, "out": str(out_path), "status": str(status), "log": str(Path(log_path).resolve())
                }
                sock.sendall(json.dumps(request).encode() + b"\n")
                t0 = time.monotonic()

                def check():
                    why = overdue(status, t0, timeout, section_timeout, token)
                    if why is not None:
                        kill_worker(pid)
                        raise job_error(job["tid"], why, timeout, section_timeout, device_word(job))

                line = read_line(sock, check)
            if not line:
                raise _died(job["tid"], pid, token, home, timeout, section_timeout)
            reply = json.loads(line)
            log.write(f"task worker {pid}: step done in {reply.get('wall_s', 0):.1f} s, exit status {reply['rc']}"
                      + (f"; it retires: {reply['retire']}" if reply.get("retire") else "") + "\n")
            if allocation:  # it ends with the step: wait for it (a moment), so that it ends inside the job
                how_it_ended(exit_file(home / f"{job['tid']}.log"), pid, wait_s=ALLOCATION_EXIT_WAIT_S)
                kill_worker(pid)
        res = _result(job["tid"], reply, out_path)
    return _served(res, reply, step_lock.waited_s)


def _died(tid: str, pid: int, token, home: Path, timeout: float, section_timeout) -> Exception:
    """Why the task worker ``pid`` closed the connection without a reply, as the exception that
    ends the job: the workflow is gone (a stop), or the worker died during the step (a crash,
    named as a one-shot worker's crash is where its shell recorded how it ended). Whatever is
    left of the worker is killed."""
    if not lifeline.alive(token):
        # the worker ends with the workflow (its lifeline): a stop, not the task's fault
        kill_worker(pid)
        return job_error(tid, WorkflowGone, timeout, section_timeout)
    how = how_it_ended(exit_file(home / f"{tid}.log"), pid)  # before its shell goes
    kill_worker(pid)
    if how is not None:  # as a one-shot worker's crash reads (the log names the worker)
        return JobFailed(f"{tid}: worker crashed ({how}), see log")
    return JobFailed(f"{tid}: the task worker ({pid}) died during the step, see log")


def _result(tid: str, reply: dict, out_path: Path) -> dict:
    """The step's result from the worker's reply and the file it wrote; JobFailed as a one-shot
    worker's exit status would raise it."""
    if reply["rc"] == EXIT_INFRA:
        raise JobFailed(f"{tid}: infrastructure failure (CUDA fault or out of memory), see log", "infra")
    if reply["rc"] != 0:
        raise JobFailed(f"{tid}: the step crashed in the task worker (status {reply['rc']}), see log")
    if not out_path.exists():
        raise JobFailed(f"{tid}: the task worker replied without a result")
    return json.loads(out_path.read_text())


def _served(res: dict, reply: dict, step_lock_wait_s: float) -> dict:
    """``res`` with what its ``provenance.task_worker`` adds on the job's side: the wait for the
    task's step lock, the settings put back, torch's rewrapped bindings and why the worker retired."""
    served = res.setdefault("provenance", {}).setdefault("task_worker", {})
    served["step_lock_wait_s"] = round(step_lock_wait_s, 3)
    if reply.get("restored"):
        served["settings_restored_after"] = reply["restored"]
    if reply.get("torch_rewrapped"):
        served["torch_rewrapped_after"] = reply["torch_rewrapped"]
    if reply.get("retire"):
        served["retired_after"] = reply["retire"]
    return res
