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


onstart:
    start_run()


onsuccess:
    print_outcome()
    clear_stale_markers()


onerror:
    clear_stale_markers()
    print_failure_hint(log)


rule all:
    default_target: True
    input:
        all_targets(),
        stale_markers,
