"""Where a timed pair's inputs come from, and what it does to the published harness's scores.

    python3 lab/published_harness/input_draws.py --release .release/optimized_cuda_code/h100.json \
        --tasks L1_T012,L2_T001 --strategies host,device_sync,device --repeats 2 --out draws.json

CUDA-L1's ``eval/eval_cuda.py`` draws each timed pair's inputs on the host (``get_inputs()``) and
copies them (``.cuda()``, synchronous from pageable memory), so the GPU is idle when a pair's
start event is recorded; for a task with large inputs the host's draw takes most of the time
(0.35 s for 64 M floats on one CPU). This probe re-creates the harness's timing loop (per outer
trial: both models built under seed 42 + trial and moved, a reference warm-up on inputs held
until the first pair's, three warm-up calls, ten pairs in random order timed with CUDA events,
score = mean over trials of mean(reference)/mean(custom)) with each pair's inputs from:

* ``host``: ``get_inputs()`` on the host, then ``.cuda()`` (the harness);
* ``device``: ``get_inputs()`` under ``torch.device("cuda")``, no synchronisation (the GPU may
  still be drawing when the pair is launched);
* ``device_sync``: the same, then ``torch.cuda.synchronize()`` before the pair;
* ``host_pool``: two host draws per outer trial, copied alternately (``.cuda()``) for each pair;
* ``host_pool_idle``: ``host_pool``, the GPU left idle before each pair for as long as one host
  draw takes, at most 50 ms (does the GPU's state after a long idle host draw differ from its
  state after 50 ms?);
* ``host_loop``: ``host``, with the rest of the harness's pair loop as well: the custom model's
  streams looked for before every pair (a walk over ``dir(model)``), each timed call inside
  ``with torch.cuda.stream(current)``, the order drawn by ``random.choice``, and the trial's
  ``empty_cache`` run while its tensors are alive (they are let go of after it);
* ``host_memory``: ``host_loop``, with the harness's order of device memory as well: a pair's
  inputs drawn on the host, then the inputs before let go of, then the copy (``inputs =
  get_inputs()`` then ``inputs = [x.cuda() ...]``), and each warm-up output held until the next
  call's, the last through the pairs (``_ = model(...)``); the workflow's timing version 9;
* ``harness``: the harness's own ``eval_kernel_against_ref`` (``--harness``, the file unmodified)
  called for each outer trial, as its ``eval_pipeline`` calls it.

Strategies alternate within each repeat, so host drift falls on all alike. Uses only torch.
Writes per task, strategy and repeat: the score, the trials' scores, the median reference and
custom call (ms), and the wall time the trial loop took.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

STRATEGIES = ("host", "device", "device_sync", "host_pool", "host_pool_idle", "host_loop", "host_memory", "harness")
#: The longest idle gap ``host_pool_idle`` leaves before a pair (seconds).
IDLE_CAP_S = 0.05


def load_task(release: str, tid: str) -> dict:
    level, task = int(tid[1]), int(tid.split("_T")[1])
    for line in open(release, encoding="utf-8"):
        row = json.loads(line)
        if row.get("level_id") == level and row.get("task_id") == task:
            return row
    raise SystemExit(f"{release}: no task {tid}")


def classes(row: dict):
    ref, custom = {}, {}
    exec(compile(row["ref_code"], "ref", "exec"), ref)
    exec(compile(row["custom_code"], "custom", "exec"), custom)
    return ref["Model"], custom["ModelNew"], ref["get_inputs"], ref["get_init_inputs"]


def seed_all(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)
    random.seed(seed)


class Draws:
    """Each pair's inputs by ``strategy``; ``trial()`` is called at the start of an outer trial."""

    def __init__(self, strategy: str, get_inputs):
        self.strategy, self.get_inputs, self.pool, self.k = strategy, get_inputs, [], 0
        self.draw_s = 0.0

    def trial(self) -> None:
        if self.strategy in ("host_pool", "host_pool_idle"):
            t0 = time.perf_counter()
            self.pool, self.k = [self.get_inputs(), self.get_inputs()], 0
            self.draw_s = (time.perf_counter() - t0) / 2

    def __call__(self):
        import torch

        if self.strategy == "host":
            return [x.cuda() if isinstance(x, torch.Tensor) else x for x in self.get_inputs()]
        if self.strategy in ("host_pool", "host_pool_idle"):
            if self.strategy == "host_pool_idle":
                time.sleep(min(self.draw_s, IDLE_CAP_S))  # the GPU idle, as after a host draw
            vals = self.pool[self.k % 2]
            self.k += 1
            return [x.cuda() if isinstance(x, torch.Tensor) else x for x in vals]
        with torch.device("cuda"):
            vals = self.get_inputs()
        if self.strategy == "device_sync":
            torch.cuda.synchronize()
        return vals


