# Stages 2-4: build (CPU, parallel), check (GPU) and time each mode (GPU), per task.
# What reruns is decided in one place (l1bench.staleness, docs/rerun-policy.md): a missing
# result, or a stale one, whose job then takes its mark_stale marker as input. Priorities,
# threads, resources and params: the run's plan (l1bench.runplan.RunPlan).
# A job that breaks is retried within the run until its attempts ledger gives it a terminal
# result (l1bench.attempts.in_run_retries): the tables follow in the same run.
RETRIES = attempts.in_run_retries(config["max_attempts"])


rule build_task:
    input:
        unpack(evaluation_inputs("build")),
    output:
        f"{RESULTS}/build/{{tid}}.json",
    log:
        f"{LOGS}/build_task/{{tid}}.log",
    priority: PLAN.build_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: PLAN.build_threads
    resources:
        builds=PLAN.build_slots,
    params:
        kind="build",
        backend=PLAN.backend,
        protocol_params=PLAN.evaluation_params("build"),
        snippets=RERUNS.expected_snippets,
        ext_dir=PLAN.ext_dir,
        timeout=PLAN.timeout("build"),
        max_attempts=config["max_attempts"],
    script:
        "../scripts/run_task.py"


rule check_task:
    input:
        unpack(evaluation_inputs("check")),
    output:
        f"{RESULTS}/check/{{tid}}.json",
    log:
        f"{LOGS}/check_task/{{tid}}.log",
    priority: PLAN.check_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: PLAN.evaluation_threads
    resources:
        gpu=PLAN.gpu_slots,
    params:
        kind="check",
        backend=PLAN.backend,
        protocol_params=PLAN.evaluation_params("check"),
        settings=PLAN.job_settings("check"),
        snippets=RERUNS.expected_snippets,
        ext_dir=PLAN.ext_dir,
        timeout=PLAN.timeout("check"),
        max_attempts=config["max_attempts"],
        section_timeout=PLAN.timeout("gpu_section"),
    script:
        "../scripts/run_task.py"


rule time_task:
    input:
        unpack(evaluation_inputs("time")),
    output:
        f"{RESULTS}/time/{{protocol}}/{{mode}}/{{tid}}.json",
    log:
        f"{LOGS}/time_task/{{protocol}}/{{mode}}/{{tid}}.log",
    priority: PLAN.time_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: PLAN.evaluation_threads
    resources:
        gpu=PLAN.gpu_slots,
        compile=PLAN.compile_slots,
    params:
        kind="time",
        backend=PLAN.backend,
        protocol_params=PLAN.evaluation_params("time"),
        strict=PLAN.strict_params,
        settings=lambda w: PLAN.job_settings("time", w.protocol),
        snippets=RERUNS.expected_snippets,
        ext_dir=PLAN.ext_dir,
        timeout=PLAN.timeout("time"),
        max_attempts=config["max_attempts"],
        section_timeout=PLAN.timeout("gpu_section"),
    script:
        "../scripts/run_task.py"
