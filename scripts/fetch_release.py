"""Snakemake script: download one pinned CUDA-L1 release file.

params: ``url`` (str), ``sha256`` (str or None to skip verification).
output: the destination file. log: ``log[0]`` receives all messages.
"""

import logging
import sys


def main(smk):
    from l1bench.log import FORMAT_LEVEL, setup_logging

    setup_logging(smk.log[0], fmt=FORMAT_LEVEL, mode="w", capture_stderr=True)  # stderr too: tracebacks
    from l1bench.fetch import FetchError, download

    url, sha256, dest = smk.params.url, smk.params.get("sha256"), smk.output[0]  # the schema checks its type
    logging.info("fetching %s -> %s (sha256 %s)", url, dest, sha256 or "not checked")
    try:
        download(url, dest, sha256=sha256 or None)
    except FetchError as e:
        logging.error("%s", e)
        sys.exit(1)
    logging.info("ok")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
