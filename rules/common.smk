# Helpers only: config validation, the task table, paths and input functions.
import glob
import re
import subprocess
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

#: The one line a run without the l1bench package (src/l1bench, pyproject.toml) stops with.
NOT_INSTALLED = (
    "the l1bench package is not installed: run `pip install -e .` in this repository "
    "(offline: see docs/running.md)"
)

try:
    from l1bench import release as rel
    from l1bench import archive, fetch, freshness, lifeline, preflight, recovery
    from l1bench.io import logs_dir
    from l1bench.results import AGREEMENT
except ModuleNotFoundError as err:
    if err.name != "l1bench":
        raise
    sys.exit(NOT_INSTALLED)


def _normalise_cli_booleans(cfg):
    """--config values as the command line gives them, typed as the schema wants (before validation)."""
    for key in ("aggregate_only",):
        val = cfg.get(key)
        if isinstance(val, str) and val.lower() in (
            "true",
            "false",
            "1",
            "0",
            "yes",
            "no",
        ):
            cfg[key] = val.lower() in ("true", "1", "yes")
    # --config device=3090 arrives as the integer 3090: the release names are strings
    if isinstance(cfg.get("device"), int) and not isinstance(cfg.get("device"), bool):
        cfg["device"] = str(cfg["device"])


def validate_config():
    """Schema validation (fills defaults); a bad value stops with one line naming the key
    (Snakemake's own message adds the schema's fragment)."""
    try:
        validate(config, schema="../config/schemas/config.schema.yaml")
    except WorkflowError as err:
        schema = Path(workflow.basedir) / "config/schemas/config.schema.yaml"
        line = preflight.config_error(config, schema)
        raise WorkflowError(line or str(err).strip().splitlines()[0]) from None


_normalise_cli_booleans(config)
validate_config()

DEVICE = config["device"]
RES = f"{config['results_dir']}/{DEVICE}"
# job logs: logs/<device> for results/<device>, a folder of their own for other trees
LOGS = logs_dir(RES)
IS_DEMO = DEVICE == "demo"
DEMO_RELEASE = "config/demo"
PROTOCOLS = (
    ["paper", "strict"] if config["protocol"] == "both" else [config["protocol"]]
)
MODES = [m for m in rel.MODES if m in config["modes"]]
STRICT_MODES = [m for m in MODES if m in (config["strict"]["modes"] or MODES)]
RELEASE_PATH = f"optimized_cuda_code/{DEVICE}.json"
BASELINE_PATHS = {
    "cuda_graph": "more_baselines/cuda_graph.json",
    "cudnn": "more_baselines/cudnn.json",
}


def check_release_dir():
    """A release_dir that is not a release stops the run (one line), whatever is on disk."""
    if IS_DEMO or not config["release_dir"]:
        return
    problem = preflight.release_dir_problem(config["release_dir"], RELEASE_PATH)
    if problem:
        raise WorkflowError(problem)


check_release_dir()


def release_root():
    """Folder holding the release: the demo, a user's copy, or the download cache."""
    if IS_DEMO:
        return DEMO_RELEASE
    if config["release_dir"]:
        return config["release_dir"]
    return f"resources/cuda-l1/{config['upstream']['commit']}"


def release_inputs():
    """Release files needed by the split (the release plus more_baselines, except for the demo)."""
    root = release_root()
    files = {"release": f"{root}/{RELEASE_PATH}"}
    if not IS_DEMO:
        files.update({k: f"{root}/{v}" for k, v in BASELINE_PATHS.items()})
    return files


def expected_sha256(path):
    """Pinned checksum of a release-relative path (config overrides win); None for the demo."""
    if IS_DEMO:
        return None
    return config["release_sha256"].get(path, fetch.PINNED_SHA256.get(path))


def release_fingerprint():
    """What identifies the release content: it is a param of every evaluation job."""
    if IS_DEMO:
        return fetch.sha256_file(release_inputs()["release"])
    return expected_sha256(RELEASE_PATH)


