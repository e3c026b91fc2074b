# Helpers only: config validation, the task table, paths and input functions. The logic
# lives in l1bench.plan (tested in tests/test_plan.py): the helpers here pass it the
# workflow's globals, and keep what needs Snakemake (workflow, ancient, WorkflowError).
import atexit
import os
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

#: The one line a run without the l1bench package (src/l1bench, pyproject.toml) stops with.
NOT_INSTALLED = (
    "the l1bench package is not installed: run `pip install -e .` in this repository "
    "(offline: see docs/running.md)"
)

try:
    from l1bench import release as rel
    from l1bench import (
        attempts,
        fetch,
        freshness,
        lifeline,
        outcome,
        plan,
        preflight,
        recovery,
        staleness,
    )
    from l1bench.io import logs_dir
    from l1bench.results import AGREEMENT
except ModuleNotFoundError as err:
    if err.name != "l1bench":
        raise
    sys.exit(NOT_INSTALLED)


def stop(line):
    """End the run while Snakemake parses: ``line`` alone on stderr, exit status 1 (a
    WorkflowError raised here would add its file and traceback lines)."""
    print(line, file=sys.stderr)
    sys.exit(1)


def validate_config():
    """Command-line values typed by the schema (l1bench.cliconfig), then schema validation
    (fills defaults): a bad value stops with one line naming the key (preflight.config_error).
    """
    schema = Path(workflow.basedir) / "config/schemas/config.schema.yaml"
    plan.normalise_cli_values(config, schema)
    try:
        validate(config, schema=str(schema))
    except WorkflowError as err:
        stop(preflight.config_error(config, schema) or str(err).strip().splitlines()[0])


validate_config()

DEVICE = config["device"]
RES = f"{config['results_dir']}/{DEVICE}"
# job logs: logs/<device> for results/<device>, a folder of their own for other trees
LOGS = logs_dir(RES)
IS_DEMO = DEVICE == "demo"
# cores a check or time job takes (plan.evaluation_threads: none on a GPU, where `gpu` sets
# how many are in flight and --cores sizes the builds)
EVALUATION_THREADS = plan.evaluation_threads(IS_DEMO)
PROTOCOLS = plan.protocols(config["protocol"])
MODES = plan.modes(config["modes"])
STRICT_MODES = plan.strict_modes(MODES, config["strict"]["modes"])
RELEASE_PATH = plan.release_path(DEVICE)
BASELINE_PATHS = plan.BASELINE_PATHS


def check_release_dir():
    """A release_dir that is not a release (for the demo: a folder like config/demo) stops the
    run (one line), whatever is on disk."""
    if not config["release_dir"]:
        return
    problem = preflight.release_dir_problem(config["release_dir"], RELEASE_PATH)
    if problem:
        stop(problem)


check_release_dir()


def release_root():
    """plan.release_root of this run."""
    return plan.release_root(
        IS_DEMO, config["release_dir"], config["upstream"]["commit"]
    )


def release_inputs():
    """plan.release_inputs of this run."""
    return plan.release_inputs(release_root(), DEVICE, IS_DEMO)


def expected_sha256(path):
    """plan.expected_sha256 with the config's overrides."""
    return plan.expected_sha256(path, IS_DEMO, config["release_sha256"])


def release_fingerprint():
    """What identifies the release content: it is a param of every evaluation job."""
    if IS_DEMO:
        return fetch.sha256_file(release_inputs()["release"])
    return expected_sha256(RELEASE_PATH)


def load_local_release():
    """plan.load_release_files: the parsed release if it is on disk, else None; bad input
    stops the run before any job with one line."""
    checksums = {
        "release": expected_sha256(RELEASE_PATH),
        **{k: expected_sha256(v) for k, v in BASELINE_PATHS.items()},
    }
    try:
        tasks = plan.load_release_files(release_inputs(), checksums)
        if tasks is not None and not IS_DEMO:
            subset = config["levels"] != [1, 2, 3] or bool(config["tasks"])
            staleness.check_release_complete(tasks, release_inputs()["release"], subset)
        return tasks
    except (rel.ReleaseError, fetch.FetchError, plan.PlanError) as err:
        stop(str(err))


def selected_tids():
    """plan.selected_tids of the config's selection; a bad or empty one stops the run."""
    try:
        return plan.selected_tids(ALL_IDS, config["levels"], config["tasks"])
    except (rel.ReleaseError, plan.PlanError) as err:
        stop(str(err))


