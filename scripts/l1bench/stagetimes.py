"""Per-stage wall time of a run, from the provenance recorded in every result file.

``python scripts/l1bench/stagetimes.py results/h100`` prints, per stage (build, check,
each time mode): jobs, summed job wall time, summed time holding the GPU lock (the
exclusive GPU cost), summed torch.compile warm-up, and the span from the first start to
the last finish.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from tabulate import tabulate


def stage_of(res: dict) -> str:
    return res["kind"] if res["kind"] != "time" else f"time:{res.get('protocol', 'paper')}:{res['mode']}"


def collect(root) -> dict:
    stats: dict = defaultdict(lambda: defaultdict(float))
    spans: dict = {}
    for path in Path(root).glob("**/*.json"):
        if path.parent.name == "tasks" or path.name == "meta.json":
            continue
        try:
            res = json.loads(path.read_text())
        except ValueError:
            continue
        if res.get("kind") not in ("build", "check", "time"):
            continue
        st = stats[stage_of(res)]
        prov = res.get("provenance", {})
        st["jobs"] += 1
        st["wall_s"] += prov.get("wall_s") or 0.0
        st["gpu_lock_s"] += res.get("lock_held_s") or 0.0
        st["compile_warmup_s"] += res.get("precompile_s") or 0.0
        for key in ("started", "finished"):
            if prov.get(key):
                t = datetime.fromisoformat(prov[key])
                lo, hi = spans.get(stage_of(res), (t, t))
                spans[stage_of(res)] = (min(lo, t), max(hi, t))
    return {k: dict(v) | {"span_s": (spans[k][1] - spans[k][0]).total_seconds() if k in spans else 0.0}
            for k, v in stats.items()}


def table(stats: dict) -> str:
    rows = [
        [k, int(v["jobs"]), round(v["wall_s"], 1), round(v["gpu_lock_s"], 1), round(v["compile_warmup_s"], 1),
         round(v["wall_s"] / max(v["jobs"], 1), 2), round(v["gpu_lock_s"] / max(v["jobs"], 1), 2)]
        for k, v in sorted(stats.items())
    ]
    tot = [sum(r[i] for r in rows) for i in range(1, 5)]
    rows.append(["total", *[round(x, 1) for x in tot], "", ""])
    head = ["stage", "jobs", "job wall s", "GPU lock s", "compile warm-up s", "wall/job", "lock/job"]
    return tabulate(rows, head, tablefmt="github")


if __name__ == "__main__":
    print(table(collect(sys.argv[1] if len(sys.argv) > 1 else "results/h100")))
