"""What the workflow plans: the paths, inputs and parameters its rules are made of, as functions
of the config and the task selection given as arguments, so that each is tested without
Snakemake (tests/test_plan.py). The run's plan object, :class:`l1bench.runplan.RunPlan`, applies
them to one run for the rules.

* the task worker: :func:`serves_task_worker`
* the selection: :func:`protocols`, :func:`modes`, :func:`strict_modes`, :func:`task_index`,
  :func:`selected_tids`, :func:`no_code_tids`
* the release: :func:`release_root`, :func:`release_inputs`, :func:`expected_sha256`,
  :func:`load_release_files`
* result paths: :func:`task_paths`, :func:`existing`, :func:`results_on_disk`,
  :func:`with_results_on_disk`
* the tables: :func:`aggregate_inputs`, :func:`all_targets`, :func:`slice_reports`,
  :func:`curation`, :func:`report_outputs`
* the evaluation jobs: :func:`timeout`, :func:`evaluation_params`, :func:`time_priority`,
  :func:`compile_slots`, :func:`strict_params`, :func:`job_settings`

Errors a user can cause raise :class:`PlanError` (one line; the workflow stops with it), or the
release's own ``ReleaseError`` / ``FetchError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from l1bench import fetch
from l1bench import release as rel
from l1bench.modes import BY_NAME, MODES, NAMES, compiles
from l1bench.results import builds_extensions

#: The embedded CPU release of ``device: demo``.
DEMO_RELEASE = "config/demo"

#: The release's baseline files, relative to the release folder: one per mode with a baseline
#: snippet (l1bench.modes), named after the mode.
BASELINE_PATHS = {m.name: f"more_baselines/{m.name}.json" for m in MODES if m.baseline}

#: The results' protocols (the time results' first folder level).
ALL_PROTOCOLS = ("paper", "strict")

_RESULT_NAME = re.compile(r"L\d+_T\d{3}\.json")


class PlanError(ValueError):
    """A config or selection the workflow cannot plan; ``str(err)`` is one line."""


# --------------------------------------------------------------------------- the task worker


def serves_task_worker(kind: str, mode: str | None) -> bool:
    """Whether a job runs in its task's worker: the check and the time jobs of the modes it
    serves (:attr:`l1bench.modes.Mode.task_worker`); never a build."""
    return kind == "check" or (kind == "time" and mode in BY_NAME and BY_NAME[mode].task_worker)


# --------------------------------------------------------------------------- the selection


def protocols(protocol: str) -> list[str]:
    """The protocols a run times: ``both`` is paper and strict."""
    return list(ALL_PROTOCOLS) if protocol == "both" else [protocol]


def modes(selected: Iterable[str]) -> list[str]:
    """The selected modes, in the modes' order (l1bench.modes)."""
    selected = set(selected)
    return [m for m in NAMES if m in selected]


def strict_modes(run_modes: Sequence[str], strict_selection: Iterable[str] | None) -> list[str]:
    """The modes timed strictly: config ``strict.modes`` among the run's modes (null or empty: all)."""
    chosen = set(strict_selection or run_modes)
    return [m for m in run_modes if m in chosen]


def release_path(device: str) -> str:
    """The release file of a device, relative to the release folder."""
    return f"optimized_cuda_code/{device}.json"


def task_index(local_release) -> list[tuple[int, int]]:
    """(level, task) pairs of the release: read from it when present, else KernelBench's."""
    if local_release is not None:
        return [(t.level, t.task) for t in local_release]
    return [(lv, tk) for lv, n in rel.KERNELBENCH_LEVELS.items() for tk in range(1, n + 1)]


def selected_tids(all_ids, levels, tasks) -> list[str]:
    """Task ids of the selection (config ``levels``, ``tasks``); a bad selector raises the
    release's ReleaseError, an empty selection PlanError."""
    ids = rel.select_tasks(all_ids, levels, tasks)
    if not ids:
        raise PlanError("config: the task selection (levels, tasks) matches no task of the release")
    return [rel.task_id(lv, tk) for lv, tk in ids]


