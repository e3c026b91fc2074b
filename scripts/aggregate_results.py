"""Snakemake script of aggregate_results: one device's results into its tables, figures and
report (l1bench.aggregate.tables.make_tables, which names the inputs and outputs it reads).

params: tables (make_tables' keywords: l1bench.runplan.RunPlan.aggregate_params)
"""

from l1bench.aggregate.tables import make_tables
from l1bench.log import FORMAT_NAMED, setup_logging

if "snakemake" in globals():
    smk = snakemake  # noqa: F821
    if smk.log:
        setup_logging(smk.log[0], fmt=FORMAT_NAMED, mode="w", capture_stderr=True)
    make_tables(
        inputs={name: smk.input.get(name) for name in smk.input.keys()},
        out={name: smk.output.get(name) for name in smk.output.keys()},
        **smk.params.tables,
    )
