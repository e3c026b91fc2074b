# Config, selection and input functions: the config validated, the run's plan (PLAN: the
# release on disk, the task selection, every path and parameter of the rules, l1bench.runplan),
# what reruns (RERUNS: l1bench.staleness.Reruns) and the input functions that ask it. The run
# hooks are l1bench.hooks, called from the Snakefile.
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
    from l1bench import attempts, cliconfig, fetch, hooks, plan, preflight, staleness
    from l1bench.modes import NAMES as MODES
    from l1bench.results import AGREEMENT, STAGE
    from l1bench.runplan import RunPlan
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
    cliconfig.normalise(config, schema)
    try:
        validate(config, schema=str(schema))
    except WorkflowError as err:
        stop(preflight.config_error(config, schema) or str(err).strip().splitlines()[0])


def load_plan():
    """The run's plan (l1bench.runplan.RunPlan): a release_dir that is not a release, a bad
    release file (checksum, parse, missing tasks), an empty or bad selection or a missing slice
    report stops the run before any job with one line."""
    try:
        return RunPlan(config, workflow.global_resources.get("gpu"))
    except (rel.ReleaseError, fetch.FetchError, plan.PlanError) as err:
        stop(str(err))


validate_config()
PLAN = load_plan()
RESULTS = PLAN.results  # results/<device>, or <results_dir>/<device>
LOGS = PLAN.logs  # the job logs of that tree
# What reruns, decided from what each result records (docs/rerun-policy.md); the rules the user
# forces are read once Snakemake knows them.
RERUNS = staleness.Reruns(PLAN, lambda: workflow.dag_settings)


wildcard_constraints:
    tid=r"L\d+_T\d{3}",
    mode="|".join(MODES),
    protocol="paper|strict",


# Input functions. Inputs that only order the jobs are ancient(): they never trigger one; a
# job reruns because its result is missing, or stale, when it takes its subject's stale
# marker (RERUNS.with_marker; the profile's rerun triggers are file dates only).


def evaluation_inputs(kind):
    """Input function of a build, check or time job: the earlier stage's result; the task
    folder only when the job runs (RERUNS.job_runs: missing, forced, or stale and selected),
    so a fresh clone's missing folders re-plan nothing; the stale marker when it is
    stale."""

    def inputs(wildcards):
        result = PLAN.result_path(kind, wildcards)
        ins = {}
        stage = STAGE[kind].upstream
        if stage:
            ins[stage] = ancient(f"{RESULTS}/{stage}/{wildcards.tid}.json")
        if not RERUNS.job_runs(result, f"{kind}_task"):
            return ins
        ins["meta"] = ancient(f"{RESULTS}/tasks/{wildcards.tid}/meta.json")
        return RERUNS.with_marker(ins, RERUNS.subject(result))

    return inputs


def split_inputs(wildcards):
    """The release files, and the stale marker when task folders differ from the release."""
    ins = {k: ancient(v) for k, v in PLAN.release_inputs().items()}
    return RERUNS.with_marker(ins, "tasks")


def scan_inputs(wildcards):
    """The reference scan's meta.json inputs when it runs (missing or forced), else none."""
    scan = f"{RESULTS}/reference_scan.json"
    if Path(scan).exists() and "scan_references" not in RERUNS.forced:
        return []
    return ancient(PLAN.task_paths("meta"))


def aggregate_inputs(wildcards):
    """Input function of aggregate_results: every input and the stale marker when the tables
    are made in this run; none when they are current, so neither a fresh clone's file dates
    nor its missing task folders re-render them."""
    if not RERUNS.tables_made():
        return {}
    ins = {k: ancient(v) for k, v in PLAN.aggregate_inputs().items()}
    return RERUNS.with_marker(ins, "tables")


def slice_inputs(wildcards):
    """Input function of slice_report: the scores and the task list, and the tables' stale
    marker when the tables are made again."""
    ins = {
        "scores": ancient(f"{RESULTS}/scores.csv"),
        "tasks": ancient(PLAN.slice_reports[wildcards.name]),
    }
    return RERUNS.with_marker(ins, "tables")


def transfer_inputs(wildcards):
    """Input function of transfer_report: the release trees' scores (file dates alone never
    re-render it), and the tables' stale marker when this device's tables are made again.
    """
    return RERUNS.with_marker({"scores": ancient(PLAN.transfer_inputs())}, "tables")
