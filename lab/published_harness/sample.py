"""A random sample of a release's tasks outside the slice, drawn with a recorded seed.

    PYTHONPATH=lab python lab/published_harness/sample.py --release ../shared/cuda-l1/optimized_cuda_code/h100.json \\
        --seed 20261207 --n 22 --max-m 10 --out lab/published_harness/samples/h100-seed20261207.yaml

The population is every task of the release with custom code (as the workflow reads it) that is
not in ``--exclude`` (default: the slice) and whose inputs hold at most ``--max-m`` million
elements (sized on the meta device, :func:`l1lab.drawcost.input_elements`; a task whose
``get_inputs()`` does not run there is left out). The bound keeps a three-arm, two-pass run
inside one node's budget: the paper protocol's host draws cost about 0.45 s per million
elements a timed step (``lab/evidence/drawcost-h100-v9.md``). The sample is
``random.Random(seed).sample(sorted(population), n)``, so the same seed, release and bound give
the same tasks anywhere. The YAML file (a ``tasks:`` list, as ``sidebyside.py --tasks`` reads
it) records the seed, the bound and the population's size in its header.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

try:
    from . import run
except ImportError:  # run as a script
    import run

#: The tasks the earlier side-by-side runs measured (relative to the repository's root).
SLICE = "config/slices/h100_slice41.yaml"
ROOT = Path(__file__).resolve().parents[2]


def population(sizes: dict[str, dict], exclude: set[str], max_m: float | None) -> list[str]:
    """The sorted ids with code, outside ``exclude``, sized and at most ``max_m`` M elements."""
    return sorted(t for t, e in sizes.items()
                  if e.get("has_code") and t not in exclude and "m" in e and (max_m is None or e["m"] <= max_m))


def draw(pool: list[str], n: int, seed: int) -> list[str]:
    """``n`` of ``pool`` (all of it when smaller), in the order drawn."""
    return random.Random(seed).sample(sorted(pool), min(n, len(pool)))


def render(tids: list[str], seed: int, n_pool: int, max_m: float | None, release: str, exclude: str) -> str:
    bound = "any size" if max_m is None else f"inputs of at most {max_m:g} M elements"
    head = [
        f"# {len(tids)} tasks drawn by lab/published_harness/sample.py: random.Random({seed}).sample over the",
        f"# {n_pool} tasks of {Path(release).name} with custom code, outside {exclude}, {bound}.",
    ]
    items = ", ".join(f'"{int(t[1])}/{int(t.split("_T")[1])}"' for t in tids)
    return "\n".join(head) + f"\nseed: {seed}\ntasks: [{items}]\n"


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab's l1lab
    from l1lab.drawcost import input_elements

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True, help="the release file (flat JSONL)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--n", type=int, default=22)
    ap.add_argument("--max-m", type=float, default=10.0, help="million input elements at most (0: any size)")
    ap.add_argument("--exclude", default=SLICE, help="a YAML tasks file or ids to leave out")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    max_m = args.max_m or None
    exclude = args.exclude
    if not Path(exclude).is_file() and (ROOT / exclude).is_file():  # the slice, from anywhere
        exclude = ROOT / exclude
    pool = population(input_elements(args.release), set(run.task_ids(str(exclude))), max_m)
    tids = draw(pool, args.n, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(tids, args.seed, len(pool), max_m, args.release, args.exclude))
    print(f"{args.out}: {len(tids)} of {len(pool)} tasks: {', '.join(tids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
