"""A task worker: one process that serves one task's check and its eager-mode time steps, one
after another, so that CUDA starts and the GPU's first-use work (module loading, cuDNN/cuBLAS
set-up) is paid once per task instead of once per step. Run as ``python -m l1bench.timing.serve
NAME IDLE_S [MAX_STEPS [MAX_IDLE [HOME]]]`` by :mod:`l1bench.timing.taskworker` (the job script's
side), which also kills it when a step runs over its timeout.

Why: a profile of the 41-task slice (2026-12-04, H200, bare machine) found 40 % of the GPU lock in each
process's own first-use cost (CUDA's start, the reference warm-up's first convolutions, models
to device) with one process per step. Steps stay separate, cached Snakemake jobs.

What keeps a step as clean as in a fresh process (:class:`TaskWorker`):

* one task per worker, never two; the torch.compile modes never come here (their dynamo and
  inductor state would carry over): they keep a process of their own;
* after every step, torch's process-wide settings that change speed or numerics are put back as
  they were when the worker started (:func:`l1bench.detectors.restore_global_state`: cuDNN
  benchmark, TF32, matmul precision, ...; 50 of the h100 release's custom codes set
  ``cudnn.benchmark``), and the snippets' modules are dropped;
* the worker **retires** (exits; the task's next step starts a fresh one) after a step that
  replaced a function or class attribute in torch's namespaces (a monkeypatch,
  :func:`replaced`; torch's own wrappers, :func:`torch_rewrapped`, are recorded and kept),
  left a thread of its own running, changed grad mode or the default device, broke (CUDA
  fault, out of memory: exit 3; any other exception: exit 1), or after ``max_steps`` steps;
* every result it writes says so in ``provenance.task_worker`` (its pid, the step's number in
  it, the steps that ran before in the same process).

The worker ends by itself when no step came for ``IDLE_S`` seconds; after a step, when
``MAX_IDLE`` other workers already wait idle on its GPU (:class:`IdleTokens`: each idle worker
holds its CUDA context, GPU memory no step uses; 0 sets no bound, -1 one from the GPU's memory:
:func:`auto_idle_bound`); while idle, when a job that takes its run's every GPU slot asks the
idle workers of its run (``HOME``, the workers' folder) to leave (:func:`asked_to_leave`); when
the workflow that started it is gone (:mod:`l1bench.lifeline`), and, during a step, when the job
script that sent the step is gone (its connection closed): it then kills its process group, as
a job's guard kills a one-shot worker.
"""

from __future__ import annotations

import gc
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
from pathlib import Path

from l1bench import gpus, lifeline, provenance
from l1bench.io import atomic_write_text
from l1bench.snippet import InfraError
from l1bench.timing import timingcpus
from l1bench.timing.gpulock import STATUS_ENV
from l1bench.worker.outcome import EXIT_INFRA

#: Exit status of a step that raised something other than a snippet's verdict or an
#: InfraError: a crash, as a one-shot worker's exit 1.
EXIT_CRASH = 1

#: Steps one worker serves at most before it retires (a task has a check and at most four
#: eager time steps: paper default, cuda_graph, cudnn and strict default).
MAX_STEPS = 8

#: Seconds a connected job script may take to send its step.
REQUEST_TIMEOUT_S = 30.0

#: Prefix of snippet modules (:func:`l1bench.snippet.exec_source`), dropped after each step.
SNIPPET_MODULE_PREFIX = "l1snip_"


def watched_namespaces() -> dict:
    """The objects whose attributes a step must not replace: torch's top-level namespace and its
    functional, init, autograd, linalg, fft, special and cuda modules, the Tensor classes, and
    every ``torch.nn`` module class (a patched ``nn.Conv2d.forward`` reaches every reference)."""
    import torch
    import torch.nn.functional as F

    spaces = {
        "torch": torch,
        "torch.nn.functional": F,
        "torch.nn.init": torch.nn.init,
        "torch.autograd": torch.autograd,
        "torch.linalg": torch.linalg,
        "torch.fft": torch.fft,
        "torch.special": torch.special,
        "torch.cuda": torch.cuda,
        "torch.Tensor": torch.Tensor,
    }
    base = getattr(torch._C, "TensorBase", None) or getattr(torch._C, "_TensorBase", None)
    if base is not None:
        spaces["torch._C.TensorBase"] = base
    for name, cls in vars(torch.nn).items():
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            spaces[f"torch.nn.{name}"] = cls
    return spaces


