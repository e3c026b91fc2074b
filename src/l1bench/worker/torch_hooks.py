"""Patches of torch internals, installed once per process, and the state they keep: torch.compile
backends (``_BACKENDS``, ``_COMPILED_GRAPHS``), dynamo compiles and extension builds with the GPU
lock released, failed extension builds remembered (``_FAILED_BUILDS``) and noted on results.
Tests that replace this state patch this module.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from l1bench.gpu import gpulock
from l1bench.io import atomic_write_text
from l1bench.modes import MODES
from l1bench.results import Flag, Status
from l1bench.snippet import short

COMPILE_MODES = {m.name: m.compile for m in MODES if m.compile}

_BACKENDS: dict = {}
#: Graphs compiled by this process's compile backend (1 per graph; more means recompilation).
_COMPILED_GRAPHS = [0]


def compiled_graphs() -> int:
    """The graphs this process's compile backend has compiled so far (1 per graph; more means
    recompilation): the time result's ``compiled_graphs``."""
    return _COMPILED_GRAPHS[0]


def compile_backend(mode: str):
    """The torch.compile backend of a compile mode: inductor as ``torch.compile(mode=...)`` builds it,
    counting the graphs it compiles and letting go of the GPU lock while it generates code. One
    instance per mode and process, so rebuilt models reuse the compiled code; None where this torch
    lacks the wrapper class.
    """
    if mode not in _BACKENDS:
        import torch

        base = getattr(torch, "_TorchCompileInductorWrapper", None)
        if base is None:
            _BACKENDS[mode] = None
        else:

            class LockingInductor(base):
                __name__ = "inductor"  # what torch.compile's backend wrapper reports it as

                def __call__(self, model_, inputs_, **kwargs):
                    _COMPILED_GRAPHS[0] += 1  # every (re)compilation: recorded on the result
                    with gpulock.DeviceLock.pause_current():
                        return super().__call__(model_, inputs_, **kwargs)

            _BACKENDS[mode] = LockingInductor(mode, None, None)  # as torch.compile(mode=mode)
    return _BACKENDS[mode]


def release_lock_during_dynamo_compiles() -> bool:
    """Hand the GPU lock back while torch.compile traces and compiles a frame (CPU work): each outer
    trial's rebuilt model recompiles, and its seconds of tracing run with the lock released (the
    device synchronised first); every kernel still holds the lock. False where this torch has no
    ``torch._dynamo.convert_frame._compile``.
    """
    try:
        from torch._dynamo import convert_frame
    except ImportError:
        return False
    compile_frame = getattr(convert_frame, "_compile", None)
    if compile_frame is None:
        return False
    if hasattr(compile_frame, "__wrapped__"):
        return True

    def unlocked(*args, **kwargs):
        with gpulock.DeviceLock.pause_current():
            return compile_frame(*args, **kwargs)

    unlocked.__wrapped__ = compile_frame
    convert_frame._compile = unlocked
    return True


def prepare_compile(mode: str) -> float | None:
    """Before the compile step's GPU section: the CPU-only part of a compile mode's first call (the
    backend, a torch.compile wrapper, inductor's ``compile_fx``) on an empty module that is never
    called, so nothing timed changes. Returns its seconds; None, doing nothing, with the GPU lock held.
    """
    if gpulock.DeviceLock.current is not None:
        return None
    t0 = time.perf_counter()
    try:
        import torch

        wrap_baseline(torch.nn.Identity(), mode)
        import torch._inductor.compile_fx  # the import is the point
    except Exception:  # noqa: BLE001 - the section's own compile reports it
        pass
    return round(time.perf_counter() - t0, 3)


def wrap_baseline(model, mode: str):
    if mode in COMPILE_MODES:
        import torch

        backend = compile_backend(COMPILE_MODES[mode])
        if backend is None:
            return torch.compile(model, mode=COMPILE_MODES[mode])
        return torch.compile(model, backend=backend)
    return model


#: Extension builds that failed in this process (key: sources and flags), and their names.
_FAILED_BUILDS: dict = {}
_FAILED_BUILD_NAMES: dict = {}
#: Flag of a check/time result whose custom code could not build its own extension: the code
#: ran (and was timed) without it, on whatever fallback it has.
EXTENSION_BUILD_FAILED = Flag.EXTENSION_BUILD_FAILED


def extension_build_failures() -> list[dict]:
    """The extension builds that failed in this process: name and the compiler's first error."""
    out = []
    for key, err in _FAILED_BUILDS.items():
        text = str(err)
        lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
        first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else text)
        out.append({"extension": _FAILED_BUILD_NAMES.get(key, "?"), "error": short(first, 200)})
    return out