def reserve_timing_cpus():
    """onstart: keep this Snakemake process, and so every job it starts, off the GPUs' timing
    CPUs (gpulock.keep_workflow_off_timing_cpus): only a lock holder's timing thread runs there.
    Only where the jobs run on this host (not for a cluster executor, whose jobs time on other
    nodes), and not for the CPU demo or a table rebuild, which time nothing on a GPU."""
    if not preflight.gpus_are_local(
        workflow.local_exec, IS_DEMO, config["aggregate_only"]
    ):
        return []
    from l1bench.timing import gpulock

    timing = gpulock.keep_workflow_off_timing_cpus(gpulock.visible_gpu_count())
    if timing:
        print(
            f"timing CPUs {timing} reserved for the GPU lock holders; the workflow runs on the others",
            file=sys.stderr,
        )
    return timing


def recover_from_a_killed_run():
    """Before a run (not a dry run) plans its jobs: keep the results that jobs of a killed run
    completed, and release that run's locks (l1bench.recovery), so the next run neither redoes
    them nor needs --unlock. It writes only inside .snakemake/, and only after a killed run:
    Snakemake reads both before onstart."""
    if not workflow.is_main_process or workflow.output_settings.dryrun:
        return
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
ALL_IDS = plan.task_index(LOCAL_RELEASE)
ALL_TIDS = [rel.task_id(lv, tk) for lv, tk in ALL_IDS]
TIDS = selected_tids()
FINGERPRINT = release_fingerprint()
NO_CODE_TIDS = plan.no_code_tids(LOCAL_RELEASE)
EXTENSION_BUILD_TIDS = plan.extension_build_tids(LOCAL_RELEASE)


wildcard_constraints:
    tid=r"L\d+_T\d{3}",
    mode="|".join(rel.MODES),
    protocol="paper|strict",


def timeout(kind):
    """plan.timeout of this run."""
    return plan.timeout(config["timeouts"], kind, IS_DEMO)


def task_paths(kind, protocols=None, modes=None):
    """plan.task_paths of the selected tasks (protocols, modes: a narrower choice)."""
    return plan.task_paths(
        RES, kind, TIDS, protocols or PROTOCOLS, MODES, STRICT_MODES, modes
    )


def forced_rules():
    """Rules the user forces (-R RULE; -F: all): their jobs run, their downstream results are
    stale (l1bench.staleness)."""
    settings = workflow.dag_settings
    if settings is None:  # --lint, --list-rules: no run
        return set()
    others = sorted(
        t.name.lower() for t in settings.rerun_triggers if t.name != "MTIME"
    )
    if others:
        print(
            f"note: --rerun-triggers {' '.join(others)} can redo results that l1bench finds "
            "current (the profile uses mtime only: docs/rerun-policy.md)",
            file=sys.stderr,
        )
    forced = {str(x) for x in settings.forcerun}
    if settings.forceall:
        forced |= {"build_task", "check_task", "time_task", "scan_references"}
    return forced


def expected_of(kind, protocol, mode):
    """What a result of this kind is to record: its params and settings (l1bench.staleness)."""
    if kind == "build":
        return {"params": staleness.build_params(config["build"])}
    return {
        "params": dict(config["paper"]),
        "settings": plan.job_settings(kind, protocol, config),
    }


JUDGE = staleness.Judge(
    RES,
    (
        None
        if LOCAL_RELEASE is None
        else {t.tid: staleness.snippet_hashes(t) for t in LOCAL_RELEASE}
    ),
    FINGERPRINT,
    expected_of,
    forced_rules,
)


def stale_marker(what):
    """The mark_stale marker of ``what`` (a result path without .json below RES, tables, tasks):
    named after the reason and the content it was decided on (the result, the tables' record),
    so that a marker left behind never stands for a later decision."""
    why = stale_reason(what) or ""
    source = {"tables": TABLES_RECORD, "tasks": None}.get(what, f"{RES}/{what}.json")
    key = staleness.sha256_bytes(
        why.encode() + b"\0" + (JUDGE.sha(source) or "").encode()
        if source
        else why.encode()
    )
    return f"{RES}/stale/{what}.{key[:12]}.txt"


def clear_stale_markers():
    """onsuccess, onerror: the markers of this run are spent (the next run decides anew)."""
    import shutil

    shutil.rmtree(f"{RES}/stale", ignore_errors=True)


def stale_reason(what):
    """Why ``what`` (as in stale_marker) is stale, one line (None: current)."""
    if what == "tables":
        return tables_stale()
    if what == "tasks":
        return split_reason()
    return JUDGE.reason(f"{RES}/{what}.json")