def load_local_release():
    """The parsed release if it is on disk (demo, release_dir or download cache), else None.

    Checksums are verified and the file parsed here, so bad input stops the run before any
    job with one line naming the file, line and field.
    """
    files = release_inputs()
    if not Path(files["release"]).exists():
        return None
    present = {k: p for k, p in files.items() if Path(p).exists()}
    try:
        for key, path in present.items():
            sha = expected_sha256(
                RELEASE_PATH if key == "release" else BASELINE_PATHS[key]
            )
            if sha:
                fetch.verify_local(path, sha)
        tasks = rel.load_release(
            present["release"], {k: present.get(k) for k in BASELINE_PATHS}
        )
    except (rel.ReleaseError, fetch.FetchError) as err:
        raise WorkflowError(str(err)) from None
    missing = sorted(set(files) - set(present))
    if missing:
        raise WorkflowError(
            f"{files[missing[0]]}: not found (a release folder holds optimized_cuda_code/ "
            "and more_baselines/ as in the upstream repository)"
        )
    return tasks


def materialise_task_folders(tasks):
    """Split a local release at parse time when task folders are missing or stale.

    The folders then exist before the DAG is built, so the evaluation jobs' ancient()
    inputs never mark committed results as outdated (a fresh clone re-times nothing). The
    split_release rule does the same job when the release must be downloaded first.
    """
    from l1bench import split

    sha = fetch.sha256_file(release_inputs()["release"])
    stale = set(split.stale_task_folders(tasks, Path(f"{RES}/tasks"), sha))
    if stale:
        info = {"path": RELEASE_PATH, "sha256": sha}
        split.split_release(tasks, Path(f"{RES}/tasks"), DEVICE, info, wanted=stale)


def task_index():
    """(level, task) pairs of the release: read from it when present, else KernelBench's."""
    if LOCAL_RELEASE is not None:
        return [(t.level, t.task) for t in LOCAL_RELEASE]
    return [
        (lv, tk) for lv, n in rel.KERNELBENCH_LEVELS.items() for tk in range(1, n + 1)
    ]


def selected_tids():
    try:
        ids = rel.select_tasks(ALL_IDS, config["levels"], config["tasks"])
    except rel.ReleaseError as err:
        raise WorkflowError(str(err)) from None
    if not ids:
        raise WorkflowError(
            "config: the task selection (levels, tasks) matches no task of the release"
        )
    return [rel.task_id(lv, tk) for lv, tk in ids]


def reserve_timing_cpus():
    """onstart: keep this Snakemake process, and so every job it starts, off the GPUs' timing
    CPUs (gpulock.keep_workflow_off_timing_cpus): only a lock holder's timing thread runs there.
    Only where the jobs run on this host (not for a cluster executor, whose jobs time on other
    nodes), and not for the CPU demo or a table rebuild, which time nothing on a GPU."""
    if not preflight.gpus_are_local(
        workflow.local_exec, IS_DEMO, config["aggregate_only"]
    ):
        return []
    from l1bench import gpulock

    timing = gpulock.keep_workflow_off_timing_cpus(gpulock.visible_gpu_count())
    if timing:
        print(
            f"timing CPUs {timing} reserved for the GPU lock holders; the workflow runs on the others",
            file=sys.stderr,
        )
    return timing


def recover_from_a_killed_run():
    """In the Snakemake process: export its token (jobs stop when it is gone, l1bench.lifeline);
    keep the results that jobs of a killed run completed, and release that run's locks
    (l1bench.recovery), so the next run neither redoes them nor needs --unlock."""
    if not workflow.is_main_process:
        return
    lifeline.mark_workflow()
    kept = recovery.keep_completed_results(RES)
    if kept:
        print(
            f"kept {len(kept)} result(s) that jobs of an interrupted run completed after its "
            f"Snakemake process stopped recording them ({kept[0]}{', ...' * (len(kept) > 1)})",
            file=sys.stderr,
        )
    for owner in recovery.release_locks_of_dead_runs():
        print(
            f"released the locks of a run that was killed (pid {owner['token'].split(':')[0]})",
            file=sys.stderr,
        )


