# Stages 2-4: build (CPU, parallel), check (GPU) and time each mode (GPU), per task.
# Inputs are ancient(): a fresh checkout or a re-downloaded identical release never
# re-times anything. What does: a changed release checksum or protocol parameter
# (params), or a missing/failed result. See README "Rerun policy".
# A job that breaks is retried within the run until its attempts ledger gives it a terminal
# result (l1bench.attempts.in_run_retries): the tables follow in the same run.
RETRIES = attempts.in_run_retries(config["max_attempts"])


rule build_task:
    input:
        meta=task_meta(f"{RES}/build/{{tid}}.json"),
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
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("build"),
    script:
        "../scripts/run_task.py"


rule check_task:
    input:
        meta=task_meta(f"{RES}/check/{{tid}}.json"),
        build=ancient(f"{RES}/build/{{tid}}.json"),
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
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("check"),
        section_timeout=timeout("gpu_section"),
    script:
        "../scripts/run_task.py"


rule time_task:
    input:
        meta=task_meta(f"{RES}/time/{{protocol}}/{{mode}}/{{tid}}.json"),
        check=ancient(f"{RES}/check/{{tid}}.json"),
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
        ext_dir=lambda w: f"{RES}/build/ext/{w.tid}",
        timeout=timeout("time"),
        section_timeout=timeout("gpu_section"),
    script:
        "../scripts/run_task.py"