def result_path(kind, wildcards):
    """The result a build, check or time job makes."""
    w = dict(wildcards.items())
    if kind == "time":
        return f"{RES}/time/{w['protocol']}/{w['mode']}/{w['tid']}.json"
    return f"{RES}/{kind}/{w['tid']}.json"


def evaluation_inputs(kind):
    """Input function of a build, check or time job: the earlier stage's result (ancient: it
    orders, never triggers); the task folder only when the job runs (a missing, stale or forced
    result), so a fresh clone's missing folders re-plan nothing; the stale marker when the
    result is stale (l1bench.staleness), which reruns it in this run."""

    def inputs(wildcards):
        out = result_path(kind, wildcards)
        tid = wildcards.tid
        ins = {}
        if kind in staleness.UPSTREAM:
            ins[staleness.UPSTREAM[kind]] = ancient(
                f"{RES}/{staleness.UPSTREAM[kind]}/{tid}.json"
            )
        why = JUDGE.reason(out)
        if why or not Path(out).exists() or f"{kind}_task" in JUDGE.forced:
            ins["meta"] = ancient(f"{RES}/tasks/{tid}/meta.json")
        if why:
            ins["stale"] = stale_marker(out[len(RES) + 1 : -len(".json")])
        return ins

    return inputs


def expected_snippets(wildcards):
    """{snippet: sha256} the job must run (None: the task folder's meta.json says)."""
    return JUDGE.tasks.get(wildcards.tid) if JUDGE.tasks is not None else None


def split_reason():
    """staleness.Judge.split_reason of the release on disk (None without one)."""
    if LOCAL_RELEASE is None:
        return None
    return JUDGE.split_reason(f"{RES}/tasks", LOCAL_RELEASE)


def split_inputs(wildcards):
    """The release files (ancient), and the stale marker when task folders differ from it."""
    ins = {k: ancient(v) for k, v in release_inputs().items()}
    if split_reason():
        ins["stale"] = stale_marker("tasks")
    return ins


def scan_meta(wildcards):
    """The scan's meta.json inputs (ancient) when it runs (missing or forced), else none."""
    if (
        Path(f"{RES}/reference_scan.json").exists()
        and "scan_references" not in JUDGE.forced
    ):
        return []
    return ancient(task_paths("meta"))


def aggregate_lists():
    """plan.aggregate_inputs of this run: the selection's results and the device's others."""
    return plan.aggregate_inputs(
        RES,
        DEVICE,
        TIDS,
        ALL_TIDS,
        task_paths("check"),
        task_paths("time"),
        config["aggregate_only"],
    )


def all_targets():
    """plan.all_targets: every result of the selection plus the report."""
    return plan.all_targets(
        task_paths("check"),
        task_paths("time"),
        report_outputs() + transfer_targets(),
        config["aggregate_only"],
    )


def stale_markers(wildcards):
    """The mark_stale markers of this run, inputs of the default target: Snakemake looks for a
    missing input's job only below a job that runs, so the markers are asked for from the top
    (rule all), and each reruns the job that takes it as input (evaluation_inputs)."""
    if config["aggregate_only"]:
        results = []
    else:
        results = task_paths("build") + task_paths("check") + task_paths("time")
    markers = [
        stale_marker(p[len(RES) + 1 : -len(".json")])
        for p in results
        if JUDGE.reason(p)
    ]
    markers += [stale_marker("tables")] if tables_stale() else []
    if (
        split_reason()
    ):  # the folders too, so that the split is in the DAG to take its marker
        markers += [
            stale_marker("tasks"),
            *expand(f"{RES}/tasks/{{tid}}/meta.json", tid=ALL_TIDS),
        ]
    return markers


def slice_reports():
    """plan.slice_reports of config ``slice_reports``; a missing file stops the run."""
    try:
        return plan.slice_reports(config["slice_reports"])
    except plan.PlanError as err:
        stop(str(err))


def report_outputs():
    """plan.report_outputs of this run."""
    return plan.report_outputs(RES, slice_reports())


def table_params():
    """plan.table_params of this run."""
    return plan.table_params(DEVICE, config)


TABLES_RECORD = f"{RES}/{freshness.RECORD}"
TABLE_OUTPUTS = plan.report_outputs(RES, [])
_TABLES = {}  # tables_reason's answer, meta_text's release by task id


# The cross-release page (rule transfer_report, l1bench.aggregate.transfer).
TRANSFER = [
    f"{config['results_dir']}/transfer.md",
    f"{config['results_dir']}/figures/transfer.png",
]


