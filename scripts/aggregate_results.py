"""Snakemake script: aggregate per-task results of one device into tables, figures and a README.

input (named):  meta (list of meta.json), check (list of check/{tid}.json),
                time (list of time/{protocol}/{mode}/{tid}.json)
output (named): csv (scores.csv), summary (summary.md), per_task (per_task.md),
                scatter (png), ratios (png), report (README.md),
                record (what the tables were made from: l1bench.freshness)
params:         device, ceiling, slices, tolerances, paper_tolerance (atol, rtol)
"""

import json
import logging
from pathlib import Path

#: Hand-written notes beside the generated report, linked when present.
NOTES = {
    "Custom extensions that do not build (extension_failures.md)": "extension_failures.md",
}


def _as_list(x):
    if x is None:
        return []
    if isinstance(x, (str, Path)):
        return [x]
    return list(x)


def main(smk):
    from l1bench.log import FORMAT_NAMED, setup_logging

    if smk.log:
        setup_logging(smk.log[0], fmt=FORMAT_NAMED, mode="w", capture_stderr=True)
    log = logging.getLogger("aggregate")

    from l1bench import aggregate as agg
    from l1bench import codescan, extensions, freshness
    from l1bench.aggregate import tolerance, transfer
    from l1bench.io import atomic_path, atomic_write_text

    device = smk.params.device
    meta = _as_list(smk.input.get("meta"))
    check = _as_list(smk.input.get("check"))
    time = _as_list(smk.input.get("time"))
    log.info("device %s: %d meta, %d check, %d time files", device, len(meta), len(check), len(time))

    df = agg.add_ceiling_flags(agg.load_results(meta, check, time), smk.params.get("ceiling"))
    for scan in _as_list(smk.input.get("scan")):
        df = agg.add_scan_flags(df, json.loads(Path(scan).read_text()))
    df = agg.add_code_flags(df, codescan.scan_tasks(meta))  # the custom snippets beside meta.json
    for note in _as_list(smk.input.get("extension_failures")):
        df = agg.add_extension_flags(df, json.loads(Path(note).read_text()))
    for note in _as_list(smk.input.get("run_spread")):
        df = agg.add_spread_flags(df, json.loads(Path(note).read_text()))
    for note in _as_list(smk.input.get("withdrawn_flags")):
        df = agg.withdraw_flags(df, json.loads(Path(note).read_text()))
    df = agg.add_timed(df, codescan.extension_tasks(meta))  # what each score's code ran, its flags final
    if len(df) and "device" in df:
        df["device"] = df["device"].fillna(device)
    log.info("loaded %d rows (%d tasks)", len(df), df["tid"].nunique() if len(df) else 0)

    out = smk.output
    with atomic_path(out.csv) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    tols = smk.params.get("tolerances")  # correctness pass rates at these (l1bench.aggregate.tolerance)
    tol_summary, tol_per_task = tolerance.sections(check, smk.params.get("paper_tolerance"), tols)
    note = transfer.transfer_note(device, transfer.measured_gpu(df))  # published on one GPU, measured on another
    atomic_write_text(out.summary, agg.render_summary_markdown(df, note) + tol_summary)
    atomic_write_text(out.per_task, agg.render_per_task_markdown(df) + tol_per_task)
    agg.plot_measured_vs_published(df, out.scatter)
    agg.plot_ratio_hist(df, out.ratios)

    report_dir = Path(out.report).parent
    notes = _as_list(smk.input.get("extension_failures"))
    atomic_write_text(
        out.extensions,
        extensions.render(report_dir, device, notes[0] if notes else None),
    )
    # the configured slice reports, and any other beside the tables (made by an earlier run)
    slices = list(smk.params.get("slices") or [])
    slices += sorted(p.stem for p in (report_dir / "slices").glob("*.md") if p.stem not in slices)
    rel = lambda p: agg.relpath(p, report_dir)  # noqa: E731
    prov = {"device": device, **{k: v for k, v in agg.provenance_from_df(df).items() if k != "device"}}
    prov |= {"transfer": note} if note else {}
    text = agg.render_report(
        df,
        prov,
        figures=[
            (rel(out.scatter), "Measured vs published speedup per task"),
            (rel(out.ratios), "Distribution of measured / published"),
        ],
        tables={
            "Summary statistics, published next to measured (summary.md)": rel(out.summary),
            "Per-task results, largest disagreements first (per_task.md)": rel(out.per_task),
            "All scores, one row per task × mode × protocol (scores.csv)": rel(out.csv),
            **{f"Task selection {name} (slices/{name}.md)": f"slices/{name}.md" for name in slices},
            **{text: name for text, name in NOTES.items() if (report_dir / name).is_file()},
        },
    )
    atomic_write_text(out.report, text)
    if out.get("record"):
        # what the tables read (not the stale marker that made this run re-render them)
        inputs = [p for name in smk.input.keys() if name != "stale" for p in _as_list(smk.input.get(name))]
        params = {"device": device, "ceiling": smk.params.get("ceiling")} | tolerance.table_param(tols)
        freshness.write_record(out.record, report_dir, inputs, params)
    counts = agg.status_counts(df)
    if len(counts):
        tot = counts[["measured", "failed", "not_run", "missing"]].sum()
        log.info("measured %d, failed %d, not run %d, missing %d", *tot.tolist())
    log.info("wrote %s", ", ".join(str(p) for p in out))


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
