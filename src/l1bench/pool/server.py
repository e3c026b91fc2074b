"""A task worker: one process that serves one task's check and its eager-mode time steps one after
another, so that CUDA's start and the GPU's first-use work are paid once per task, not once per
step. Run as ``python -m l1bench.pool.server NAME IDLE_S [MAX_STEPS [MAX_IDLE [HOME]]]`` by
:mod:`l1bench.pool.client`, which also kills it when a step runs over its timeout.

A step runs as in a fresh process (:class:`~l1bench.pool.state.TaskWorker`): one task per
worker, the torch.compile modes never (they keep a process each); torch's settings are put back
and the snippets' modules dropped after every step; the worker retires after a step that patched
torch, left a thread running, changed grad mode or the default device, broke, or after
``MAX_STEPS``. Every result records it in ``provenance.task_worker``.

The worker exits when idle for ``IDLE_S``; after a step, when ``MAX_IDLE`` workers already wait
idle on its GPU (:class:`~l1bench.pool.idle.IdleTokens`); while idle, when a job of its run
takes the GPU alone (:func:`~l1bench.pool.idle.asked_to_leave`); and it kills its process
group when the workflow is gone or, during a step, when the job script that sent it is gone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from l1bench import lifeline
from l1bench.gpu import gpus, timingcpus
from l1bench.gpu.gpulock import STATUS_ENV
from l1bench.io import atomic_write_text
from l1bench.pool.idle import IdleTokens, asked_to_leave
from l1bench.pool.state import MAX_STEPS, TaskWorker, empty_device_cache, step_label
from l1bench.snippet import InfraError
from l1bench.worker import EXIT_INFRA

#: Exit status of a step that raised something other than a snippet's verdict or an
#: InfraError: a crash, as a one-shot worker's exit 1.
EXIT_CRASH = 1

#: Seconds a connected job script may take to send its step.
REQUEST_TIMEOUT_S = 30.0

class StepOutput:
    """During a step, this process's stdout and stderr (native writes too) go to the step's job
    log (appended); between steps back to the worker's own log (``<home>/<tid>.log``)."""

    def __init__(self, path: str | None):
        self.path, self.saved = path, None

    def __enter__(self):
        if self.path:
            sys.stdout.flush()
            sys.stderr.flush()
            self.saved = (os.dup(1), os.dup(2))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        return self

    def __exit__(self, *exc):
        if self.saved:
            sys.stdout.flush()
            sys.stderr.flush()
            for target, fd in zip((1, 2), self.saved, strict=True):
                os.dup2(fd, target)
                os.close(fd)


def handle(worker: TaskWorker, request: dict) -> dict:
    """Run one step (``request``: ``job``, ``out``, ``status``, ``log``): write its result to
    ``out`` and say how it went (``rc`` as a one-shot worker's exit status, ``retire``). The
    step's output goes to its job's log."""
    os.environ[STATUS_ENV] = request["status"]
    with StepOutput(request.get("log")):
        return _step(worker, request)


def _step(worker: TaskWorker, request: dict) -> dict:
    from l1bench.worker.entry import run

    job, t0 = request["job"], time.monotonic()
    print(f"task worker {os.getpid()}: step {len(worker.steps) + 1} ({step_label(job)})", file=sys.stderr, flush=True)
    try:
        worker.prepare(job)
        res = run(job)
    except InfraError as err:
        print(f"l1bench worker: infrastructure failure: {err}", file=sys.stderr, flush=True)
        return {"rc": EXIT_INFRA, "retire": "infrastructure failure (CUDA fault or out of memory)"}
    except BaseException:  # noqa: BLE001 - as a one-shot worker's crash: no result
        traceback.print_exc()
        return {"rc": EXIT_CRASH, "retire": "the step crashed"}
    worker.record(job, res)
    atomic_write_text(request["out"], json.dumps(res, indent=1, sort_keys=True, default=str) + "\n")
    try:
        worker.drop_step()
        empty_device_cache(job)
        after = worker.tidy()
    except InfraError as err:
        after = {"restored": [], "retire": f"tidying after the step: {err}"}
    except Exception as err:  # noqa: BLE001 - the result stands; this process does not
        after = {"restored": [], "retire": f"tidying after the step raised {type(err).__name__}: {err}"}
    if after["retire"]:
        print(f"task worker {os.getpid()}: retires: {after['retire']}", file=sys.stderr, flush=True)
    return {"rc": 0, "wall_s": round(time.monotonic() - t0, 3), "step": len(worker.steps)} | after


class Watch:
    """The worker's one thread: it ends the process group when the workflow is gone, or, while
    a step runs, when the job script that sent it has closed its connection."""

    def __init__(self, poll_s: float = 0.5):
        self.poll_s, self.conn = poll_s, None
        self.token = lifeline.workflow_token()
        threading.Thread(target=self._run, name="l1bench-task-worker-watch", daemon=True).start()

    def _client_gone(self) -> bool:
        conn = self.conn
        if conn is None:
            return False
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            return bool(readable) and conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (OSError, ValueError):
            return False

    def _run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            if not lifeline.alive(self.token) or self._client_gone():
                os.killpg(os.getpgrp(), signal.SIGKILL)