def bindings(spaces: dict) -> dict:
    """``{"space.name": object}`` of every callable, class, property or static/class method
    bound in each space's own ``__dict__`` (the objects themselves: identity is compared)."""
    out = {}
    for label, space in spaces.items():
        try:
            items = list(vars(space).items())
        except TypeError:
            continue
        for name, value in items:
            if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                out[f"{label}.{name}"] = value
    return out


def replaced(before: dict, after: dict) -> list[str]:
    """Names of ``before`` (:func:`bindings`) that ``after`` binds to another object or no longer
    has. Names new in ``after`` do not count: torch binds some lazily."""
    return sorted(k for k, v in before.items() if after.get(k, replaced) is not v)


def torch_rewrapped(old, new, depth: int = 8) -> bool:
    """Whether ``new`` is torch's own wrapper of ``old``: its code lives in torch's package and
    its ``__wrapped__`` chain reaches ``old``. Importing ``torch._dynamo`` wraps
    ``torch.manual_seed`` so (and using ``torch.compile`` ``nn.Module.__init__``): once per
    process, as in a fresh process whose snippet does the same. A snippet's own wrapper has its
    code in the snippet (``functools.wraps`` copies names, not code)."""
    import torch

    code = getattr(new, "__code__", None)
    if old is None or code is None:
        return False
    home = Path(torch.__file__).resolve().parent
    try:
        Path(code.co_filename).resolve().relative_to(home)
    except (ValueError, OSError):
        return False
    seen = new
    for _ in range(depth):
        seen = getattr(seen, "__wrapped__", None)
        if seen is None:
            return False
        if seen is old:
            return True
    return False


def process_modes() -> dict:
    """Process-wide modes that no setting restore puts back: grad mode, inference mode, anomaly
    detection and (torch >= 2.3) the default device."""
    import torch

    modes = {
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "anomaly_enabled": torch.is_anomaly_enabled(),
    }
    if hasattr(torch, "get_default_device"):
        modes["default_device"] = str(torch.get_default_device())
    return modes


def step_label(job: dict) -> str:
    """``check``, or ``time <protocol>/<mode>``."""
    if job.get("kind") == "time":
        return f"time {job.get('protocol')}/{job.get('mode')}"
    return str(job.get("kind"))


class TaskWorker:
    """The state of one task worker between steps: what it must find unchanged, and what ran."""

    def __init__(self, max_steps: int = MAX_STEPS):
        from l1bench.detectors import global_state as detectors

        self.max_steps = max_steps
        self.started = provenance.now_iso()
        self.steps: list[str] = []
        self.tid: str | None = None
        self.lock_device: str | None = None
        self.gpu_id: str | None = None
        self.settings = detectors.snapshot_global_state()
        self.modes = process_modes()
        self.namespaces = bindings(watched_namespaces())
        self.threads = set(threading.enumerate())

    def prepare(self, job: dict) -> None:
        """Before a step: the GPU this worker took in its first section (so the step takes the
        same GPU's lock), and the note that CUDA is already running."""
        from l1bench.timing import sections

        if self.tid is not None and job.get("tid") != self.tid:
            raise ValueError(f"task worker of {self.tid} was sent a step of {job.get('tid')}")
        self.tid = job.get("tid")
        if self.lock_device:
            job["lock_device"] = self.lock_device
        if self.steps:
            sections.CUDA_STARTED_BEFORE = "in an earlier step of this task worker"
            import torch

            if torch.cuda.is_initialized():  # each step's result records its own peaks (entry.gpu_memory)
                torch.cuda.reset_peak_memory_stats()

    def record(self, job: dict, res: dict) -> None:
        """After a step that made a result: what the result says about this worker."""
        self.lock_device = job.get("lock_device") or self.lock_device
        self.gpu_id = res.get("gpu_id") or self.gpu_id
        res.setdefault("provenance", {})["task_worker"] = {
            "pid": os.getpid(),
            "started": self.started,
            "step": len(self.steps) + 1,
            "earlier_steps": list(self.steps),
            "gpu_id": self.gpu_id,
        }
        self.steps.append(step_label(job))

    @staticmethod
    def drop_step() -> None:
        """After a step: its snippets' modules dropped and its objects collected, so that their
        device memory goes back to the allocator (outside the lock, as a one-shot worker's exit
        frees everything: no kernel runs)."""
        for name in [n for n in sys.modules if n.startswith(SNIPPET_MODULE_PREFIX)]:
            del sys.modules[name]
        gc.collect()

    def tidy(self) -> dict:
        """After a step (and :meth:`drop_step`): settings put back, and whether the worker must
        retire; ``{"restored": [...], "retire": reason or None, "torch_rewrapped": [...]}``."""
        from l1bench.detectors import global_state as detectors
        from l1bench.detectors.checks import _foreign_threads

        restored = detectors.diff_global_state(self.settings, detectors.snapshot_global_state())
        if restored:
            detectors.restore_global_state(self.settings)
        why = None
        now = bindings(watched_namespaces())
        patched = replaced(self.namespaces, now)
        # torch's own wrappers (dynamo's import): the new bindings are the ones to keep finding
        rewrapped = [k for k in patched if torch_rewrapped(self.namespaces[k], now.get(k))]
        self.namespaces.update({k: now[k] for k in rewrapped})
        patched = [k for k in patched if k not in rewrapped]
        modes = process_modes()
        left = [t.name for t in _foreign_threads(self.threads)]
        still = detectors.diff_global_state(self.settings, detectors.snapshot_global_state())
        if patched:
            why = f"the step replaced {len(patched)} of torch's bindings: {', '.join(patched[:4])}"
        elif modes != self.modes:
            why = "the step changed " + ", ".join(k for k in modes if modes[k] != self.modes.get(k))
        elif left:
            why = f"threads the step started still run: {', '.join(sorted(left)[:4])}"
        elif still:
            why = f"settings could not be put back: {', '.join(still[:4])}"
        elif len(self.steps) >= self.max_steps:
            n = len(self.steps)
            why = f"served {n} step{'s' * (n != 1)}, the most one worker serves"
        return {"restored": restored, "retire": why, "torch_rewrapped": rewrapped}