def time_one(fn, inputs) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def find_model_streams(model) -> list:
    """The harness's walk over a model's attributes for CUDA streams (eval_cuda.py 898-925)."""
    import torch

    streams = []
    for name in dir(model):
        try:
            value = getattr(model, name)
            if isinstance(value, torch.cuda.Stream):
                streams.append(value)
            elif isinstance(value, (list, tuple)):
                streams += [v for v in value if isinstance(v, torch.cuda.Stream)]
            elif isinstance(value, dict):
                streams += [v for v in value.values() if isinstance(v, torch.cuda.Stream)]
        except (AttributeError, RuntimeError):
            continue
    return streams


def time_in_stream(fn, inputs) -> float:
    """One call timed as the harness times it: events made, recorded inside ``torch.cuda.stream``."""
    import torch

    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        fn(*inputs)
        end.record(stream)
    torch.cuda.synchronize(device=torch.device("cuda:0"))
    return start.elapsed_time(end)


def run_harness(row: dict, harness_path: str, trials: int = 7) -> dict:
    """The harness's own ``eval_kernel_against_ref`` for each outer trial (seed 42 + trial)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("eval_cuda", harness_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    scores = []
    t0 = time.perf_counter()
    for trial in range(trials):
        score, _, msg = mod.eval_kernel_against_ref(row["ref_code"], row["ref_code"], row["custom_code"],
                                                    seed_num=42 + trial, num_perf_trials=10,
                                                    device=torch.device("cuda:0"), original_eval_setup="vanilla")
        if score is None:
            return {"error": msg}
        scores.append(score)
    return {"score": statistics.fmean(scores), "trial_scores": [round(s, 4) for s in scores],
            "loop_s": round(time.perf_counter() - t0, 2)}


def run(model_cls, new_cls, get_inputs, get_init_inputs, strategy: str, trials: int = 7, pairs: int = 10) -> dict:
    import torch

    memory = strategy == "host_memory"
    loop = strategy in ("host_loop", "host_memory")
    if loop:
        strategy = "host"

    draws = Draws(strategy, get_inputs)
    rng = random.Random(42)
    scores, refs, cuss = [], [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for trial in range(trials):
            seed_all(42 + trial)
            init = [x.cuda() if isinstance(x, torch.Tensor) else x for x in get_init_inputs()]
            seed_all(42 + trial)
            ref = model_cls(*init).cuda()
            seed_all(42 + trial)
            new = new_cls(*init).cuda()
            draws.trial()
            held = draws()  # the harness's reference warm-up inputs, let go of at the first pair
            warm = draws()
            last = None
            for _ in range(3):
                last = ref(*warm)
                last = new(*warm)
                torch.cuda.synchronize()
            if not memory:
                last = None
            r_ms, c_ms = [], []
            timer = time_in_stream if loop else time_one
            for _ in range(pairs):
                if memory:  # drawn on the host, the inputs before let go of, then copied
                    host = get_inputs()
                    inputs = held = None
                    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in host]
                    del host
                else:
                    inputs = draws()
                held = inputs
                ref_first = random.choice([True, False]) if loop else rng.random() < 0.5
                if loop:
                    find_model_streams(new)
                if ref_first:
                    r_ms.append(timer(ref, inputs))
                    c_ms.append(timer(new, inputs))
                else:
                    c_ms.append(timer(new, inputs))
                    r_ms.append(timer(ref, inputs))
            scores.append(statistics.fmean(r_ms) / statistics.fmean(c_ms))
            refs += r_ms
            cuss += c_ms
            if loop:  # the harness's cleanup: empty_cache while the trial's tensors are alive
                torch.cuda.empty_cache()
                torch.cuda.synchronize()
            del ref, new, warm, held, inputs, last
            if not loop:
                torch.cuda.empty_cache()
    return {"score": statistics.fmean(scores), "trial_scores": [round(s, 4) for s in scores],
            "ref_ms_median": statistics.median(refs), "custom_ms_median": statistics.median(cuss),
            "first_ref_ms": [round(refs[i * pairs], 4) for i in range(trials)],
            "loop_s": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True)
    ap.add_argument("--tasks", required=True, help="comma-separated ids, e.g. L1_T012,L2_T001")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--harness", default=".release/eval/eval_cuda.py", help="eval_cuda.py for the harness strategy")
    args = ap.parse_args(argv)
    import torch

    strategies = [s for s in args.strategies.split(",") if s]
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "runs": []}
    for tid in [t for t in args.tasks.split(",") if t]:
        try:
            row = load_task(args.release, tid)
            parts = classes(row)
        except Exception as err:  # noqa: BLE001 - a task that does not load is recorded, not fatal
            out["runs"].append({"tid": tid, "error": f"{type(err).__name__}: {str(err)[:200]}"})
            continue
        for rep in range(args.repeats):
            order = strategies if rep % 2 == 0 else strategies[::-1]
            for strategy in order:
                try:
                    got = run_harness(row, args.harness) if strategy == "harness" else run(*parts, strategy)
                except Exception as err:  # noqa: BLE001
                    got = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
                out["runs"].append({"tid": tid, "strategy": strategy, "repeat": rep} | got)
                print(tid, strategy, rep, {k: got.get(k) for k in ("score", "ref_ms_median", "custom_ms_median",
                                                                    "loop_s", "error")}, flush=True)
                with open(args.out, "w", encoding="utf-8") as fh:
                    json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