def foreign_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``) when it is
    not this process's user, else None. An abstract Unix socket has no file and so no
    permissions: any user on the machine can reach it by name, so both ends check."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid = struct.unpack("3i", raw)[1]
    return None if uid == os.getuid() else uid


def read_line(conn: socket.socket, on_wait=None, wait_s: float = 0.5, limit: int = 1 << 24) -> bytes:
    """One line (a JSON message) from ``conn``, both ways between a task worker and its job
    scripts. ``on_wait``: called every ``wait_s`` while none has come (it raises to give up);
    without it the socket's own timeout applies (``TimeoutError``). ``b""``: the other side
    closed the connection before a whole line."""
    if on_wait is not None:
        conn.settimeout(wait_s)
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            if on_wait is None:
                raise
            on_wait()
            continue
        if not chunk:
            return b""
        data += chunk
        if len(data) > limit:
            raise ValueError("message too long")
    return data


def serve(name: str, idle_s: float, max_steps: int = MAX_STEPS, max_idle: int = 0, home=None) -> int:
    """Serve steps on the abstract Unix socket ``name`` until idle for ``idle_s`` or retired;
    after a step, exit at once when ``max_idle`` workers already wait idle on its GPU; while
    idle, exit when a job asks the workers of ``home`` to leave (:func:`asked_to_leave`)."""
    import torch  # noqa: F401 - imported once, before the first step

    import l1bench.worker.stages  # noqa: F401 - the worker's modules, loaded before any step

    # before this process starts its thread: keep off the GPUs' timing CPUs, as every worker
    # does before CUDA starts (entry.pick_device); the workflow has usually done it already
    ids = gpus.visible_gpu_ids()
    if ids:
        timingcpus.reserve_timing_cpus(len(ids), None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)  # abstract: no file, gone with the process
    listener.listen(4)
    listener.settimeout(0.5)
    worker, watch, tokens = TaskWorker(max_steps), Watch(), IdleTokens(max_idle)
    try:
        return _serve(listener, worker, watch, tokens, idle_s, home)
    finally:
        tokens.keep_until_exit()


def _serve(listener, worker: TaskWorker, watch: Watch, tokens: IdleTokens, idle_s: float, home) -> int:
    """:func:`serve`'s loop: accept steps until idle for ``idle_s``, retired or asked to leave."""
    worker.threads.update(threading.enumerate())
    idle_since, lock_dir = time.monotonic(), None
    while time.monotonic() - idle_since < idle_s:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            # a worker that has served no step has not started CUDA: it holds no GPU memory, and
            # it is the one the asking job starts for itself, whose connection may be late
            if worker.steps and home is not None and asked_to_leave(home):
                listener.close()  # no job reaches a worker on its way out
                print(f"task worker {os.getpid()}: a job takes the GPU alone: leaving", file=sys.stderr, flush=True)
                return 0
            continue
        tokens.give_back()  # busy now (or about to be): another worker may wait idle instead
        with conn:
            uid = foreign_uid(conn)
            if uid is not None:  # another user's process: no greeting, no step
                print(f"task worker {os.getpid()}: refused a connection of uid {uid}", file=sys.stderr, flush=True)
                continue
            try:
                conn.settimeout(REQUEST_TIMEOUT_S)  # the job script sends its step at once
                conn.sendall(json.dumps({"pid": os.getpid(), "steps": len(worker.steps)}).encode() + b"\n")
                line = read_line(conn)
            except OSError:  # gone, or silent: no step came
                continue
            if not line:
                continue  # a client that gave up
            conn.settimeout(None)
            watch.conn = conn
            request = json.loads(line)
            lock_dir = (request.get("job") or {}).get("lock_dir") or lock_dir
            try:
                reply = handle(worker, request)
            finally:
                watch.conn = None
            # settled before the reply: once its job has the reply, the worker waits idle holding
            # a token, or is on its way out (a job that then takes the GPU alone counts on it)
            stays = not reply.get("retire") and _stays_idle(worker, tokens, lock_dir)
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:  # the job script is gone: its step's fate is unknown to it
                return 0
        if not stays:
            return 0
        idle_since = time.monotonic()
    return 0


def _stays_idle(worker: TaskWorker, tokens: IdleTokens, lock_dir) -> bool:
    """After a step: whether the worker waits idle for its task's next step, holding one of its
    GPU's idle tokens; False when as many workers already wait idle there."""
    if not worker.steps or tokens.take(lock_dir, worker.lock_device):
        return True
    print(f"task worker {os.getpid()}: {tokens.n} workers already wait idle on this GPU: exiting",
          file=sys.stderr, flush=True)
    return False


def main(argv: list[str]) -> int:
    name, idle_s = argv[1], float(argv[2])
    max_steps = int(argv[3]) if len(argv) > 3 else MAX_STEPS
    max_idle = int(argv[4]) if len(argv) > 4 else 0  # -1: AUTO
    home = argv[5] if len(argv) > 5 else None
    return serve(name, idle_s, max_steps, max_idle, home)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