def no_code_tids(local_release) -> set[str]:
    """Task ids whose custom code the release lacks (none while the release is not on disk)."""
    return {rel.task_id(t.level, t.task) for t in local_release or () if t.custom_missing}


#: KernelBench's level of whole architectures: their torch.compile code generation is the
#: longest (compile step median 15-20 s against 9-12 s for levels 1 and 2, up to 160 s), so
#: their checks and compile-mode jobs are started first (:func:`check_priority`).
LONG_COMPILE_LEVEL = 3
#: The check's priority (below paper time jobs: see :func:`time_priority`).
CHECK_PRIORITY = 9


def _long_compile(tid: str | None) -> bool:
    return tid is not None and rel.parse_task_id(tid)[0] == LONG_COMPILE_LEVEL


def extension_build_tids(local_release) -> set[str] | None:
    """Task ids whose build job compiles an extension (:func:`l1bench.results.builds_extensions`
    of the custom code, the test by which every other build runs no worker:
    ``NoWorker.NOTHING_TO_BUILD``); None while the release is not on disk (then every build
    counts)."""
    if local_release is None:
        return None
    return {t.tid for t in local_release if t.custom_code and builds_extensions(t.custom_code)}


def build_slots(tid: str, compiling: set[str] | None) -> int:
    """The ``builds`` resource a build job takes: 1 when it compiles an extension (or the
    release is not parsed yet), 0 when it starts no worker at all. The profile's ``builds``
    slots cap the compilers running at once; a build that compiles nothing (172 of the h100
    release's 250 tasks) must not queue behind them: in the 41-task slice (2026-12-04, H200) such
    builds waited up to 100 s for a slot held by nvcc, and their checks with them."""
    return 1 if compiling is None or tid in compiling else 0


def build_threads(tid: str, compiling: set[str] | None, is_demo: bool) -> int:
    """The cores (``--cores``) a build job takes: none on a GPU device when it compiles an
    extension, since it takes a ``builds`` slot (:func:`build_slots`; profile: 6) and that
    resource caps the compilers; one otherwise (a build that compiles nothing is a short CPU
    job; the demo's jobs compute on the CPU). With a core each, the main command's ``--cores 1``
    built the h100 release's 78 extensions one after another: 2,701 s of its builds' 3,259 s
    are the 68 over 10 s (results/h100/build, provenance ``wall_s``)."""
    return 0 if not is_demo and build_slots(tid, compiling) else 1


def build_priority(tid: str) -> int:
    """30, above every check and time job; 31 for a level-3 task, whose check and compile-mode
    jobs are the longest chain (:func:`check_priority`)."""
    return 31 if _long_compile(tid) else 30


# --------------------------------------------------------------------------- the release


def release_root(is_demo: bool, release_dir: str | None, commit: str) -> str:
    """Folder holding the release: a user's copy (``release_dir``, for the demo too), the
    embedded demo, or the download cache."""
    if release_dir:
        return release_dir
    return DEMO_RELEASE if is_demo else f"resources/cuda-l1/{commit}"


def release_inputs(root: str, device: str, is_demo: bool) -> dict[str, str]:
    """Release files needed by the split (the release plus more_baselines, except for the demo)."""
    files = {"release": f"{root}/{release_path(device)}"}
    if not is_demo:
        files.update({k: f"{root}/{v}" for k, v in BASELINE_PATHS.items()})
    return files


def expected_sha256(path: str, is_demo: bool, overrides: Mapping[str, str]) -> str | None:
    """Pinned checksum of a release-relative path (config overrides win); None for the demo."""
    if is_demo:
        return None
    return overrides.get(path, fetch.PINNED_SHA256.get(path))


