# Reproduce CUDA-L1's published GPU-kernel speedups: fetch -> split -> build (CPU)
# -> check (GPU) -> time per mode (GPU) -> aggregate (CPU). See README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/release.smk"


# aggregate_only: result files are plain inputs, never outputs of a rule, so no change of
# parameters, code or metadata can plan an evaluation job.
if not config["aggregate_only"]:

    include: "rules/evaluate.smk"


include: "rules/aggregate.smk"


# The run hooks (l1bench.hooks): a killed run's results and locks recovered now, before
# Snakemake plans; the guards and bookkeeping at the start; the run's last line at its end.
RUN_HOOKS = hooks.install(workflow, PLAN, RERUNS)


onstart:
    RUN_HOOKS.start()


onsuccess:
    RUN_HOOKS.succeeded()


onerror:
    RUN_HOOKS.failed(log)


rule all:
    default_target: True
    input:
        PLAN.all_targets(),
        RERUNS.markers,
