# What reruns is decided in one place (l1bench.staleness, docs/rerun-policy.md).


# The one-line reason a result (or the tables, or the task folders) is stale, as the input that
# reruns its job in this run; the run's markers are removed when it ends.
rule mark_stale:
    output:
        f"{RES}/stale/{{what}}.{{key}}.txt",
    log:
        f"{LOGS}/mark_stale/{{what}}.{{key}}.log",
    wildcard_constraints:
        what=r"(build|check|time/\w+/\w+)/L\d+_T\d{3}|tables|tasks",
        key=r"[0-9a-f]{12}",
    localrule: True
    params:
        reason=lambda w: stale_reason(w.what) or "forced",
    message:
        "{wildcards.what} is stale: {params.reason}"
    run:
        Path(output[0]).write_text(f"{params.reason}\n")
