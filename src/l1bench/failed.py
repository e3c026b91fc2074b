"""The results that broke: a terminal ``crashed`` or ``timeout`` (l1bench.attempts), carried
into the later stages of their task, one path a line. ``--remove`` deletes them, so that the
next run makes them again, each job with ``max_attempts`` new attempts; nothing else reruns:

    l1bench failed --remove results/demo && snakemake --config device=demo
"""

from __future__ import annotations

import json
from pathlib import Path

from l1bench.results import BROKEN_STATUSES, STAGE, results_tree

#: The stages whose results can break (every stage's kind), in the order a task goes through them.
STAGES = tuple(STAGE)


def status(path: str | Path) -> str | None:
    """A result file's status (None: unreadable)."""
    try:
        return json.loads(Path(path).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def broken_results(res: str | Path) -> list[str]:
    """Every build, check and time result below ``res`` (results/<device>) that broke, in stage
    and path order."""
    res = Path(res)
    found = []
    for stage in STAGES:
        pattern = "*/*/L*_T*.json" if stage == "time" else "L*_T*.json"  # time/<protocol>/<mode>/
        found += sorted(str(p) for p in (res / stage).glob(pattern) if status(p) in BROKEN_STATUSES)
    return found


def retry_command(device: str, results_dir: str = "results") -> str:
    """The command that retries the broken results of ``device`` (those of ``results_dir``)."""
    where = "" if results_dir == "results" else f" results_dir={results_dir}"
    return f"l1bench failed --remove {results_dir}/{device} && snakemake --config device={device}{where}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("results_root", type=results_tree, help="results/<device>")
    ap.add_argument("--remove", action="store_true", help="delete them: the next run retries them")
    args = ap.parse_args(argv)
    for path in broken_results(args.results_root):
        if args.remove:
            Path(path).unlink()
        print(f"removed {path}" if args.remove else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