def note_extension_failures(res: dict, kind: str) -> dict:
    """Record failed extension builds in what a ``kind`` stage found (build, check, time); on a
    check or time also as a flag."""
    failures = extension_build_failures()
    if not failures:
        return res
    res["extension_failures"] = failures
    if kind in ("check", "time") and res.get("status") != Status.NO_CODE:
        names = ", ".join(sorted({f["extension"] for f in failures}))
        reason = (
            f"the custom code's extension {names} does not build ({failures[0]['error']}); what ran is its fallback"
        )
        flags = res.setdefault("flags", [])
        if not any(isinstance(f, dict) and f.get("flag") == EXTENSION_BUILD_FAILED for f in flags):
            flags.append({"flag": EXTENSION_BUILD_FAILED, "reason": short(reason, 200)})
    return res


def _build_key(args, kwargs) -> str | None:
    """A failing build's identity: its sources and flags, without the extension's name (some
    snippets name it after the process id, so every process would otherwise retry it)."""
    import hashlib

    kw = sorted((k, v) for k, v in kwargs.items() if k not in ("name", "verbose"))
    rest = args[1:] if args and "name" not in kwargs else args
    try:
        return hashlib.sha256(repr((rest, kw)).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - unrepresentable arguments: no memory
        return None


def _is_compile_error(err: Exception) -> bool:
    """A deterministic failure: the compiler rejected the sources (not a kill or a timeout)."""
    text = str(err)
    return "Error building extension" in text and "error" in text.split("Error building extension", 1)[1].lower()


def _failed_builds_dir() -> Path | None:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) / "failed-builds" if root else None


@contextlib.contextmanager
def exclusive_extension_build(name: str, build_directory: str | None = None):
    """One process at a time loads (and builds) an extension, and a build lock left by a killed process
    is cleared: torch's own ``lock`` file outlives a killed builder and every later load waits for it
    forever. Every load first takes an ``flock`` beside the build folder (released when its holder
    dies); its holder removes a ``lock`` file it finds. The GPU lock is handed back while waiting.
    """
    import fcntl

    root = Path(build_directory) if build_directory else (
        Path(os.environ["TORCH_EXTENSIONS_DIR"]) / name if os.environ.get("TORCH_EXTENSIONS_DIR") else None
    )
    if root is None:
        yield
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.flock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with gpulock.DeviceLock.pause_current():
                fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            stale = root / "lock"
            if stale.exists():
                stale.unlink(missing_ok=True)
                print(f"l1bench worker: removed a stale extension build lock (its process died): {stale}",
                      file=sys.stderr, flush=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remember_failed_extension_builds() -> None:
    """Make a repeated ``load_inline``/``load`` call that failed before fail again at once (snippets
    that build lazily and fall back to PyTorch would retry the same failing build in every instance
    or process): within the process for any failure, across the task's processes (``failed-builds/``
    in its extension folder) for compiler errors.
    """
    from torch.utils import cpp_extension

    def remembering(fn):
        def call(*args, **kwargs):
            failed = _FAILED_BUILDS  # looked up per call (tests replace it)
            key = _build_key(args, kwargs)
            name = str(kwargs.get("name") or (args[0] if args else "?"))
            if key in failed:
                raise failed[key]
            memo = _failed_builds_dir()
            if key is not None and memo is not None and (memo / f"{key}.txt").is_file():
                err = RuntimeError((memo / f"{key}.txt").read_text())
                failed[key], _FAILED_BUILD_NAMES[key] = err, name
                raise err
            try:
                with exclusive_extension_build(name, kwargs.get("build_directory")):
                    return fn(*args, **kwargs)
            except Exception as err:
                if key is not None:
                    failed[key], _FAILED_BUILD_NAMES[key] = err, name
                    if memo is not None and _is_compile_error(err):
                        memo.mkdir(parents=True, exist_ok=True)
                        atomic_write_text(memo / f"{key}.txt", str(err))
                raise

        call.__wrapped__ = fn
        return call

    for name in ("load_inline", "load"):
        if not hasattr(getattr(cpp_extension, name), "__wrapped__"):
            setattr(cpp_extension, name, remembering(getattr(cpp_extension, name)))


#: The steps of torch.utils.cpp_extension that run the compiler, or wait for another process
#: that runs it on the same extension.
_EXTENSION_BUILD_STEPS = ("_write_ninja_file_and_build_library", "_write_ninja_file_and_compile_objects")


def release_lock_during_extension_builds() -> None:
    """Hand the GPU lock back while an extension is compiled (or another process compiles it), so that
    snippets that build in ``forward`` do not run nvcc inside a GPU section; a load that finds its
    extension built keeps the lock.
    """
    from torch.utils import cpp_extension, file_baton

    def pausing(fn):
        def call(*args, **kwargs):
            with gpulock.DeviceLock.pause_current():
                return fn(*args, **kwargs)

        call.__wrapped__ = fn
        return call

    for name in _EXTENSION_BUILD_STEPS:
        step = getattr(cpp_extension, name, None)
        if step is not None and not hasattr(step, "__wrapped__"):
            setattr(cpp_extension, name, pausing(step))
    wait = file_baton.FileBaton.wait
    if not hasattr(wait, "__wrapped__"):
        file_baton.FileBaton.wait = pausing(wait)