def empty_device_cache(job: dict) -> None:
    """Hand the allocator's cached device memory back, inside the GPU lock (a call into the
    driver's resource manager), where the step used a GPU."""
    import torch

    device = job.get("device") or ""
    if not device.startswith("cuda") or not torch.cuda.is_initialized() or not torch.cuda.memory_reserved():
        return
    from l1bench.timing.sections import exclusive

    with exclusive(device, dict(job), {}):
        pass  # the section's end synchronises and empties the cache


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


#: :data:`AUTO` bound: idle task workers may hold this share of their GPU's memory, at
#: :data:`IDLE_WORKER_MIB` each. An idle worker's CUDA context and loaded modules held 714-852 MiB
#: on an H100 (torch 2.11, CUDA 13); unbounded, 45 idle workers held ~35 GB of that 80 GB GPU at
#: its fullest, and steps failed out of memory (2026-12-05, H100, the h100 release's eager modes).
#: 20 %, not less: replayed on that run's steps, a bound of 19 starts 74 more workers than none,
#: 9 starts 119 more (~0.7 s of GPU lock each).
IDLE_MEMORY_SHARE = 0.20
IDLE_WORKER_MIB = 850
#: The ``max_idle`` that asks for :func:`auto_idle_bound` (the job side's default).
AUTO = -1