def load_release_files(files: Mapping[str, str], checksums: Mapping[str, str | None]):
    """The parsed release if its file is on disk, else None. ``files``: release_inputs;
    ``checksums``: the expected sha256 of each key (None: not checked).

    Checksums are verified and the file parsed here, so bad input stops the run before any
    job with one line naming the file, line and field (fetch.FetchError, rel.ReleaseError); a
    baseline file missing beside the release raises PlanError.
    """
    if not Path(files["release"]).exists():
        return None
    present = {k: p for k, p in files.items() if Path(p).exists()}
    for key, path in present.items():
        sha = checksums.get(key)
        if sha:
            fetch.verify_local(path, sha)
    tasks = rel.load_release(present["release"], {k: present.get(k) for k in BASELINE_PATHS})
    missing = sorted(set(files) - set(present))
    if missing:
        raise PlanError(
            f"{files[missing[0]]}: not found (a release folder holds optimized_cuda_code/ "
            "and more_baselines/ as in the upstream repository)"
        )
    return tasks


# --------------------------------------------------------------------------- result paths


def task_paths(
    res: str,
    kind: str,
    tids: Sequence[str],
    run_protocols: Sequence[str] = (),
    run_modes: Sequence[str] = (),
    run_strict_modes: Sequence[str] = (),
    only_modes: Sequence[str] | None = None,
) -> list[str]:
    """Result files of one stage (``meta``, ``build``, ``check``, ``time``) for the tasks
    ``tids`` under the results root ``res``. Time results: per protocol of ``run_protocols``,
    per mode (of ``only_modes`` when given, else of ``run_modes``) the protocol times
    (``run_strict_modes`` for strict, ``run_modes`` for paper), per task."""
    if kind == "meta":
        return [f"{res}/tasks/{tid}/meta.json" for tid in tids]
    if kind in ("build", "check"):
        return [f"{res}/{kind}/{tid}.json" for tid in tids]
    paths = []
    for protocol in run_protocols:
        in_protocol = run_strict_modes if protocol == "strict" else run_modes
        for mode in [m for m in only_modes or run_modes if m in in_protocol]:
            paths += [f"{res}/time/{protocol}/{mode}/{tid}.json" for tid in tids]
    return paths


def existing(paths: Iterable[str]) -> list[str]:
    """The paths that exist, in their order."""
    return [p for p in paths if Path(p).exists()]


def results_on_disk(res: str, kind: str, known_tids: Iterable[str]) -> list[str]:
    """check or time results under the results root ``res`` on disk, whatever the selection
    (sorted): only those named for a task of ``known_tids``, and time results only in a
    protocol/mode folder."""
    known = set(known_tids)
    if kind == "check":
        found = Path(res).glob("check/*.json")
    else:
        found = (
            p
            for p in Path(res).glob("time/*/*/*.json")
            if p.parent.parent.name in ALL_PROTOCOLS and p.parent.name in NAMES
        )
    return sorted(str(p) for p in found if _RESULT_NAME.fullmatch(p.name) and p.stem in known)


def with_results_on_disk(res: str, kind: str, selected: list[str], known_tids: Iterable[str]) -> list[str]:
    """The selection's results, then those on disk outside it: the tables cover every result
    of the device, so a narrower run never drops results from them."""
    chosen = set(selected)
    return selected + [p for p in results_on_disk(res, kind, known_tids) if p not in chosen]


# --------------------------------------------------------------------------- the tables


def curation(device: str, name: str) -> str:
    """A hand-made input of a device's tables: config/curation/<device>/<name> (each file says
    why it exists in its "about")."""
    return f"config/curation/{device}/{name}"


