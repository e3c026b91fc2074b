# Stage 1: obtain the release (download or local copy) and split it into task folders.


rule fetch_release_file:
    output:
        "resources/cuda-l1/{commit}/{path}",
    log:
        "logs/fetch_release_file/{commit}/{path}.log",
    wildcard_constraints:
        commit="[0-9a-f]{40}",
        path=r"(optimized_cuda_code|more_baselines)/[\w./-]+\.json",
    # l1bench.fetch retries what is transient itself (not a host that does not resolve)
    retries: 0
    conda:
        "../envs/environment.yaml"
    params:
        url=lambda w: fetch.release_url(
            w.path,
            repo=config["upstream"]["repo"],
            commit=w.commit,
            base_url=config["upstream"]["base_url"],
        ),
        sha256=lambda w: PLAN.expected_sha256(w.path),
    script:
        "../scripts/fetch_release.py"


# Task folders are made by this job only (parsing writes nothing); the evaluation jobs take
# them as input only when they run, so a fresh clone's missing folders re-plan nothing.
rule split_release:
    input:
        unpack(split_inputs),
    output:
        meta=PLAN.task_paths("meta", tids=PLAN.all_tids),
    log:
        f"{LOGS}/split_release.log",
    conda:
        "../envs/environment.yaml"
    params:
        device=PLAN.device,
        sha256=PLAN.release_checksums(),
        release_path=PLAN.release_path,
    script:
        "../scripts/split_release.py"