def transfer_inputs():
    """The scores.csv of each GPU release's tree: those on disk, and this run's."""
    trees = [f"{config['results_dir']}/{r}/scores.csv" for r in rel.GPU_DEVICES]
    return [p for p in trees if p == f"{RES}/scores.csv" or os.path.exists(p)]


def transfer_report_inputs(wildcards):
    """Input function of transfer_report: the trees' scores (ancient: file dates alone never
    re-render it), and the tables' stale marker when this device's tables are made again.
    """
    ins = {"scores": ancient(transfer_inputs())}
    if tables_stale():
        ins["stale"] = stale_marker("tables")
    return ins


def transfer_targets():
    """The page, in `all` once two or more release trees exist."""
    return TRANSFER if len(transfer_inputs()) >= 2 else []


def meta_text(path):
    """A task's meta.json as the split writes it (from the release in memory), else as on disk."""
    if LOCAL_RELEASE is None:
        return Path(path).read_bytes() if Path(path).exists() else None
    from l1bench import split

    if "tasks" not in _TABLES:
        _TABLES["tasks"] = {t.tid: t for t in LOCAL_RELEASE}
        _TABLES["info"] = {
            "path": RELEASE_PATH,
            "sha256": fetch.sha256_file(release_inputs()["release"]),
        }
    task = _TABLES["tasks"][Path(path).parent.name]
    return split.meta_text(task, DEVICE, _TABLES["info"]).encode()


def tables_digest():
    """The digest the tables' record would hold if made now (None: not known before the run)."""
    contents = []
    for name, paths in aggregate_lists().items():
        for path in paths:
            data = meta_text(path) if name == "meta" else Path(path).read_bytes()
            if data is None:
                return None
            contents.append((path, data))
    return freshness.digest_contents(RES, contents, table_params())


def tables_reason():
    """staleness.Judge.tables_reason of this run (cached)."""
    if "why" not in _TABLES:
        lists = aggregate_lists()
        _TABLES["why"] = JUDGE.tables_reason(
            TABLE_OUTPUTS + [TABLES_RECORD],
            # a table rebuild (aggregate_only) remakes no result: only their digest counts
            [] if config["aggregate_only"] else lists["check"] + lists["time"],
            TABLES_RECORD,
            tables_digest,
        )
    return _TABLES["why"]


def tables_stale():
    """Why the tables, and the pages made from them, are made again in this run (a reason or
    the user forcing aggregate_results), None when they are not for a reason."""
    if "aggregate_results" in JUDGE.forced:
        return tables_reason() or "aggregate_results is forced"
    return tables_reason()


def tables_run():
    """Whether the tables are made in this run: stale, forced, or a table missing."""
    return (
        tables_reason() is not None
        or "aggregate_results" in JUDGE.forced
        or any(not Path(p).exists() for p in TABLE_OUTPUTS + [TABLES_RECORD])
    )


def aggregate_inputs(wildcards):
    """Input function of aggregate_results: every input (ancient) and the stale marker when
    the tables are made in this run; none when they are current, so neither a fresh clone's
    file dates nor its missing task folders re-render them."""
    if not tables_run():
        return {}
    ins = {k: ancient(v) for k, v in aggregate_lists().items()}
    if tables_stale():
        ins["stale"] = stale_marker("tables")
    return ins


def slice_inputs(wildcards):
    """Input function of slice_report: the scores and the task list (ancient), and the tables'
    stale marker when the tables are made in this run."""
    ins = {
        "scores": ancient(f"{RES}/scores.csv"),
        "tasks": ancient(slice_reports()[wildcards.name]),
    }
    if tables_stale():
        ins["stale"] = stale_marker("tables")
    return ins


def evaluation_params(kind):
    """plan.evaluation_params of this run."""
    return plan.evaluation_params(kind, FINGERPRINT, config)


def time_params(wildcards):
    """plan.evaluation_params of a time job."""
    return plan.evaluation_params("time", FINGERPRINT, config)


def time_priority(wildcards):
    """plan.time_priority of a time job."""
    return plan.time_priority(wildcards.protocol, wildcards.mode, wildcards.tid)


def build_slots(wildcards):
    """plan.build_slots of a build job."""
    return plan.build_slots(wildcards.tid, EXTENSION_BUILD_TIDS)


def build_threads(wildcards):
    """plan.build_threads of a build job."""
    return plan.build_threads(wildcards.tid, EXTENSION_BUILD_TIDS, IS_DEMO)


def build_priority(wildcards):
    """plan.build_priority of a build job."""
    return plan.build_priority(wildcards.tid)


