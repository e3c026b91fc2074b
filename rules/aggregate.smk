# Stage 5: tables, figures and the report, on the CPU, from whatever results exist.


# The one-line reason a result (or the tables, or the task folders) is stale, as the input that
# reruns its job in this run; the run's markers are removed when it ends. Here, not in
# evaluate.smk: the tables' marker is needed with aggregate_only too.
rule mark_stale:
    output:
        f"{RESULTS}/stale/{{what}}.{{key}}.txt",
    log:
        f"{LOGS}/mark_stale/{{what}}.{{key}}.log",
    wildcard_constraints:
        what=r"(build|check|time/\w+/\w+)/L\d+_T\d{3}|tables|tasks",
        key=r"[0-9a-f]{12}",
    localrule: True
    params:
        reason=lambda w: RERUNS.reason(w.what) or "forced",
    message:
        "{wildcards.what} is stale: {params.reason}"
    run:
        Path(output[0]).write_text(f"{params.reason}\n")


rule scan_references:
    input:
        meta=scan_inputs,
    output:
        f"{RESULTS}/reference_scan.json",
    log:
        f"{LOGS}/scan_references.log",
    conda:
        "../envs/environment.yaml"
    threads: workflow.cores
    params:
        trials=2,
        timeout=PLAN.timeout("check"),
    script:
        "../scripts/scan_references.py"


rule aggregate_results:
    input:
        unpack(aggregate_inputs),
    output:
        csv=report(f"{RESULTS}/scores.csv", category="Tables"),
        summary=report(f"{RESULTS}/summary.md", category="Tables"),
        per_task=report(f"{RESULTS}/per_task.md", category="Tables"),
        scatter=report(
            f"{RESULTS}/figures/measured_vs_published.png", category="Figures"
        ),
        ratios=report(f"{RESULTS}/figures/ratio_hist.png", category="Figures"),
        report=f"{RESULTS}/README.md",
        extensions=f"{RESULTS}/extension_failures.md",
        record=PLAN.tables_record,
    log:
        f"{LOGS}/aggregate_results.log",
    conda:
        "../envs/environment.yaml"
    params:
        tables=PLAN.aggregate_params(),
    script:
        "../scripts/aggregate_results.py"


# Every release tree's code measured on one GPU (l1bench.aggregate.transfer); in `all` once
# two or more release trees exist, else on request: snakemake --cores 1 transfer_report.
rule transfer_report:
    input:
        unpack(transfer_inputs),
    output:
        page=PLAN.transfer_outputs[0],
        figure=PLAN.transfer_outputs[1],
    log:
        f"{LOGS}/transfer_report.log",
    conda:
        "../envs/environment.yaml"
    params:
        tolerances=PLAN.aggregate_params()["tolerances"],
    shell:
        "python -m l1bench.aggregate.transfer --out {output.page} --figure {output.figure}"
        " {input.scores} --tolerances {params.tolerances} 2> {log}"


# A task selection (config slice_reports: YAML files with a tasks: list) measured next to
# published in every mode, strict next to paper, with the flags (l1bench.aggregate.slices).
rule slice_report:
    input:
        unpack(slice_inputs),
    output:
        f"{RESULTS}/slices/{{name}}.md",
    log:
        f"{LOGS}/slice_report/{{name}}.log",
    conda:
        "../envs/environment.yaml"
    params:
        tolerance=AGREEMENT,
    shell:
        "python -m l1bench.aggregate.slices {input.scores} {input.tasks}"
        " --tol {params.tolerance} --title {wildcards.name} --out {output} 2> {log}"