def auto_idle_bound(total_mib: float, share: float = IDLE_MEMORY_SHARE, per_worker_mib: float = IDLE_WORKER_MIB) -> int:
    """How many task workers may wait idle on a GPU of ``total_mib`` MiB: those whose contexts
    fit in ``share`` of it, at least 1 (an 80 GB H100: 19; a 141 GB H200: 33, which
    its measured runs barely reached, 29-37 idle at most; 48 GB: 10; 40 GB: 9; 24 GB: 5)."""
    return max(1, int(share * float(total_mib) // per_worker_mib))


def gpu_total_mib() -> float | None:
    """Total memory of this process's current GPU in MiB, None where CUDA has not started (the
    bound is asked after a step: a step on the GPU has started it)."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**20


#: The file in the task workers' folder (``results/<device>/tmp/task-workers``) by which a job
#: that takes its run's every GPU slot (a retry after running out of GPU memory beside other
#: jobs: :func:`l1bench.plan.gpu_slots`) asks the run's idle task workers to leave, so that their
#: CUDA contexts free the GPU's memory for it (:func:`l1bench.timing.taskworker.gpu_alone` writes it).
ALONE_FILE = "gpu-alone"


def asked_to_leave(home) -> bool:
    """Whether a job has asked the idle task workers of ``home`` to leave: :data:`ALONE_FILE`
    names a process that still runs (a file left by a killed job asks nothing)."""
    try:
        token = json.loads((Path(home) / ALONE_FILE).read_text())["token"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(token, str) and token.split(":")[0].isdigit() and lifeline.alive(token)


def idle_token_stem(lock_dir, device: str | None) -> Path:
    """The idle tokens' path of ``device``'s GPU (``None``: every GPU's, as a glob) without the
    token's number: ``<lock_dir>/l1bench-<gpu>.idle``, beside the GPU's lock files."""
    from l1bench.timing.gpulock import _made_lock_dir, lock_name

    return _made_lock_dir(lock_dir) / f"l1bench-{'*' if device is None else lock_name(device)}.idle"


def idle_tokens_held(lock_dir=None) -> int:
    """How many idle tokens (:class:`IdleTokens`, every GPU's, in ``lock_dir``) a process holds:
    the idle workers bounded by them. Tokens that cannot be opened (another user's) are not
    counted; a free one is held only for the moment of the test."""
    from l1bench.timing.gpulock import try_flock

    stem = idle_token_stem(lock_dir, None)
    held = 0
    for path in sorted(stem.parent.glob(f"{stem.name}*")):
        try:
            fh = try_flock(path)
        except OSError:
            continue
        if fh is None:
            held += 1
        else:
            fh.close()
    return held


class IdleTokens:
    """At most ``n`` task workers wait idle at once per GPU of this machine (``n`` 0: no bound;
    :data:`AUTO`: :func:`auto_idle_bound` of the GPU's memory, decided after the first step).
    An idle worker holds one of ``n`` token files (``l1bench-<gpu>.idle<k>`` beside the GPU's
    lock files) under an exclusive flock, and gives it back when a step comes; a worker that
    finds none free after its step exits instead of waiting. The flock goes with the process,
    so a killed worker frees its token."""

    def __init__(self, n: int, total_mib=gpu_total_mib):
        self.n = AUTO if int(n) < 0 else int(n)
        self._total_mib = total_mib
        self._fh = None

    def bound(self) -> int:
        """The bound in force (0: none); :data:`AUTO` turns into a number once the GPU is known
        (no GPU: no bound)."""
        if self.n == AUTO:
            total = self._total_mib()
            if total is None:
                return 0
            self.n = auto_idle_bound(total)
        return self.n

    def take(self, lock_dir, device: str | None) -> bool:
        """Hold a free token of ``device``'s GPU (``lock_dir``: the GPU lock's folder, None for
        the default); True when one was free or there is no bound."""
        if not self.bound() or self._fh is not None:
            return True
        from l1bench.timing.gpulock import try_flock

        stem = idle_token_stem(lock_dir, device or "cpu")
        for k in range(self.n):
            try:
                self._fh = try_flock(f"{stem}{k}")
            except OSError:  # not ours to open (another user's token file): not free
                continue
            if self._fh is not None:
                return True
        return False

    def give_back(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file lets go of its flock
            self._fh = None

    def keep_until_exit(self) -> None:
        """Hold the token (if held) until this process has ended. A worker that leaves still
        holds its CUDA context, and tears down torch, for a while after :func:`serve` returns;
        closing the token there told :func:`l1bench.timing.taskworker.gpu_alone` that the worker (and
        its GPU memory) was gone while it still ran. A duplicate of the token's descriptor is
        never closed by Python: the kernel closes it, and lets go of the flock, only as the
        process exits."""
        if self._fh is not None:
            os.dup(self._fh.fileno())


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
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:  # the job script is gone: its step's fate is unknown to it
                return 0
        if reply.get("retire"):
            return 0
        if worker.steps and not tokens.take(lock_dir, worker.lock_device):
            print(f"task worker {os.getpid()}: {tokens.n} workers already wait idle on this GPU: exiting",
                  file=sys.stderr, flush=True)
            return 0
        idle_since = time.monotonic()
    return 0


def main(argv: list[str]) -> int:
    name, idle_s = argv[1], float(argv[2])
    max_steps = int(argv[3]) if len(argv) > 3 else MAX_STEPS
    max_idle = int(argv[4]) if len(argv) > 4 else 0  # -1: AUTO
    home = argv[5] if len(argv) > 5 else None
    return serve(name, idle_s, max_steps, max_idle, home)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
