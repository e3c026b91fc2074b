"""One logging set-up for the workflow's Snakemake scripts; the job scripts' lines (``FORMAT``)
are read back by :mod:`l1bench.attempts` and :mod:`l1bench.preflight`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

#: the job (l1bench.job: build, check, time), split_release, scan_references: time stamp, message
FORMAT = "%(asctime)s %(message)s"
#: fetch_release: with the level
FORMAT_LEVEL = "%(asctime)s %(levelname)s %(message)s"
#: aggregate_results: with the level and the logger's name
FORMAT_NAMED = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(
    log_file: str | Path | None = None,
    level: int = logging.INFO,
    fmt: str = FORMAT,
    *,
    mode: str = "a",
    capture_stderr: bool = False,
) -> None:
    """Send logging to ``log_file`` (opened with ``mode``: "a" where a worker appends to the same
    file, "w" to start it afresh), or to stderr without one; replaces any earlier set-up.
    ``capture_stderr``: ``sys.stderr`` goes to the file too, so tracebacks and warnings land in
    the job's log (the stream stays open for the process's life)."""
    if log_file is None:
        logging.basicConfig(stream=sys.stderr, level=level, format=fmt, force=True)
        return
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    if capture_stderr:
        stream = open(log_file, mode, encoding="utf-8", buffering=1)  # lives for the process
        sys.stderr = stream
        logging.basicConfig(stream=stream, level=level, format=fmt, force=True)
    else:
        logging.basicConfig(filename=log_file, filemode=mode, level=level, format=fmt, force=True)
