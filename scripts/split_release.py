"""Snakemake script of split_release: parse the release, verify it, write task folders."""

import logging
from pathlib import Path


def main(smk) -> None:
    from l1bench import fetch, release, split
    from l1bench.log import setup_logging
    from l1bench.plan import BASELINE_PATHS

    setup_logging(smk.log[0])
    inputs = dict(smk.input.items())
    sha = smk.params.sha256
    for key, path in inputs.items():
        if sha.get(key):
            fetch.verify_local(path, sha[key])
    release.check_device(smk.params.device)
    tasks = release.load_release(inputs["release"], {k: p for k, p in inputs.items() if k in BASELINE_PATHS})
    expected = {Path(p).parent.name for p in smk.output.meta}
    found = {t.tid for t in tasks}
    if found != expected:
        extra, missing = sorted(found - expected), sorted(expected - found)
        raise release.ReleaseError(
            f"{inputs['release']}: task set differs from the planned one "
            f"(unexpected: {extra[:5]}, missing: {missing[:5]}); rerun snakemake to re-plan"
        )
    info = {
        "path": smk.params.release_path,
        "sha256": fetch.sha256_file(inputs["release"]),
    }
    written = split.split_release(tasks, Path(smk.output.meta[0]).parent.parent, smk.params.device, info)
    logging.info("wrote %d task folders", len(written))


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