def aggregate_inputs(
    res: str,
    device: str,
    tids: Sequence[str],
    all_tids: Sequence[str],
    check: list[str],
    time: list[str],
    aggregate_only: bool,
) -> dict[str, list[str]]:
    """Inputs of the aggregate: every result of the selection (``check``, ``time``: the
    selection's paths; only those on disk with ``aggregate_only``) and every other result of
    the device on disk (of a task of ``all_tids``)."""
    pick = existing if aggregate_only else list
    check = with_results_on_disk(res, "check", pick(check), all_tids)
    time_ = with_results_on_disk(res, "time", pick(time), all_tids)
    tids = set(tids) | {Path(p).stem for p in check + time_}
    return {
        # task metadata (published scores) is always needed: split_release is cheap and CPU-only
        "meta": [f"{res}/tasks/{tid}/meta.json" for tid in all_tids if tid in tids],
        "check": check,
        "time": time_,
        # CPU scan for degenerate references (constant or zero output)
        "scan": pick([f"{res}/reference_scan.json"]),
        # committed annotation of results made before the worker recorded failed
        # extension builds itself (read when present)
        "extension_failures": existing([curation(device, "extension_failures.json")]),
        # committed list of flags a later detector fix showed to be false (read when present)
        "withdrawn_flags": existing([curation(device, "withdrawn_flags.json")]),
        # committed run-to-run spread of the tasks timed repeatedly (made by the lab's l1lab spread)
        "run_spread": existing([curation(device, "run_spread.json")]),
    }


def all_targets(check: list[str], time: list[str], reports: list[str], aggregate_only: bool) -> list[str]:
    """Every result of the selection (``check``, ``time``) plus the report: a missing result
    is always planned, even when a (committed) report already exists. None with
    ``aggregate_only``."""
    results = [] if aggregate_only else check + time
    return results + reports


def slice_reports(paths: Iterable[str]) -> dict[str, str]:
    """{name: task-list file} of config ``slice_reports`` (name = the file's stem); a file that
    does not exist raises PlanError."""
    out = {}
    for path in paths:
        if not Path(path).is_file():
            raise PlanError(f"config slice_reports: {path}: no such file")
        out[Path(path).stem] = path
    return out


def report_outputs(res: str, slice_names: Iterable[str]) -> list[str]:
    """The tables, figures and report of the results root ``res``, and its slice reports."""
    names = ["scores.csv", "summary.md", "per_task.md", "README.md", "extension_failures.md"]
    figs = ["figures/measured_vs_published.png", "figures/ratio_hist.png"]
    slices = [f"slices/{name}.md" for name in slice_names]
    return [f"{res}/{n}" for n in names + figs + slices]


# --------------------------------------------------------------------------- the evaluation jobs


def timeout(timeouts: Mapping[str, int], kind: str, is_demo: bool) -> int:
    """A job's timeout (config ``timeouts``); the demo caps them (demo_section: the stretch its
    hanging task holds the lock, which every other demo job waits for)."""
    t = timeouts[kind]
    if not is_demo:
        return t
    return min(t, timeouts["demo_section" if kind == "gpu_section" else "demo"])


def evaluation_params(kind: str, fingerprint: str | None, config: Mapping) -> dict:
    """Protocol parameters of a stage: hashed by Snakemake, so changing one reruns the stage.
    ``fingerprint``: what identifies the release content."""
    p = {"release": fingerprint, "paper": config["paper"]}
    if kind == "build":
        return {"release": fingerprint, "build": config["build"]}
    if kind == "check" and config["protocol"] != "paper":
        p["detectors"] = config["detectors"] | {
            "seed": config["paper"]["seed"],
            "atol": config["paper"]["atol"],
            "rtol": config["paper"]["rtol"],
        }
    return p


def job_settings(kind: str, protocol: str | None, config: Mapping) -> dict:
    """The parameters besides the paper protocol's that a check or time result records
    (``settings``): the detectors of a check when the run uses them, the strict protocol's of a
    strict time job. Compared by l1bench.staleness: a key the run does not use is not."""
    if kind == "check":
        if config["protocol"] == "paper":
            return {}
        return {"detectors": evaluation_params("check", None, config)["detectors"]}
    if kind == "time" and protocol == "strict":
        return {"strict": strict_params("strict", config["strict"])}
    return {}


