# Helpers only: config validation, the task table, paths and input functions.
import json
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from l1bench import release as rel  # noqa: E402
from l1bench import attempts, fetch  # noqa: E402
from l1bench.worker import UPSTREAM  # noqa: E402


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


_normalise_cli_booleans(config)
validate(config, schema="../config/schemas/config.schema.yaml")

DEVICE = config["device"]
RES = f"{config['results_dir']}/{DEVICE}"
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
    """Keep this Snakemake process, and so every job it starts, off the GPUs' timing CPUs
    (gpulock.keep_workflow_off_timing_cpus): only a lock holder's timing thread runs there.
    Not for the CPU demo or a table rebuild, which time nothing on a GPU."""
    if IS_DEMO or config["aggregate_only"]:
        return []
    from l1bench import gpulock

    timing = gpulock.keep_workflow_off_timing_cpus(gpulock.visible_gpu_count())
    if timing:
        print(
            f"timing CPUs {timing} reserved for the GPU lock holders; the workflow runs on the others",
            file=sys.stderr,
        )
    return timing


TIMING_CPUS = reserve_timing_cpus()
LOCAL_RELEASE = load_local_release()
if LOCAL_RELEASE is not None:
    materialise_task_folders(LOCAL_RELEASE)
ALL_IDS = task_index()
ALL_TIDS = [rel.task_id(lv, tk) for lv, tk in ALL_IDS]
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
    t = config["timeouts"][kind]
    return min(t, config["timeouts"]["demo"]) if IS_DEMO else t


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


def aggregate_inputs():
    """Inputs of the aggregate: every result of the selection, or only those on disk."""
    pick = existing if config["aggregate_only"] else list
    return {
        # task metadata (published scores) is always needed: split_release is cheap and CPU-only
        "meta": task_paths("meta"),
        "check": pick(task_paths("check")),
        "time": pick(task_paths("time")),
        # CPU scan for degenerate references (constant or zero output)
        "scan": pick([f"{RES}/reference_scan.json"]),
        # committed annotation of results made before the worker recorded failed
        # extension builds itself (read when present)
        "extension_failures": existing([f"{RES}/extension_failures.json"]),
        # committed list of flags a later detector fix showed to be false (read when present)
        "withdrawn_flags": existing([f"{RES}/withdrawn_flags.json"]),
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


def report_outputs():
    names = ["scores.csv", "summary.md", "per_task.md", "README.md"]
    figs = ["figures/measured_vs_published.png", "figures/ratio_hist.png"]
    slices = [f"slices/{name}.md" for name in slice_reports()]
    return [f"{RES}/{n}" for n in names + figs + slices]


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


def _status(path):
    try:
        return json.loads(Path(path).read_text()).get("status")
    except (OSError, ValueError):
        return None


def decided_without_gpu(path):
    """Whether a missing check/time result is decided without a GPU (scripts/run_task.py):
    the task has no custom code, or its build (for a check) or check (for a time job) is
    already negative, so the result only carries that status forward, or the job already
    broke ``max_attempts`` times (l1bench.attempts)."""
    tid = Path(path).stem
    if tid in NO_CODE_TIDS:
        return True
    if attempts.given_up(
        attempts.load(attempts.ledger_path(RES, path)), config["max_attempts"]
    ):
        return True  # broke max_attempts times: gets a terminal result, no worker
    kind = Path(path).relative_to(RES).parts[0]
    upstream, ok = UPSTREAM[kind]
    status = _status(f"{RES}/{upstream}/{tid}.json")
    return status is not None and status != ok


def require_gpu_if_needed():
    """Stop before any GPU job when device needs a GPU that this machine lacks."""
    if IS_DEMO or config["aggregate_only"]:
        return
    missing = [
        p
        for p in task_paths("check") + task_paths("time")
        if not Path(p).exists() and not decided_without_gpu(p)
    ]
    if missing and not gpu_available():
        raise WorkflowError(
            f"device={DEVICE} needs a CUDA GPU for {len(missing)} missing check/time results, "
            "and none is visible; run the CPU demo instead (snakemake --cores 2 --config device=demo) "
            "or aggregate existing results (--config aggregate_only=true)"
        )


def print_failure_hint():
    """After failed jobs: results of the others are kept; say how to retry and how to tabulate."""
    print(
        "\nSome jobs failed (timeout, crash, CUDA fault); every other result is kept.\n"
        f"  retry only what failed or is missing:  snakemake --config device={DEVICE}\n"
        f"  tables from the results so far:       snakemake --config device={DEVICE} aggregate_only=true\n"
        f"  logs of failed jobs:                  logs/{DEVICE}/",
        file=sys.stderr,
    )
