"""Per-stage wall time of a run, from the provenance recorded in every result file.

``python -m l1lab stagetimes results/h100`` prints, per stage (build, check,
each time mode): results, jobs that ran a worker, summed job wall time, summed time holding the GPU lock (the
exclusive GPU cost), summed torch.compile warm-up, and the span from the first start to
the last finish, and how many paper-protocol timed calls a host-side stall stretched
(l1bench.timing.stalls). ``--since``/``--until`` restrict it to one part of a run made in several parts.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

from tabulate import tabulate

from l1bench.results import Status
from l1bench.timing import hostclock, stalls
from l1lab.retime import prepared


def bound_label(sides: list[str]) -> str:
    """``neither``, ``ref``, ``custom`` or ``both``, for :func:`l1bench.timing.hostclock.host_bound_sides`' list."""
    return "both" if len(sides) == 2 else (sides[0] if sides else "neither")


def stage_of(res: dict) -> str:
    return res["kind"] if res["kind"] != "time" else f"time:{res.get('protocol', 'paper')}:{res['mode']}"


def _when(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


#: Key :func:`results` adds to a result that ``l1lab retime prepare`` copied into the tree
#: (made by an earlier run: :func:`collect` and :func:`report` leave it out of this run's work).
PREPARED_KEY = "_prepared"


def results(root, since: str | None = None, until: str | None = None):
    """The build/check/time results under ``root``; with ``since``/``until`` (ISO times),
    only those whose worker started in that window (one part of a run made in several parts). A result that
    ``l1lab retime prepare`` copied in (:func:`l1lab.retime.prepared`) carries
    :data:`PREPARED_KEY`."""
    lo_t, hi_t = (_when(since) if since else None), (_when(until) if until else None)
    copied = prepared(root)
    for path in Path(root).glob("**/*.json"):
        if path.parent.name == "tasks" or path.name == "meta.json":
            continue
        try:
            res = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(res, dict) or res.get("kind") not in ("build", "check", "time"):
            continue
        prov = res.get("provenance", {})
        if lo_t or hi_t:
            started = _when(prov["started"]) if prov.get("started") else None
            if started is None or (lo_t and started < lo_t) or (hi_t and started >= hi_t):
                continue
        if copied and path.relative_to(root).as_posix() in copied:
            res[PREPARED_KEY] = True
        yield res


def collect(rows) -> dict:
    """Per-stage sums over result dicts (:func:`results`); results an earlier run made
    (:data:`PREPARED_KEY`) are left out."""
    stats: dict = defaultdict(lambda: defaultdict(float))
    spans: dict = {}
    for res in rows:
        if res.get(PREPARED_KEY):
            continue
        prov = res.get("provenance", {})
        st = stats[stage_of(res)]
        st["jobs"] += 1
        st["worker_jobs"] += prov.get("worker") is not False
        st["wall_s"] += prov.get("wall_s") or 0.0
        st["gpu_lock_s"] += res.get("lock_held_s") or 0.0
        st["compile_warmup_s"] += res.get("precompile_s") or 0.0
        for key in ("started", "finished"):
            if prov.get(key):
                t = _when(prov[key])
                lo, hi = spans.get(stage_of(res), (t, t))
                spans[stage_of(res)] = (min(lo, t), max(hi, t))
    return {
        k: dict(v)
        | {
            "span_s": (spans[k][1] - spans[k][0]).total_seconds() if k in spans else 0.0,
            "first": spans[k][0] if k in spans else None,
            "last": spans[k][1] if k in spans else None,
        }
        for k, v in stats.items()
    }


def table(stats: dict) -> str:
    rows = [
        [k, int(v["jobs"]), int(v.get("worker_jobs", 0)), round(v["wall_s"], 1), round(v["gpu_lock_s"], 1),
         round(v["compile_warmup_s"], 1), round(v["wall_s"] / max(v.get("worker_jobs", 0), 1), 2),
         round(v["gpu_lock_s"] / max(v.get("worker_jobs", 0), 1), 2)]
        for k, v in sorted(stats.items())
    ]
    tot = [sum(r[i] for r in rows) for i in range(1, 6)]
    rows.append(["total", *[int(x) for x in tot[:2]], *[round(x, 1) for x in tot[2:]], "", ""])
    head = ["stage", "results", "worker jobs", "job wall s", "GPU lock s", "compile warm-up s", "wall/worker job",
            "lock/worker job"]
    return tabulate(rows, head, tablefmt="github")


def lock_by_phase(rows) -> dict:
    """{stage: {step: GPU-lock seconds}} summed over the result dicts (:func:`results`) that
    record it (``phases_locked``, from the worker's ``phase`` steps): where a stage's lock time
    goes."""
    out: dict = defaultdict(lambda: defaultdict(float))
    for res in rows:
        for step, held in (res.get("phases_locked") or {}).items():
            out[stage_of(res)][step] += held
    return {k: dict(v) for k, v in out.items()}


def phase_table(by_phase: dict) -> str:
    """One row per stage, one column per step (GPU-lock seconds), and the stage's total."""
    steps = sorted({step for v in by_phase.values() for step in v})
    rows = [
        [k, *(round(v.get(s, 0.0), 1) for s in steps), round(sum(v.values()), 1)] for k, v in sorted(by_phase.items())
    ]
    return tabulate(rows, ["stage (GPU lock s)", *steps, "total"], tablefmt="github")


#: Generated module names folded into one (inductor's compiled graphs, the tasks' snippets).
_GENERATED = (
    (re.compile(r"^torch\._inductor\.runtime\.compile_tasks\.\w+:"), "torch._inductor.runtime.compile_tasks.<graph>:"),
    (re.compile(r"^l1snip_\w+:"), "<task snippet>:"),
)


#: Call plumbing every compiled call passes through (the worker's entry, modules' __call__,
#: dynamo's and AOT autograd's wrappers, the compiled graph's and the snippet's own frames):
#: left out of a profile's "on the stack" column, which then says what the time splits into.
_PLUMBING = (
    "runpy:", "__main__:", "l1bench.worker.entry:", "l1bench.worker.stages:", "contextlib:",
    "torch.nn.modules.module:", "torch._dynamo.eval_frame:", "torch._functorch.", "torch._inductor.output_code:",
    "torch._inductor.utils:run", "torch._inductor.compile_fx:run", "torch._inductor.runtime.compile_tasks.<graph>:",
    "<task snippet>:", "l1bench.worker.torch_hooks:call",
)


def _fold(name: str) -> str:
    for pattern, repl in _GENERATED:
        name = pattern.sub(repl, name)
    return name


#: The compile step, under which older profiled results recorded their samples
#: (``compile_lock_profile``; newer ones have every untimed step in ``lock_profile``).
COMPILE_STEP = "compile (tracing and code generation unlocked)"


def _profiles_of(res: dict) -> dict:
    """{step: sampled stacks summary} of a result (``lock_profile``, or the older
    ``compile_lock_profile`` of the compile step alone)."""
    if res.get("lock_profile"):
        return res["lock_profile"]
    return {COMPILE_STEP: res["compile_lock_profile"]} if res.get("compile_lock_profile") else {}


def lock_profile(rows, top: int = 12, min_sampled_s: float = 0.5) -> dict:
    """{(stage, step): {"results", "sampled_s", "locked_s", "inclusive": [(function, s)], "leaf":
    [...]}} over the results that record sampled stacks of their steps' locked time (the
    worker's opt-in ``L1BENCH_PROFILE_LOCKED``), steps with less than ``min_sampled_s`` sampled
    left out. Generated module names are folded; the call chain down to the compiled model's
    kernels (``_PLUMBING``) is left out of ``inclusive``, which then says what the time splits
    into. The worker keeps each result's top 25 of both."""
    acc: dict = defaultdict(lambda: {"results": 0, "sampled_s": 0.0, "locked_s": 0.0,
                                     "inclusive": Counter(), "leaf": Counter()})
    for res in rows:
        for step, prof in _profiles_of(res).items():
            a = acc[(stage_of(res), step)]
            a["results"] += 1
            a["sampled_s"] += prof.get("sampled_s", 0.0)
            a["locked_s"] += (res.get("phases_locked") or {}).get(step, 0.0)
            for key, out in (("inclusive_s", "inclusive"), ("leaf_s", "leaf")):
                folded: Counter = Counter()
                for name, sec in prof.get(key, []):
                    # on the stack: a folded name counts once per sample (the longest); innermost: summed
                    name = _fold(name)
                    folded[name] = max(folded[name], sec) if key == "inclusive_s" else folded[name] + sec
                a[out].update(folded)
    result = {}
    for key, a in sorted(acc.items()):
        if a["sampled_s"] < min_sampled_s:
            continue
        result[key] = {
            "results": a["results"],
            "sampled_s": a["sampled_s"],
            "locked_s": a["locked_s"],
            "inclusive": [(n, s) for n, s in a["inclusive"].most_common() if not n.startswith(_PLUMBING)][:top],
            "leaf": a["leaf"].most_common(top),
        }
    return result


def profile_tables(profile: dict) -> str:
    """Markdown of :func:`lock_profile`: per stage and step, a line and one table of functions
    (seconds on the sampled stack, and as the innermost frame)."""
    out = []
    for (stage, step), p in profile.items():
        inclusive, leaf = dict(p["inclusive"]), dict(p["leaf"])
        names = list(inclusive) + [n for n in leaf if n not in inclusive]
        rows = [[n, round(inclusive.get(n, 0.0), 2), round(leaf.get(n, 0.0), 2)] for n in names]
        out.append(
            f"{stage}, step \"{step}\": {p['results']} results, the step's lock {p['locked_s']:.1f} s, "
            f"{p['sampled_s']:.1f} s of it sampled\n\n"
            + tabulate(rows, ["function", "on the stack s", "innermost s"], tablefmt="github")
        )
    return "\n\n".join(out)


def overall(stats: dict) -> dict:
    """Whole-run figures: first start to last finish, and the share of it the GPU lock was held."""
    starts = [v["first"] for v in stats.values() if v.get("first")]
    ends = [v["last"] for v in stats.values() if v.get("last")]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    lock = sum(v["gpu_lock_s"] for v in stats.values())
    return {"span_s": span, "gpu_lock_s": lock, "lock_share": lock / span if span else 0.0}


def missing_time_results(rows) -> tuple[int, list[str]]:
    """(time results expected, the missing ones as ``"stage tid"``): every task with a check
    result, in every time stage the tree holds. A run stopped at its budget leaves some out,
    and its span then covers fewer than the whole selection (a 41-task slice on 2026-12-04: 244 of
    246, the two longest jobs among the missing)."""
    checked = {r["tid"] for r in rows if r["kind"] == "check" and r.get("tid")}
    have = {(stage_of(r), r["tid"]) for r in rows if r["kind"] == "time" and r.get("tid")}
    stages = sorted({s for s, _ in have})
    missing = [f"{s} {t}" for s in stages for t in sorted(checked) if (s, t) not in have]
    return len(stages) * len(checked), missing


def task_workers(rows, span_s: float | None = None) -> str | None:
    """One line on the task workers (results that record ``provenance.task_worker``):
    processes, the steps they served, CUDA's starts inside the lock among those steps, the
    workers that retired early and why (counted), and the waits for a task's earlier steps;
    with the run's ``span_s``, those waits as job slots: a job that waits for its task's
    earlier step holds a Snakemake job slot (``gpu``) and feeds nothing to the GPU, so the
    slots left to keep the GPU lock busy are fewer by that many on average.
    None when no result was served by one."""
    served = [r for r in rows if (r.get("provenance") or {}).get("task_worker")]
    if not served:
        return None
    ways = [r["provenance"]["task_worker"] for r in served]
    pids = {(w.get("pid"), w.get("started")) for w in ways}
    starts = sum(1 for r in served if "cuda_init (locked)" in (r.get("phases") or {}))
    why = Counter(re.sub(r":.*", "", w["retired_after"]) for w in ways if w.get("retired_after"))
    waited = sum(w.get("step_lock_wait_s") or 0.0 for w in ways)
    line = (
        f"task workers: {len(pids)} processes served {len(served)} steps "
        f"({len(served) / len(pids):.1f} a process); CUDA started in the lock in {starts} of them; "
        f"waits for a task's earlier steps {waited:.0f} s in all"
    )
    if span_s:
        line += f" ({waited / span_s:.1f} job slots held waiting, on average over the run)"
    if why:
        line += "; retired early: " + ", ".join(f"{n}× {reason}" for reason, n in why.most_common())
    again = later_workers(served)
    if again:
        tasks = len({tid for tid, _ in again})
        opened = Counter(stage for _, stage in again)
        line += (
            f"; {tasks} tasks started another worker after their first, with "
            + ", ".join(f"{n}× {stage}" for stage, n in opened.most_common())
        )
    return line


def later_workers(served) -> list[tuple[str, str]]:
    """(task, stage of the step that opened it) for every worker of a task after its first.
    A task gets another worker when its next step comes after the last one idled out
    (60 s, ``l1bench.pool.client.IDLE_S``) or retired; each pays CUDA's start and its first kernels
    again (a 41-task slice on 2026-12-04: 34 later workers in 26 tasks, 19 of them opened by the strict step)."""
    first_steps = {}
    for r in served:
        w = r["provenance"]["task_worker"]
        if r.get("tid") and w.get("step") == 1:
            first_steps.setdefault(r["tid"], []).append((str(w.get("started") or ""), stage_of(r)))
    return [(tid, stage) for tid, steps in first_steps.items() for _, stage in sorted(steps)[1:]]


def describe_missing(expected: int, missing: list[str], show: int = 8) -> str:
    line = f"time results: {expected - len(missing)} of {expected} (each checked task in each timed stage)"
    if missing:
        more = f" and {len(missing) - show} more" if len(missing) > show else ""
        line += "; missing: " + ", ".join(missing[:show]) + more
    return line


def _number(text: str) -> float | None:
    return float(text) if text.replace(".", "", 1).isdigit() else None


def gpu_samples(lines) -> dict:
    """Summary of ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,... -l 1``
    lines: utilisation, and the memory used (MiB) at the median and at its highest."""
    util, mem = [], []
    for line in lines:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) > 1 and _number(parts[1]) is not None:
            util.append(float(parts[1]))
            if len(parts) > 2 and _number(parts[2]) is not None:
                mem.append(float(parts[2]))
    if not util:
        return {"samples": 0}
    out = {
        "samples": len(util),
        "mean_util_pct": sum(util) / len(util),
        "idle_share": sum(1 for u in util if u == 0) / len(util),
    }
    if mem:
        mem.sort()
        out |= {"memory_median_mib": int(mem[len(mem) // 2]), "memory_max_mib": int(mem[-1])}
    return out


def _span(prov: dict) -> tuple[float, float] | None:
    """A step's (start, finish) in epoch seconds from its provenance; None where either is missing."""
    if not (prov.get("started") and prov.get("finished")):
        return None
    return _when(prov["started"]).timestamp(), _when(prov["finished"]).timestamp()


def _sample_time(text: str) -> float | None:
    """An nvidia-smi timestamp (``2026/12/05 05:21:55.996``, the node's clock: UTC) in epoch s."""
    try:
        return datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def processes_by_memory(rows, lines, idle_s: float = 60.0, top: float = 0.05) -> dict | None:
    """What held CUDA processes while the GPU's memory was at its highest: over the GPU
    sampler's ``lines`` (one a second) in the run's span, the mean number of one-shot worker
    processes running a check or time step, of task workers running a step, and of
    task workers idle (counted live until ``idle_s`` after their last step, their idle exit:
    ``l1bench.pool.client.IDLE_S``), in the ``top`` share of samples by memory
    used, and in all samples. None without samples in the span."""
    one_shot, workers = [], defaultdict(list)
    for r in rows:
        prov = r.get("provenance") or {}
        span = _span(prov)
        if r.get("kind") == "build" or span is None or not prov.get("worker", True):
            continue
        w = prov.get("task_worker")
        if w:
            workers[(w.get("pid"), w.get("started"))].append(span)
        else:
            one_shot.append(span)
    if not one_shot and not workers:
        return None
    lives = [(min(a for a, _ in v), max(b for _, b in v) + idle_s, v) for v in workers.values()]
    lo = min([a for a, _ in one_shot] + [a for a, _, _ in lives])
    hi = max([b for _, b in one_shot] + [b for _, b, _ in lives])
    samples = []
    for line in lines:
        parts = [x.strip() for x in line.split(",")]
        t = _sample_time(parts[0]) if parts else None
        mem = _number(parts[2]) if len(parts) > 2 else None
        if t is None or mem is None or not lo <= t <= hi:
            continue
        busy = sum(any(a <= t <= b for a, b in v) for _, _, v in lives)
        live = sum(a <= t <= b for a, b, _ in lives)
        samples.append((mem, sum(a <= t <= b for a, b in one_shot), busy, live - busy))
    if not samples:
        return None
    samples.sort(reverse=True)
    high = samples[: max(1, round(top * len(samples)))]
    mean = lambda xs, i: sum(x[i] for x in xs) / len(xs)  # noqa: E731
    return {
        "samples": len(samples), "top": top, "memory_floor_mib": int(high[-1][0]),
        "high": {k: mean(high, i) for i, k in enumerate(("memory_mib", "one_shot", "workers_busy", "workers_idle"))},
        "all": {k: mean(samples, i) for i, k in enumerate(("memory_mib", "one_shot", "workers_busy", "workers_idle"))},
    }


def describe_memory(m: dict) -> str:
    """One line of :func:`processes_by_memory`."""
    def part(d):
        text = f"{d['one_shot']:.1f} one-shot worker processes"
        if d["workers_busy"] or d["workers_idle"]:
            text += f", {d['workers_busy']:.1f} task workers running a step and {d['workers_idle']:.1f} idle"
        return text
    return (
        f"GPU memory: in the {100 * m['top']:.0f} % of the {m['samples']} samples with the most used (≥ "
        f"{m['memory_floor_mib']} MiB) {part(m['high'])} on average; over all samples "
        f"({m['all']['memory_mib']:.0f} MiB on average) {part(m['all'])}"
    )


def _stat_row(parts: list[str]) -> tuple[int, int, int]:
    """One /proc/stat CPU line, split after the sampler's epoch (``<epoch> cpu[N] user nice
    system idle iowait irq softirq ...``): (total, idle + iowait, irq + softirq) jiffies."""
    vals = [int(x) for x in parts[2:]]
    return sum(vals), vals[3] + vals[4], sum(vals[5:7])


def _shares(rows) -> tuple[list[float], list[float]]:
    """Busy and interrupt shares of each second between consecutive :func:`_stat_row` rows."""
    pairs = [(r0, r1) for r0, r1 in zip(rows, rows[1:], strict=False) if r1[0] > r0[0]]
    busy = [1 - (r1[1] - r0[1]) / (r1[0] - r0[0]) for r0, r1 in pairs]
    irq = [(r1[2] - r0[2]) / (r1[0] - r0[0]) for r0, r1 in pairs]
    return busy, irq


def cpu_samples(lines) -> dict:
    """Busy share of all CPUs from ``<epoch> cpu user nice system idle iowait ...`` lines
    (the first line of /proc/stat, sampled once a second)."""
    rows = [_stat_row(parts) for parts in map(str.split, lines) if len(parts) > 5 and parts[1] == "cpu"]
    if len(rows) < 2:
        return {"samples": len(rows)}
    busy, _ = _shares(rows)
    return {
        "samples": len(busy),
        "mean_busy_pct": 100 * sum(busy) / len(busy),
        "saturated_share": sum(1 for b in busy if b > 0.9) / len(busy),
    }


def _per_cpu_rows(lines) -> dict[str, list[tuple[int | None, tuple[int, int, int]]]]:
    """Each CPU's (epoch or None, :func:`_stat_row`) rows of the cpus-* sampler's lines, in order."""
    per: dict[str, list] = {}
    for parts in map(str.split, lines):
        if len(parts) > 6 and parts[1].startswith("cpu") and parts[1][3:].isdigit():
            per.setdefault(parts[1], []).append((int(parts[0]) if parts[0].isdigit() else None, _stat_row(parts)))
    return per


def _timing_cpu_name(per: dict, timing_cpu: int | None) -> str:
    """The timing CPU's name among ``per``'s: ``timing_cpu`` where sampled, else the highest."""
    return f"cpu{timing_cpu}" if f"cpu{timing_cpu}" in per else max(per, key=lambda name: int(name[3:]))


def per_cpu_samples(lines, timing_cpu: int | None = None) -> dict:
    """Busy shares per CPU from ``<epoch> cpuN user nice system idle iowait ...`` lines (every
    CPU's line of /proc/stat, once a second): the timing CPU's mean busy share and its share of
    interrupt + softirq time (``timing_cpu``, as the results record it; else the
    highest-numbered CPU, the timing CPU of a one-GPU machine), and the mean busy share of the
    others."""
    per = {name: [row for _, row in rows] for name, rows in _per_cpu_rows(lines).items()}
    if not per or min(len(rows) for rows in per.values()) < 2:
        return {"samples": 0}
    timing = _timing_cpu_name(per, timing_cpu)
    busy, irq = _shares(per[timing])
    others = [b for name, rows in per.items() if name != timing for b in _shares(rows)[0]]
    return {
        "samples": len(busy),
        "cpus": len(per),
        f"{timing}_busy_pct": 100 * sum(busy) / len(busy),
        f"{timing}_irq_pct": 100 * sum(irq) / len(irq),
        "others_busy_pct": 100 * sum(others) / len(others) if others else 0.0,
    }


def others_busy_by_second(lines, timing_cpu: int | None = None) -> dict[int, float]:
    """The other CPUs' mean busy share in each sampled second (the cpus-* sampler's epoch of the
    second's end -> share), the timing CPU left out as in :func:`per_cpu_samples`."""
    per = {name: {t: row for t, row in rows if t is not None} for name, rows in _per_cpu_rows(lines).items()}
    per = {name: rows for name, rows in per.items() if rows}
    if not per:
        return {}
    timing = _timing_cpu_name(per, timing_cpu)
    out: dict[int, float] = {}
    for second in sorted({t for name, rows in per.items() if name != timing for t in rows}):
        shares = []
        for name, rows in per.items():
            r0, r1 = rows.get(second - 1), rows.get(second)
            if name != timing and r0 and r1 and r1[0] > r0[0]:
                shares.append(1 - (r1[1] - r0[1]) / (r1[0] - r0[0]))
        if shares:
            out[second] = sum(shares) / len(shares)
    return out


def timed_and_stalled(res: dict) -> tuple[int, int] | None:
    """(timed calls, stalled calls) of one paper-protocol result with timings (whatever its
    status); None for any other."""
    if res.get("protocol", "paper") != "paper" or not res.get("ref_ms"):
        return None
    info = stalls.rescore(res["ref_ms"], res.get("custom_ms") or [])
    if info is None:
        return None
    return sum(map(len, res["ref_ms"])) + sum(map(len, res.get("custom_ms") or [])), info["stalled_calls"]


def ok_timed_and_stalled(results):
    """(result, timed calls, stalled calls) of each ok paper-protocol result with timings: the
    results every stall rate counts (:func:`stall_rate` and this module's lines)."""
    for res in results:
        counts = timed_and_stalled(res) if res.get("status") == Status.OK else None
        if counts is not None:
            yield res, counts[0], counts[1]


def stall_rate(results) -> dict:
    """Over paper-protocol result dicts: results, timed calls, stalled calls, flagged results."""
    out = {"results": 0, "timed_calls": 0, "stalled_calls": 0, "flagged": 0}
    for res, n_timed, n_stalled in ok_timed_and_stalled(results):
        out["results"] += 1
        out["timed_calls"] += n_timed
        out["stalled_calls"] += n_stalled
        out["flagged"] += stalls.outlier_flag(res) is not None
    return out


def per_1000(rate: dict) -> float:
    """Stalled calls per 1000 timed calls of a :func:`stall_rate` (0 without timings)."""
    return 1000 * rate["stalled_calls"] / rate["timed_calls"] if rate["timed_calls"] else 0.0


def describe_rate(rate: dict) -> str:
    if not rate["timed_calls"]:
        return "no paper-protocol timings"
    return (
        f"timed calls stalled by the host: {rate['stalled_calls']} of {rate['timed_calls']} "
        f"({per_1000(rate):.1f} per 1000); paper results flagged {stalls.FLAG}: {rate['flagged']} of {rate['results']}"
    )


def _ok_paper_counts(rows):
    """:func:`ok_timed_and_stalled` of the time results among ``rows``: the
    results of the run's stall-rate headline."""
    return ok_timed_and_stalled(r for r in rows if r.get("kind") == "time")


#: Buckets of :func:`stalls_by_load`: the other CPUs' mean busy share during a step.
LOAD_BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01))


def stalls_by_load(rows, busy: dict[int, float]) -> list[dict]:
    """Stalled timed calls of the ok paper-protocol time results (:mod:`l1bench.timing.stalls`, the same
    results as the run's stall-rate headline, :func:`stall_rate`), bucketed by
    how busy the other CPUs were during the step (mean of :func:`others_busy_by_second` over its
    provenance span): does the run's own load stretch its timed calls, or do stalls come at any
    load (the host's)? Steps without samples in their span are left out."""
    counts = [{"lo": lo, "hi": min(hi, 1.0), "timed_calls": 0, "stalled_calls": 0, "steps": 0}
              for lo, hi in LOAD_BUCKETS]
    for res, n_timed, n_stalled in _ok_paper_counts(rows):
        span = _span(res.get("provenance") or {})
        if span is None:
            continue
        shares = [busy[t] for t in range(int(span[0]), int(span[1]) + 2) if t in busy]
        if not shares:
            continue
        load = sum(shares) / len(shares)
        bucket = next(b for b, (lo, hi) in zip(counts, LOAD_BUCKETS, strict=True) if lo <= load < hi)
        bucket["steps"] += 1
        bucket["timed_calls"] += n_timed
        bucket["stalled_calls"] += n_stalled
    return [b for b in counts if b["steps"]]


def describe_stalls_by_load(buckets: list[dict]) -> str | None:
    if not buckets:
        return None
    parts = [
        f"{100 * b['lo']:.0f}–{100 * b['hi']:.0f} %: {b['stalled_calls']} of {b['timed_calls']} "
        f"({1000 * b['stalled_calls'] / b['timed_calls']:.1f} per 1000, {b['steps']} steps)"
        for b in buckets if b["timed_calls"]
    ]
    return "timed calls stalled, by the other CPUs' busy share during the step: " + "; ".join(parts)


def stall_burst(rows, window_s: float = 10.0) -> dict | None:
    """Do the run's stalled calls come spread out, or in a burst that hit whatever was timed
    then? The steps (ok paper time results) that started within ``window_s`` of each other and
    hold the most stalled calls: their task ids (with the mode, other than default), start
    times (epoch s), stalled calls, and the rest of the run's stalled calls per 1000 without
    them. None without stalled calls."""
    timed = stalled = 0
    hit = []
    for res, n_timed, n_stalled in _ok_paper_counts(rows):
        timed += n_timed
        stalled += n_stalled
        span = _span(res.get("provenance") or {})
        if n_stalled and span is not None:
            mode = res.get("mode") or "default"
            hit.append((span[0], str(res.get("tid")) + ("" if mode == "default" else f" {mode}"), n_stalled, n_timed))
    if not hit:
        return None
    hit.sort()
    best = max(([h for h in hit[i:] if h[0] - hit[i][0] <= window_s] for i in range(len(hit))),
               key=lambda group: (sum(h[2] for h in group), -len(group)))
    in_burst, burst_timed = sum(h[2] for h in best), sum(h[3] for h in best)
    rest = timed - burst_timed
    return {
        "window_s": window_s, "tids": [h[1] for h in best], "first": best[0][0], "last": best[-1][0],
        "stalled_calls": in_burst, "all_stalled_calls": stalled,
        "rest_per_1000": 1000 * (stalled - in_burst) / rest if rest else 0.0,
    }


def describe_stall_burst(burst: dict | None) -> str | None:
    if burst is None:
        return None
    first = datetime.fromtimestamp(burst["first"], timezone.utc).strftime("%H:%M:%S")
    n = len(burst["tids"])
    spread, tids = burst["last"] - burst["first"], ", ".join(burst["tids"])
    where = (f"1 step ({tids}, started {first} UTC)" if n == 1 else
             f"{n} steps started from {first} UTC over {spread:.0f} s ({tids})")
    return (
        f"stalled calls in the busiest {burst['window_s']:.0f} s of step starts: {burst['stalled_calls']} of "
        f"{burst['all_stalled_calls']}, in {where}; the other steps {burst['rest_per_1000']:.1f} per 1000"
    )


def stalls_by_worker_step(rows) -> dict[str, list[int]]:
    """Stalled timed calls of the ok paper time results by where the step ran:
    a task worker's first step, a later one (after others of its task in the same process), or
    a one-shot worker (the compile modes, and older results): {place: [steps, timed,
    stalled]}. Does a long-lived worker stall more as it serves more steps?"""
    out: dict[str, list[int]] = {}
    for res, n_timed, n_stalled in _ok_paper_counts(rows):
        step = ((res.get("provenance") or {}).get("task_worker") or {}).get("step")
        place = "one-shot" if step is None else ("first" if step == 1 else "later")
        acc = out.setdefault(place, [0, 0, 0])
        acc[0] += 1
        acc[1] += n_timed
        acc[2] += n_stalled
    return out


def describe_stalls_by_worker_step(by_place: dict[str, list[int]]) -> str | None:
    """One line, only for a run with task workers."""
    if not by_place.keys() & {"first", "later"}:
        return None
    names = {"first": "a task worker's first step", "later": "its later steps", "one-shot": "one-shot jobs"}
    parts = [
        f"{names[k]} {1000 * v[2] / v[1]:.1f} ({v[2]} of {v[1]}, {v[0]} steps)"
        for k in ("first", "later", "one-shot") if (v := by_place.get(k)) and v[1]
    ]
    return "timed calls stalled per 1000, by where the step ran: " + "; ".join(parts)


def _paper_time(rows):
    """The paper-protocol time results among ``rows`` (any status): what the host clock's
    lines read (:func:`stall_causes`, :func:`kept_stalls`, :func:`cpu_probe`)."""
    return (r for r in rows if r.get("kind") == "time" and r.get("protocol", "paper") == "paper")


def stall_causes(rows) -> Counter:
    """Why the paper results' stalled calls were stretched (``host_timing.stall_causes``, from
    :func:`l1bench.timing.hostclock.stall_cause`): preempted, host_lost, host_slow, driver_blocked,
    gpu, and cpu_slow where the CPU probe ran."""
    causes: Counter = Counter()
    for res in _paper_time(rows):
        causes.update((res.get("host_timing") or {}).get("stall_causes") or {})
    return causes


def kept_stalls(rows) -> dict | None:
    """The stalled calls left in the ok paper results' scores (``host_timing.calls_listed``
    rows with a cause and not retimed; up to the ledger's ``keep`` rows a result): by cause, and
    how many had the other side of their pair or a neighbouring pair of their trial stalled too
    (an episode: something slowed the timing CPU for milliseconds, whatever it launched). None
    when no result lists any."""
    causes: Counter = Counter()
    in_episodes = total = 0
    for res in _paper_time(rows):
        if res.get("status") != "ok":
            continue
        ht = res.get("host_timing") or {}
        cols = ht.get("columns")
        if not cols:
            continue
        listed = [dict(zip(cols, row, strict=False)) for row in ht.get("calls_listed") or []]
        kept = [r for r in listed if r.get("stall_cause", "-") != "-" and not r.get("retimed")]
        spots = Counter((r["trial"], r["pair"]) for r in kept)
        for r in kept:
            total += 1
            causes[r["stall_cause"]] += 1
            t, p = r["trial"], r["pair"]
            in_episodes += spots[(t, p)] > 1 or (t, p - 1) in spots or (t, p + 1) in spots
    return {"calls": total, "causes": causes, "in_episodes": in_episodes} if total else None


def describe_kept_stalls(kept: dict | None) -> str | None:
    if not kept:
        return None
    return (
        f"stalled calls left in the scores, as the host clock saw them: {kept['calls']} ("
        + ", ".join(f"{name} {n}" for name, n in kept["causes"].most_common())
        + f"); {kept['in_episodes']} of them beside another stalled call of their trial (the same or the next pair)"
    )


def cpu_probe(rows) -> dict | None:
    """The CPU probe's counts over the paper results that ran it (``host_timing.probe``, recorded
    by older results that ran with ``L1BENCH_HOST_PROBE``); None when none did."""
    ran = [ht for res in _paper_time(rows) if (ht := res.get("host_timing") or {}).get("probe")]
    if not ran:
        return None
    got = [ht["probe"] for ht in ran]
    medians = sorted(p["median_us"] for p in got if p.get("median_us") is not None)
    return {
        "results": len(got),
        "settings": sorted({p.get("setting", "?") for p in got}),
        "probes": sum(p.get("probes", 0) for p in got),
        "median_us": medians[len(medians) // 2] if medians else None,
        "slow": sum(p.get("slow", 0) for p in got),
        "pairs_beside_slow": sum(p.get("pairs_beside_slow", 0) for p in got),
        "retimed": sum(p.get("retimed", 0) for p in got),
        # only a result that ran the probe names a stall cpu_slow
        "cpu_slow": sum((ht.get("stall_causes") or {}).get("cpu_slow", 0) for ht in ran),
    }


def describe_cpu_probe(probe: dict | None) -> str | None:
    if not probe:
        return None
    per_1000 = 1000 * probe["slow"] / probe["probes"] if probe["probes"] else 0.0
    return (
        f"CPU probe (L1BENCH_HOST_PROBE={'/'.join(probe['settings'])}) in {probe['results']} results: "
        f"{probe['probes']} probes, median {probe['median_us']} µs (the results' median), {probe['slow']} slow "
        f"({per_1000:.1f} per 1000); {probe['pairs_beside_slow']} pairs beside a slow one, "
        f"{probe['retimed']} of them timed again; stalled calls beside one (cpu_slow): {probe['cpu_slow']}"
    )


def host_bound(rows) -> dict | None:
    """How many ok paper results had a host-bound side (:func:`l1bench.timing.hostclock.host_bound_sides`):
    the reference's only, the custom code's only, both; ``known`` of them record their launches.
    None when none does."""
    counts: Counter = Counter()
    for res in _paper_time(rows):
        if res.get("status") != "ok":
            continue
        sides = hostclock.host_bound_sides(res)
        if sides is None:
            continue
        counts["known"] += 1
        counts[bound_label(sides)] += 1
    return dict(counts) if counts else None


def describe_host_bound(hb: dict | None) -> str | None:
    if not hb:
        return None
    bound = hb["known"] - hb.get("neither", 0)
    return (
        f"results with host-bound timed calls (a side's median launch ≥ {100 * hostclock.HOST_BOUND_SHARE:.0f} % of "
        f"its median timed call): {bound} of {hb['known']} (reference only {hb.get('ref', 0)}, custom only "
        f"{hb.get('custom', 0)}, both {hb.get('both', 0)}); their scores move with the host's speed"
    )


def timing_cpu_of(rows) -> int | None:
    """The timing CPU most of the results' workers ran their GPU sections on (provenance
    ``timing_cpu``); None when none records one."""
    seen = Counter(
        int(cpu) for res in rows if str(cpu := (res.get("provenance") or {}).get("timing_cpu") or "").isdigit()
    )
    return seen.most_common(1)[0][0] if seen else None


#: The samplers of lab/device_run.sh, by file-name prefix (other files are not samples).
SAMPLERS = {"gpu-": gpu_samples, "cpus-": per_cpu_samples, "cpu-": cpu_samples}


def samples_summary(folder, timing_cpu: int | None = None, rows=None) -> str:
    """One line per sampler file of ``lab/device_run.sh`` (GPU utilisation, CPU busy, the
    timing CPU's busy share: ``timing_cpu``, else the highest); other files in the folder
    (Snakemake logs) are left out. With the run's result ``rows``, each GPU sampler's line is
    followed by what held the GPU's memory (:func:`processes_by_memory`), from the same read."""
    out = []
    for path in sorted(Path(folder).glob("*")):
        reader = next((f for prefix, f in SAMPLERS.items() if path.name.startswith(prefix)), None)
        if reader is None:
            continue
        lines = path.read_text(errors="replace").splitlines()
        summary = reader(lines, timing_cpu) if reader is per_cpu_samples else reader(lines)
        vals = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items())
        out.append(f"{path.name}: {vals}")
        if rows is not None and reader is gpu_samples and (m := processes_by_memory(rows, lines)):
            out.append(f"{path.name}: " + describe_memory(m))
        if rows is not None and reader is per_cpu_samples:
            by_load = describe_stalls_by_load(stalls_by_load(rows, others_busy_by_second(lines, timing_cpu)))
            if by_load:
                out.append(f"{path.name}: " + by_load)
    return "\n".join(out)


def allocator_peaks(rows, top: int = 3) -> str | None:
    """One line on the steps' own GPU memory (``gpu_memory``, results since 2026-12-05): the
    allocator's peak per step, median and the highest ``top`` (task and step), in MiB. None
    when no result records it."""
    peaks = sorted(
        ((r["gpu_memory"]["max_reserved_mib"], f"{r.get('tid')} {stage_of(r)}") for r in rows
         if isinstance(r.get("gpu_memory"), dict) and r["gpu_memory"].get("max_reserved_mib") is not None),
        reverse=True,
    )
    if not peaks:
        return None
    median = sorted(p for p, _ in peaks)[len(peaks) // 2]
    highest = ", ".join(f"{name} {mib:.0f}" for mib, name in peaks[:top])
    return (f"GPU memory reserved by a step's tensors (allocator peak, {len(peaks)} steps): median {median:.0f} MiB;"
            f" highest {highest} MiB")


def replay_idle_bound(rows, max_idle: int, idle_s: float = 60.0) -> dict:
    """The task workers replayed on a run's recorded steps under another idle policy:
    how many workers would have started had at most ``max_idle`` waited idle at once (0: no
    bound, ``l1bench.pool.idle``) with an idle exit after ``idle_s``. Each step keeps
    the start and finish it had (no feedback: fewer CUDA starts would have moved them), so the
    estimate is of the bound's first-order cost. Unbounded, with the run's own ``idle_s``, it
    gives the run's own count to within a worker or two (a worker's idle time starts after it
    replied, a little after the step's recorded finish). ``{"starts", "max_idle"}``."""
    steps = defaultdict(list)
    for r in rows:
        prov = r.get("provenance") or {}
        span = _span(prov)
        if prov.get("task_worker") and span is not None:
            steps[r.get("tid")].append(span)
    # at one instant a step's end comes before another's start (0 < 1): its worker is idle then
    events = sorted([(b, 0, tid) for tid, v in steps.items() for _, b in v]
                    + [(a, 1, tid) for tid, v in steps.items() for a, _ in v])
    idle_since: dict = {}  # task -> None (running a step) or when it went idle
    starts = most = 0
    for t, is_start, tid in events:
        for task, since in list(idle_since.items()):
            if since is not None and t - since > idle_s:
                del idle_since[task]
        if is_start:
            starts += tid not in idle_since
            idle_since[tid] = None
            continue
        waiting = sum(since is not None for since in idle_since.values())
        if max_idle and waiting >= max_idle:
            idle_since.pop(tid, None)  # finds no token: exits after its step
        else:
            idle_since[tid] = t
        most = max(most, sum(since is not None for since in idle_since.values()))
    return {"starts": starts, "max_idle": most}


def report(root, samples=None, since=None, until=None, bullet: str = "") -> str:
    """The stage table, then the run's span and lock share, its stalled timed calls and (with
    ``samples``) one line per sampler file; ``bullet`` starts each of those lines. All of it is
    this run's own: results ``l1lab retime prepare`` copied in are left out, except that a
    copied check still expects its time results."""
    everything = list(results(root, since, until))  # read once: every summary below is over them
    rows = [r for r in everything if not r.get(PREPARED_KEY)]
    stats = collect(rows)
    o = overall(stats)
    lines = [
        f"first start to last finish {o['span_s']:.0f} s; GPU lock held {o['gpu_lock_s']:.0f} s "
        f"({100 * o['lock_share']:.0f} % of it)",
        describe_rate(stall_rate(r for r in rows if r["kind"] == "time")),
    ]
    causes = stall_causes(rows)
    if causes:
        lines[-1] += " (the host clock's causes of the stalled calls it saw, retimed pairs' included: " + ", ".join(
            f"{name} {n}" for name, n in causes.most_common()) + ")"
    for extra in (
        describe_stall_burst(stall_burst(rows)),
        describe_stalls_by_worker_step(stalls_by_worker_step(rows)),
        describe_kept_stalls(kept_stalls(rows)),
        describe_cpu_probe(cpu_probe(rows)),
        describe_host_bound(host_bound(rows)),
    ):
        if extra:
            lines.append(extra)
    if not (since or until):  # a window holds one part of a run, not the selection
        lines.insert(1, describe_missing(*missing_time_results(everything)))
    workers = task_workers(rows, o["span_s"])
    if workers:
        lines.append(workers)
    peaks = allocator_peaks(rows)
    if peaks:
        lines.append(peaks)
    if samples:
        lines += samples_summary(samples, timing_cpu_of(rows), rows).splitlines()
    by_phase = lock_by_phase(rows)
    steps = "\n\nGPU lock by step (results that record it):\n\n" + phase_table(by_phase) if by_phase else ""
    profile = lock_profile(rows)
    if profile:
        steps += (
            "\n\nWhere the untimed steps' GPU lock goes, sampled (results run with"
            " L1BENCH_PROFILE_LOCKED=1; generated modules folded, call plumbing left out):\n\n"
            + profile_tables(profile)
        )
    return table(stats) + "\n\n" + "\n".join(bullet + line for line in lines) + steps


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="results/h100")
    ap.add_argument("--samples", help="folder of device_run.sh samples (GPU utilisation, CPU load)")
    ap.add_argument("--since", help="only results whose worker started at or after this ISO time")
    ap.add_argument("--until", help="only results whose worker started before this ISO time")
    ap.add_argument("--page", help="write a markdown page here (atomically) instead of printing")
    ap.add_argument("--title", default="", help="the page's title (with --page)")
    ap.add_argument("--about", default="", help="the page's paragraph under the title (with --page)")
    ap.add_argument("--idle-bounds", nargs="+", type=int, metavar="N",
                    help="the task workers that would have started with at most N idle at once")
    ap.add_argument("--idle-s", type=float, default=60.0, help="with --idle-bounds: the idle exit (s)")
    args = ap.parse_args(argv)
    if args.idle_bounds:
        rows = list(results(args.root, args.since, args.until))
        for n in [0, *args.idle_bounds]:
            r = replay_idle_bound(rows, n, args.idle_s)
            print(f"at most {n or 'any number of'} idle, idle exit {args.idle_s:g} s: {r['starts']} task workers "
                  f"started, at most {r['max_idle']} idle at once (replayed on the recorded steps)")
        return
    if not args.page:
        print(report(args.root, args.samples, args.since, args.until))
        return
    from l1bench.io import atomic_write_text

    head = f"# {args.title}\n\n" + (f"{args.about.strip()}\n\n" if args.about.strip() else "")
    atomic_write_text(args.page, head + report(args.root, args.samples, args.since, args.until, "* ") + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
