# Stages 2-4: build (CPU, parallel), check (GPU) and time each mode (GPU), per task.
# What reruns is decided in one place (l1bench.staleness, docs/rerun-policy.md): a missing
# result, or a stale one, whose job then takes its mark_stale marker as input.
# A job that breaks is retried within the run until its attempts ledger gives it a terminal
# result (l1bench.attempts.in_run_retries): the tables follow in the same run.
RETRIES = attempts.in_run_retries(config["max_attempts"])


rule build_task:
    input:
        unpack(evaluation_inputs("build")),
    output:
        f"{RES}/build/{{tid}}.json",
    log:
        f"{LOGS}/build_task/{{tid}}.log",
    priority: build_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: build_threads
    resources:
        builds=build_slots,
    params:
        kind="build",
        backend="cpu" if IS_DEMO else "cuda",
        protocol_params=evaluation_params("build"),
        snippets=expected_snippets,
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("build"),
    script:
        "../scripts/run_task.py"


rule check_task:
    input:
        unpack(evaluation_inputs("check")),
    output:
        f"{RES}/check/{{tid}}.json",
    log:
        f"{LOGS}/check_task/{{tid}}.log",
    priority: check_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: EVALUATION_THREADS
    resources:
        gpu=gpu_slots,
    params:
        kind="check",
        backend="cpu" if IS_DEMO else "cuda",
        protocol_params=evaluation_params("check"),
        settings=plan.job_settings("check", None, config),
        snippets=expected_snippets,
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("check"),
        section_timeout=timeout("gpu_section"),
    script:
        "../scripts/run_task.py"


rule time_task:
    input:
        unpack(evaluation_inputs("time")),
    output:
        f"{RES}/time/{{protocol}}/{{mode}}/{{tid}}.json",
    log:
        f"{LOGS}/time_task/{{protocol}}/{{mode}}/{{tid}}.log",
    priority: time_priority
    retries: RETRIES
    conda:
        "../envs/environment.yaml"
    threads: EVALUATION_THREADS
    resources:
        gpu=gpu_slots,
        compile=compile_slots,
    params:
        kind="time",
        backend="cpu" if IS_DEMO else "cuda",
        protocol_params=time_params,
        strict=strict_params,
        settings=lambda w: plan.job_settings("time", w.protocol, config),
        snippets=expected_snippets,
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("time"),
        section_timeout=timeout("gpu_section"),
    script:
        "../scripts/run_task.py"