def check_priority(tid: str | None = None, run_modes: Iterable[str] | None = None) -> int:
    """:data:`CHECK_PRIORITY`; above every time job for a level-3 task when the run times a
    torch.compile mode (``run_modes``; None: assume it does), so that its long compile-mode jobs
    become ready as soon as it is built rather than after the other tasks' time jobs (41-task
    slice, 2026-12-04, H200: L3_T015 built by 101 s, checked at 254 s, its two compile jobs
    started at 453 s and were the run's last). Without a compile mode there is nothing to start
    early, and the boost only put every level-3 check before every time job (a one-job-at-a-time
    run of 53 tasks in default mode spent its 207 s on the 13 level-3 checks, 2026-12-05, H100)."""
    compiling = run_modes is None or any(compiles(m) for m in run_modes)
    return 13 if compiling and _long_compile(tid) else CHECK_PRIORITY


def time_priority(protocol: str, mode: str, tid: str | None = None) -> int:
    """Time jobs before checks (priority 9): a task's modes are timed as soon as its check
    passes, so an interrupted run leaves whole tasks. Paper results before strict ones; the
    torch.compile modes first among them, so their long CPU-bound code generation starts
    early and overlaps with the GPU work of the others instead of forming the tail; a
    level-3 task's compile modes before the others' (the longest code generation).

    A strict step its task's worker serves takes the served paper steps' priority (10), so it
    follows them while the worker is up: at 5 it came 71-234 s later, after the worker's idle
    exit, and paid a fresh process's first use (2026-12-05, H100, 41-task slice: 19 of 34 later
    workers)."""
    if protocol == "strict" and not serves_task_worker("time", mode):
        return 5
    if compiles(mode):
        return 14 if _long_compile(tid) else 12
    return 10


def evaluation_threads(is_demo: bool) -> int:
    """The cores (``--cores``) a check or time job takes: 0 on a GPU, 1 for the CPU demo.

    On a GPU these jobs mostly wait for the GPU lock; how many are in flight is the ``gpu``
    resource (profile: 8; ``lab/device_run.sh``: twice the CPUs), and ``--cores`` sizes the
    CPU work, the builds. Taking a core each, the main command ``snakemake --cores 1 --config
    device=h100`` ran them one at a time, 3.7× slower, whatever ``gpu``
    said. The demo's jobs compute on the CPU, so there they take a core each."""
    return 1 if is_demo else 0


def resource_value(resource):
    """A Snakemake resource's value: Snakemake keeps global resources as objects with
    ``.value``; a plain value is its own."""
    return getattr(resource, "value", resource)


def gpu_slots(attempts: Sequence[Mapping], total) -> int:
    """The ``gpu`` job slots a check or time job takes: 1, or every slot of the run (``total``,
    Snakemake's ``gpu`` resource; None or 1: no other GPU job to keep out) once an attempt ran
    out of GPU memory while other jobs shared the GPU (:func:`l1bench.attempts.ran_out_sharing`):
    its retry then runs with no other GPU job in flight, so that only the task's own need
    decides it (2026-12-05, 80 GB H100: 22 results were lost to out-of-memory failures of a
    crowded GPU)."""
    from l1bench.attempts import ran_out_sharing

    total = resource_value(total)
    if not isinstance(total, int) or isinstance(total, bool) or total <= 1:
        return 1
    return total if ran_out_sharing(attempts) else 1


def compile_slots(mode: str) -> int:
    """1 for a torch.compile-mode time job, else 0: the profile's ``compile`` resource caps
    how many run their CPU-bound code generation at once, so the remaining job slots keep
    eager-mode jobs (which mostly wait for the GPU lock) feeding the GPU."""
    return 1 if compiles(mode) else 0


#: Strict-protocol settings that are parameters only when set (above 0): results made before
#: they existed keep their parameters, so turning one on re-times, leaving it off does not.
STRICT_OPT_IN = ("verify_outputs",)


def strict_params(protocol: str, strict: Mapping) -> dict | None:
    """The strict protocol's parameters (config ``strict`` without the mode selection, which
    is not one, and without :data:`STRICT_OPT_IN` settings left at 0); None for the paper
    protocol."""
    if protocol != "strict":
        return None
    return {k: v for k, v in strict.items() if k != "modes" and not (k in STRICT_OPT_IN and not v)}

