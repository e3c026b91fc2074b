"""Snakemake script of build_task, check_task and time_task: the rule's values as plain ones
(l1bench.job.JobSpec) to l1bench.job.main, which runs the job to its result file."""

from pathlib import Path

from l1bench.job import JobSpec, main
from l1bench.results import STAGE


def job_spec(smk) -> JobSpec:
    """The job as its rule gives it: wildcards, input, output, log, params, resources."""
    p, w = smk.params, smk.wildcards
    stage = STAGE[p.kind].upstream  # the earlier stage's result it reads
    return JobSpec(
        rule=smk.rule,
        kind=p.kind,
        tid=w.tid,
        output=smk.output[0],
        log=smk.log[0],
        # results/<device>: the rule's ext_dir is <results>/<device>/build/ext/<tid>
        results=Path(p.ext_dir).parents[2],
        backend=p.backend,
        protocol_params=p.protocol_params,
        ext_dir=p.ext_dir,
        timeout=p.timeout,
        max_attempts=int(p.max_attempts),
        upstream=getattr(smk.input, stage) if stage else None,
        mode=getattr(w, "mode", None),
        protocol=getattr(w, "protocol", None),
        strict=getattr(p, "strict", None),
        section_timeout=getattr(p, "section_timeout", None),
        snippets=getattr(p, "snippets", None),
        settings=getattr(p, "settings", None),
        gpu_slots=getattr(smk.resources, "gpu", None),
    )


if "snakemake" in globals():
    main(job_spec(snakemake))  # noqa: F821
