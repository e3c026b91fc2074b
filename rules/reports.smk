# Lab reports: results trees compared with each other (run-to-run spreads, the isolation
# figure), on the CPU, from committed results; config/reports.yaml lists them. Not part of
# `all`: `snakemake --cores 1 lab_reports ...`. Trees packed into an archive
# (config/archives.yaml) are unpacked first, after their sha256 is checked.
for _name, _entry in ARCHIVES.items():

    rule:
        name:
            f"unpack_archive_{_name.replace('-', '_')}"
        input:
            _entry["archive"],
        output:
            directory(_entry["unpacks"]),
        log:
            f"logs/archives/{_name}.log",
        conda:
            "../envs/environment.yaml"
        params:
            name=_name,
        shell:
            "python -m l1bench.archive unpack {params.name} > {log} 2>&1"


for _i, (_out, (_first, _second)) in enumerate(REPORTS["spread_reports"].items()):

    rule:
        name:
            f"spread_report_{_i}"
        input:
            first=tree_inputs(_first),
            second=tree_inputs(_second),
        output:
            _out,
        log:
            f"logs/reports/spread_{_i}.log",
        conda:
            "../envs/environment.yaml"
        params:
            # callables (bound now, in the loop): the trees are read whole, not path prefixes
            first=lambda w, tree=_first: tree,
            second=lambda w, tree=_second: tree,
        shell:
            "python -m l1bench.compare repeat {params.first} {params.second} --out {output} 2> {log}"


for _i, (_out, _page) in enumerate(REPORTS["throughput_reports"].items()):

    rule:
        name:
            f"throughput_report_{_i}"
        input:
            tree=tree_inputs(_page["tree"], "*/*"),
            samples=tree_inputs(_page["samples"]),
        output:
            _out,
        log:
            f"logs/reports/throughput_{_i}.log",
        conda:
            "../envs/environment.yaml"
        params:
            tree=lambda w, page=_page: page["tree"],
            samples=lambda w, page=_page: page["samples"],
            title=lambda w, page=_page: page["title"],
            about=lambda w, page=_page: page["about"],
        shell:
            "python -m l1bench.stagetimes {params.tree:q} --samples {params.samples:q} --page {output:q}"
            " --title {params.title:q} --about {params.about:q} 2> {log}"


rule isolation_figure:
    input:
        bench="results/h100/bench/stalls-alloc-h200.json",
        trees=[
            tree_inputs(t)
            for t in sorted(
                {t for p in REPORTS["isolation_figure"]["runs"].values() for t in p}
            )
        ],
    output:
        REPORTS["isolation_figure"]["out"],
    log:
        "logs/reports/isolation_figure.log",
    conda:
        "../envs/environment.yaml"
    shell:
        "python scripts/plot_isolation.py {output} > {log} 2>&1"


rule lab_reports:
    input:
        list(REPORTS["spread_reports"]),
        list(REPORTS["throughput_reports"]),
        REPORTS["isolation_figure"]["out"],