recover_from_a_killed_run()
LOCAL_RELEASE = load_local_release()
if LOCAL_RELEASE is not None:
    materialise_task_folders(LOCAL_RELEASE)
ALL_IDS = task_index()
ALL_TIDS = [rel.task_id(lv, tk) for lv, tk in ALL_IDS]
ALL_TIDS_SET = set(ALL_TIDS)
TIDS = selected_tids()
FINGERPRINT = release_fingerprint()
NO_CODE_TIDS = {
    rel.task_id(t.level, t.task) for t in LOCAL_RELEASE or () if t.custom_missing
}


wildcard_constraints:
    tid=r"L\d+_T\d{3}",
    mode="|".join(rel.MODES),
    protocol="paper|strict",


def timeout(kind):
    """A job's timeout; the demo caps them (demo_section: the stretch its hanging task holds
    the lock, which every other demo job waits for)."""
    t = config["timeouts"][kind]
    if not IS_DEMO:
        return t
    return min(
        t, config["timeouts"]["demo_section" if kind == "gpu_section" else "demo"]
    )


def task_paths(kind, protocols=None, modes=None):
    """Result files of one stage for the selected tasks."""
    if kind == "meta":
        return expand(f"{RES}/tasks/{{tid}}/meta.json", tid=TIDS)
    if kind in ("build", "check"):
        return expand(f"{RES}/{kind}/{{tid}}.json", tid=TIDS)
    paths = []
    for protocol in protocols or PROTOCOLS:
        in_protocol = STRICT_MODES if protocol == "strict" else MODES
        paths += expand(
            f"{RES}/time/{protocol}/{{mode}}/{{tid}}.json",
            mode=[m for m in modes or MODES if m in in_protocol],
            tid=TIDS,
        )
    return paths


def existing(paths):
    return [p for p in paths if Path(p).exists()]


def task_meta(result):
    """Input function: the task's meta.json (ancient) for the job making ``result`` (a path
    pattern with the rule's wildcards). None while the release is still to be fetched and split
    in this run and ``result`` already exists: the split would otherwise re-plan every committed
    result of a fresh clone (its meta.json is new). run_task finds the task folder by its place.
    """

    def meta(wildcards):
        if (
            LOCAL_RELEASE is None
            and Path(result.format(**dict(wildcards.items()))).exists()
        ):
            return []
        return ancient(f"{RES}/tasks/{wildcards.tid}/meta.json")

    return meta


def scan_meta():
    """The scan's meta.json inputs (ancient), or none while the release is still to be split
    and the scan exists (as task_meta)."""
    if LOCAL_RELEASE is None and Path(f"{RES}/reference_scan.json").exists():
        return []
    return ancient(task_paths("meta"))


def results_on_disk(kind):
    """check or time results of this device on disk, whatever the selection (sorted)."""
    pattern = re.compile(r"L\d+_T\d{3}\.json")
    if kind == "check":
        found = Path(RES).glob("check/*.json")
    else:
        found = (
            p
            for p in Path(RES).glob("time/*/*/*.json")
            if p.parent.parent.name in ("paper", "strict")
            and p.parent.name in rel.MODES
        )
    return sorted(
        str(p) for p in found if pattern.fullmatch(p.name) and p.stem in ALL_TIDS_SET
    )


def with_results_on_disk(kind, selected):
    """The selection's results, then those on disk outside it: the tables cover every result
    of the device, so a narrower run never drops results from them."""
    chosen = set(selected)
    return selected + [p for p in results_on_disk(kind) if p not in chosen]


