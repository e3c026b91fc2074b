"""Jobs die with the run that started them: no worker outlives its job, no job its workflow.

* **workflow -> job script.** The Snakemake process exports a token naming itself
  (:data:`WORKFLOW_ENV`: pid, start time and host); the runner checks it while its worker runs
  and, once the workflow is gone, stops the worker and ends without a result (not an attempt).
  A job on another host (a cluster job) does not watch it: the scheduler cancels those.
* **job script -> worker.** The worker runs under a guard (``python -m l1bench.lifeline
  PARENT_PID CMD...``) that leads its process group and kills the whole group when the job
  script dies (``PR_SET_PDEATHSIG``, else polling); it passes the worker's exit status on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Environment variable with the token of the Snakemake process that runs the workflow.
WORKFLOW_ENV = "L1BENCH_WORKFLOW"
#: Environment variable with the cluster allocation the Snakemake process runs in ("" for none).
WORKFLOW_ALLOCATION_ENV = "L1BENCH_WORKFLOW_ALLOCATION"
#: The variable in which SLURM names the allocation (job) a process runs in.
SLURM_JOB_ENV = "SLURM_JOB_ID"


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of a process from /proc; None when it does not exist.

    Raises OSError when /proc cannot tell (not Linux).
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3, start time 22
    return fields[0], fields[19]


def process_token(pid: int | None = None) -> str:
    """``pid:start`` of a process (``pid`` alone where /proc is not available)."""
    pid = os.getpid() if pid is None else pid
    try:
        stat = _proc_stat(pid)
    except OSError:
        stat = None
    return f"{pid}:{stat[1]}" if stat else str(pid)


def alive(token: str | None) -> bool:
    """Whether the process named by a :func:`process_token` still runs (True for no token,
    and for a token that :func:`mark_workflow` made on another host: it cannot be seen here).

    A zombie (exited, not yet reaped) counts as gone, and so does another process that got the
    same pid later.
    """
    if not token:
        return True
    token, _, host = token.partition("@")
    if host and host != socket.gethostname():
        return True
    pid_s, _, start = token.partition(":")
    try:
        pid = int(pid_s)
    except ValueError:
        return True  # not a token of ours: never stop a job for it
    try:
        stat = _proc_stat(pid)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return not start or stat[1] == start


def mark_workflow() -> str:
    """In the Snakemake process: export its token (``pid:start@host``), so every job it starts
    on this host can watch it."""
    token = f"{process_token()}@{socket.gethostname()}"
    os.environ[WORKFLOW_ENV] = token
    os.environ[WORKFLOW_ALLOCATION_ENV] = os.environ.get(SLURM_JOB_ENV, "")
    return token


def own_allocation(environ=None) -> str | None:
    """The cluster allocation (SLURM job id) this job runs in when it is one of its own, not
    the workflow's (the cluster executor submits each job as a job of its own); None where the
    job runs in the workflow's process tree, allocation or none. Processes a job leaves behind
    outlive its allocation where the cluster does not track them (``proctrack/linuxproc`` loses
    a process whose parent has exited), and a later job on the same node could reach them."""
    env = os.environ if environ is None else environ
    alloc = env.get(SLURM_JOB_ENV) or None
    return alloc if alloc and alloc != env.get(WORKFLOW_ALLOCATION_ENV) else None


def workflow_token() -> str | None:
    """The token of the workflow this process belongs to (None outside a workflow)."""
    return os.environ.get(WORKFLOW_ENV) or None


def exit_with_workflow(poll: float = 0.5, code: int = 1) -> threading.Thread | None:
    """In a job script that does its work in children of its own (not through the runner):
    end this process once the workflow that started the job is gone; children started under
    :func:`guarded` die with it. None outside a workflow."""
    token = workflow_token()
    if not token:
        return None

    def watch():
        while alive(token):
            time.sleep(poll)
        os._exit(code)

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread


# --------------------------------------------------------------------------- the guard

PR_SET_PDEATHSIG = 1


def _ask_for_parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send ``sig`` to this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill_own_group(*_args) -> None:
    """Kill this process's group: the guard itself, the worker and all it started."""
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(137)


def _watch_parent(parent: int, poll: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(poll)
    _kill_own_group()


def guard(parent: int, cmd: list[str]) -> int:
    """Run ``cmd`` in this process's group until it ends; kill the group if ``parent`` dies.

    Returns the command's exit code; a command killed by a signal makes this process die of
    the same signal, so whoever started the guard sees what the command did.
    """
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # lead a group of our own (the runner already starts us in a session)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _kill_own_group)
    if not _ask_for_parent_death_signal(signal.SIGTERM):
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        _kill_own_group()
    # the command dies with the guard too, however the guard ends (a SIGKILL on a timeout)
    rc = subprocess.Popen(cmd, preexec_fn=lambda: _ask_for_parent_death_signal(signal.SIGKILL)).wait()
    if rc < 0:
        if -rc not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


def guarded(cmd: list[str]) -> list[str]:
    """``cmd`` run under the guard, with this process as the parent it watches."""
    return [sys.executable, "-m", "l1bench.lifeline", str(os.getpid()), *cmd]


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m l1bench.lifeline PARENT_PID CMD [ARGS...]")
    sys.exit(guard(int(sys.argv[1]), sys.argv[2:]))