def check_priority(wildcards):
    """plan.check_priority of a check job (its level-3 boost only with a compile mode)."""
    return plan.check_priority(wildcards.tid, MODES)


#: The run's GPU job slots (Snakemake's `gpu` resource; None without a bound), which every job
#: can read (attempts.GPU_SLOTS_ENV, exported at onstart): one that took fewer shared the GPU.
GPU_SLOTS = plan.resource_value(workflow.global_resources.get("gpu"))


def export_to_jobs():
    """onstart: what every job of this run reads from its environment: the Snakemake process's
    token (jobs stop when it is gone, l1bench.lifeline) and the run's GPU job slots."""
    lifeline.mark_workflow()
    if GPU_SLOTS is not None:
        os.environ[attempts.GPU_SLOTS_ENV] = str(GPU_SLOTS)


def gpu_slots(wildcards):
    """plan.gpu_slots of a check or time job: every slot once an attempt ran out of GPU memory
    beside other jobs (its attempts ledger)."""
    w = dict(wildcards.items())
    out = (
        f"{RES}/time/{w['protocol']}/{w['mode']}/{w['tid']}.json"
        if "mode" in w
        else f"{RES}/check/{w['tid']}.json"
    )
    return plan.gpu_slots(attempts.load(attempts.ledger_path(RES, out)), GPU_SLOTS)


def compile_slots(wildcards):
    """plan.compile_slots of a time job."""
    return plan.compile_slots(wildcards.mode)


def strict_params(wildcards):
    """plan.strict_params of a time job."""
    return plan.strict_params(wildcards.protocol, config["strict"])


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
    outputs, pending = plan.gpu_job_outputs(planned)
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
    require_gpu_if_needed(planned)
    export_to_jobs()
    reserve_timing_cpus()
    lockfiles = getattr(workflow.persistence, "_lockfile", {}) or {}
    recovery.record_lock_owner(lockfiles.values())
    preflight.note_stop_signals()
    start_progress()


#: What onstart learns for the run's last line: the planned jobs, the progress printer.
THIS_RUN = {}


def start_progress():
    """onstart: progress lines with the time left (l1bench.progress) on Snakemake's logger."""
    from l1bench import progress

    jobs = list(workflow.dag.needrun_jobs())
    THIS_RUN["planned"] = [
        (job.rule.name, [str(f) for f in job.output]) for job in jobs
    ]
    THIS_RUN["progress"] = progress.start([(job.jobid, job.rule.name) for job in jobs])


def print_outcome():
    """onsuccess: the run's one line (l1bench.outcome): what was measured, where the tables
    are, what broke and how to retry it."""
    from l1bench import progress

    progress.stop(THIS_RUN.pop("progress", None))
    selection = sum((task_paths(kind) for kind in ("build", "check", "time")), [])
    made = outcome.made_results(THIS_RUN.get("planned", []))
    line = outcome.success_line(
        DEVICE, RES, LOGS, selection, made, config["results_dir"]
    )
    print(line, file=sys.stderr)


def print_failure_hint(logs):
    """onerror: what failed and why (or which signal stopped the run), and how to go on."""
    from l1bench import progress

    progress.stop(THIS_RUN.pop("progress", None))
    texts = []
    for path in logs or []:
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            pass
    stopped = preflight.STOPPED_BY[0] if preflight.STOPPED_BY else None
    hint = preflight.failure_hint(
        DEVICE,
        preflight.failed_jobs(texts),
        stopped,
        config["max_attempts"],
        logs=LOGS,
        disk=preflight.disk_full_note(RES),
    )
    print(f"\n{hint}", file=sys.stderr)


def nothing_to_do_line():
    """At exit, when the run found nothing to do: one line saying the tables are current, from
    which GPU and dates, and how to measure afresh."""
    dag = getattr(workflow, "_dag", None)
    if not workflow.is_main_process or dag is None or getattr(dag, "_len", None) != 0:
        return
    if not dag.targetjobs or config["aggregate_only"]:
        return
    if not all(Path(f).exists() for job in dag.targetjobs for f in job.input):
        return  # the DAG was not built (an error), not found complete
    lists = aggregate_lists()
    gpu, first, last = JUDGE.provenance(lists["check"] + lists["time"])
    when = f", {first}" + (f" to {last}" if last != first else "") if first else ""
    print(
        f"Nothing to do: the tables in {RES} are current with its results "
        f"(measured on {gpu or 'the CPU'}{when}); to measure afresh: "
        f"snakemake --cores 1 --config device={DEVICE} results_dir=results/mine",
        file=sys.stderr,
    )


atexit.register(nothing_to_do_line)