def aggregate_inputs():
    """Inputs of the aggregate: every result of the selection (only those on disk with
    aggregate_only) and every other result of the device on disk."""
    pick = existing if config["aggregate_only"] else list
    check = with_results_on_disk("check", pick(task_paths("check")))
    time_ = with_results_on_disk("time", pick(task_paths("time")))
    tids = set(TIDS) | {Path(p).stem for p in check + time_}
    return {
        # task metadata (published scores) is always needed: split_release is cheap and CPU-only
        "meta": [f"{RES}/tasks/{tid}/meta.json" for tid in ALL_TIDS if tid in tids],
        "check": check,
        "time": time_,
        # CPU scan for degenerate references (constant or zero output)
        "scan": pick([f"{RES}/reference_scan.json"]),
        # committed annotation of results made before the worker recorded failed
        # extension builds itself (read when present)
        "extension_failures": existing([curation("extension_failures.json")]),
        # committed list of flags a later detector fix showed to be false (read when present)
        "withdrawn_flags": existing([curation("withdrawn_flags.json")]),
    }


def all_targets():
    """Every result of the selection plus the report: a missing result is always planned,
    even when a (committed) report already exists."""
    results = (
        [] if config["aggregate_only"] else task_paths("check") + task_paths("time")
    )
    return results + report_outputs()


def slice_reports():
    """{name: task-list file} of config ``slice_reports`` (name = the file's stem)."""
    out = {}
    for path in config["slice_reports"]:
        if not Path(path).is_file():
            raise WorkflowError(f"config slice_reports: {path}: no such file")
        out[Path(path).stem] = path
    return out


def curation(name):
    """A hand-made input of a device's tables: config/curation/<device>/<name> (each file says
    why it exists in its "about")."""
    return f"config/curation/{DEVICE}/{name}"


def report_outputs():
    names = [
        "scores.csv",
        "summary.md",
        "per_task.md",
        "README.md",
        "extension_failures.md",
    ]
    figs = ["figures/measured_vs_published.png", "figures/ratio_hist.png"]
    slices = [f"slices/{name}.md" for name in slice_reports()]
    return [f"{RES}/{n}" for n in names + figs + slices]


def table_params():
    """The parameters that shape the tables (besides their inputs), recorded with them."""
    return {"device": DEVICE, "ceiling": config["detectors"]["speedup_ceiling"]}


TABLES_RECORD = f"{RES}/{freshness.RECORD}"


def keep_current_tables_current():
    """Tables whose inputs are what they were made from are not re-rendered because of file
    dates (a fresh clone): l1bench.freshness."""
    inputs = [p for paths in aggregate_inputs().values() for p in paths]
    tables = [p for p in report_outputs() if "/slices/" not in p] + [TABLES_RECORD]
    followers = {
        f"{RES}/slices/{name}.md": [path] for name, path in slice_reports().items()
    }
    freshness.mark_current(
        TABLES_RECORD, RES, inputs, table_params(), tables, followers
    )


def evaluation_params(kind):
    """Protocol parameters of a stage: hashed by Snakemake, so changing one reruns the stage."""
    p = {"release": FINGERPRINT, "paper": config["paper"]}
    if kind == "build":
        return {"release": FINGERPRINT, "build": config["build"]}
    if kind == "check" and config["protocol"] != "paper":
        p["detectors"] = config["detectors"] | {
            "seed": config["paper"]["seed"],
            "atol": config["paper"]["atol"],
            "rtol": config["paper"]["rtol"],
        }
    return p


def time_priority(wildcards):
    """Time jobs before checks (priority 9): a task's modes are timed as soon as its check
    passes, so an interrupted run leaves whole tasks. Paper results before strict ones; the
    torch.compile modes first among them, so their long CPU-bound code generation starts
    early and overlaps with the GPU work of the others instead of forming the tail."""
    if wildcards.protocol == "strict":
        return 5
    return 12 if wildcards.mode.startswith("torch_compile") else 10


def compile_slots(wildcards):
    """1 for a torch.compile-mode time job, else 0: the profile's ``compile`` resource caps
    how many run their CPU-bound code generation at once, so the remaining job slots keep
    eager-mode jobs (which mostly wait for the GPU lock) feeding the GPU."""
    return 1 if wildcards.mode.startswith("torch_compile") else 0


def strict_params(wildcards):
    """The strict protocol's parameters (without the mode selection, which is not one)."""
    if wildcards.protocol != "strict":
        return None
    return {k: v for k, v in config["strict"].items() if k != "modes"}


def gpu_available():
    """True when the local torch sees a CUDA device (checked in a child: no CUDA in this process)."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def planned_jobs():
    """[(name of the job's rule, its outputs)] of every job this run will execute (the DAG is
    built when onstart runs)."""
    return [
        (job.rule.name, [str(f) for f in job.output])
        for job in workflow.dag.needrun_jobs()
    ]


EVALUATION_RULES = ("build_task", "check_task", "time_task", "scan_references")


def require_split_first(planned):
    """A finished result to be redone (forced, changed parameters) while the release is still
    to be fetched and split in this run took no meta.json input (task_meta): stop, one line.
    """
    if LOCAL_RELEASE is not None:
        return
    redo = sorted(
        out
        for rule, outs in planned
        if rule in EVALUATION_RULES
        for out in outs
        if Path(out).exists()
    )
    if redo:
        print(
            f"{redo[0]}{f' and {len(redo) - 1} more' if len(redo) > 1 else ''} "
            "would be redone before the release is split; "
            f"fetch and split it first (snakemake --cores 1 --config device={DEVICE} --until split_release), "
            "then run again",
            file=sys.stderr,
        )
        sys.exit(1)


def require_gpu_if_needed(planned):
    """Stop before any job (downloads included) when a check/time job this run would execute
    needs a GPU and none is visible: one line. Results decided without a GPU (no code, a
    negative earlier stage, max_attempts reached: l1bench.results.no_worker_needed, as
    scripts/run_task.py and the worker decide) still run on a CPU-only machine. A cluster
    executor's jobs find their GPUs on the nodes it sends them to: no guard here."""
    if not preflight.gpus_are_local(
        workflow.local_exec, IS_DEMO, config["aggregate_only"]
    ):
        return
    pending = {out for _, outs in planned for out in outs}
    outputs = [
        out
        for rule, outs in planned
        if rule in ("check_task", "time_task")
        for out in outs
    ]
    needed = preflight.gpu_jobs(
        outputs, RES, NO_CODE_TIDS, config["max_attempts"], pending
    )
    if needed and not gpu_available():
        print(preflight.no_gpu_message(DEVICE, needed), file=sys.stderr)
        sys.exit(1)


def start_run():
    """onstart (not in a dry run, which plans everything): the guards, then the bookkeeping
    that lets the next run recover if this one is killed."""
    planned = planned_jobs()
    require_split_first(planned)
    require_gpu_if_needed(planned)
    reserve_timing_cpus()
    lockfiles = getattr(workflow.persistence, "_lockfile", {}) or {}
    recovery.record_lock_owner(lockfiles.values())
    preflight.note_stop_signals()


def print_failure_hint(logs):
    """onerror: what failed and why (or which signal stopped the run), and how to go on."""
    texts = []
    for path in logs or []:
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            pass
    stopped = preflight.STOPPED_BY[0] if preflight.STOPPED_BY else None
    hint = preflight.failure_hint(
        DEVICE, preflight.failed_jobs(texts), stopped, config["max_attempts"], logs=LOGS
    )
    print(f"\n{hint}", file=sys.stderr)


keep_current_tables_current()


# --- lab reports (rules/reports.smk): results trees compared with each other

ARCHIVES = archive.read_config()
REPORTS = yaml.safe_load(Path("config/reports.yaml").read_text())


def tree_inputs(tree, results="paper/default"):
    """What a report reads of one results tree: the unpacked folder of the archive that holds
    it, or its time results (``results``: protocol/mode globs; ancient: a report never plans a
    time job)."""
    name = archive.holder(tree, ARCHIVES)
    if name is not None:
        return ARCHIVES[name]["unpacks"]
    return ancient(sorted(glob.glob(f"{tree}/time/{results}/*.json")))
