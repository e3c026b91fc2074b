"""Run-time report helpers: per-stage totals and the device_run.sh samplers' summaries."""

import json

import pytest

from l1lab import stagetimes


def _result(path, kind, started, finished, lock=0.0, mode=None):
    res = {"kind": kind, "provenance": {"started": started, "finished": finished, "wall_s": 10.0}, "lock_held_s": lock}
    if mode:
        res |= {"mode": mode, "protocol": "paper"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res))


def test_overall_span_and_lock_share(tmp_path):
    _result(tmp_path / "check/L1_T001.json", "check", "2026-12-03T10:00:00+00:00", "2026-12-03T10:00:20+00:00", 5)
    _result(tmp_path / "time/paper/default/L1_T001.json", "time", "2026-12-03T10:00:20+00:00",
            "2026-12-03T10:01:40+00:00", 35, mode="default")
    (tmp_path / "tasks/L1_T001").mkdir(parents=True)
    (tmp_path / "tasks/L1_T001/meta.json").write_text('{"kind": "check"}')  # never counted
    stats = stagetimes.collect(stagetimes.results(tmp_path))
    assert set(stats) == {"check", "time:paper:default"}
    o = stagetimes.overall(stats)
    assert o["span_s"] == 100 and o["gpu_lock_s"] == 40 and abs(o["lock_share"] - 0.4) < 1e-9
    assert "time:paper:default" in stagetimes.table(stats)


def test_a_window_keeps_one_part_of_a_run_made_in_parts(tmp_path):
    _result(tmp_path / "check/L1_T001.json", "check", "2026-12-03T10:00:00+00:00", "2026-12-03T10:00:20+00:00", 5)
    _result(tmp_path / "check/L1_T002.json", "check", "2026-12-03T11:00:00+00:00", "2026-12-03T11:00:30+00:00", 7)
    no_worker = json.loads((tmp_path / "check/L1_T002.json").read_text())
    no_worker["provenance"]["worker"] = False
    (tmp_path / "check/L1_T003.json").write_text(json.dumps(no_worker))
    stats = stagetimes.collect(stagetimes.results(tmp_path, since="2026-12-03T10:30:00+00:00"))
    assert stats["check"]["jobs"] == 2 and stats["check"]["worker_jobs"] == 1
    assert stats["check"]["gpu_lock_s"] == 14
    stats = stagetimes.collect(stagetimes.results(tmp_path, until="2026-12-03T10:30:00"))  # naive times are UTC
    assert stats["check"]["jobs"] == 1 and stats["check"]["gpu_lock_s"] == 5


def test_gpu_samples():
    lines = ["2026/12/03 10:00:00.000, 0, 500, 345, 3201, 80.1", "2026/12/03 10:00:01.000, 100, 900, 1980, 3201, 500",
             "2026/12/03 10:00:02.000, 50, 900, 1980, 3201, 300", "garbage"]
    s = stagetimes.gpu_samples(lines)
    assert s["samples"] == 3 and s["mean_util_pct"] == 50 and abs(s["idle_share"] - 1 / 3) < 1e-9
    assert stagetimes.gpu_samples([]) == {"samples": 0}
    assert (s["memory_median_mib"], s["memory_max_mib"]) == (900, 900)
    assert "memory_max_mib" not in stagetimes.gpu_samples(["2026/12/03 10:00:00.000, 10"])


def test_what_ran_while_the_gpu_memory_was_highest():
    """Each GPU sample counted against the steps running then: one-shot workers, task workers
    in a step, task workers idle until their idle exit; the top share of samples by memory."""
    def step(start, end, pid=None):
        prov = {"started": f"2026-12-03T10:00:{start:02d}+00:00", "finished": f"2026-12-03T10:00:{end:02d}+00:00"}
        if pid:
            prov["task_worker"] = {"pid": pid, "started": "s"}
        return {"kind": "time", "provenance": prov}

    # one-shot 0-9 s; worker 7 runs steps 0-4 and 10-14 (idle between, and for 5 s after: idle_s=5)
    rows = [step(0, 9), step(0, 4, pid=7), step(10, 14, pid=7),
            {"kind": "build", "provenance": {"started": "2026-12-03T10:00:00+00:00",
                                             "finished": "2026-12-03T10:00:30+00:00"}}]
    mem = {0: 100, 2: 300, 6: 900, 12: 500, 17: 200, 25: 999}  # 25 s: after every step (left out)
    lines = [f"2026/12/03 10:00:{t:02d}.000, 50, {m}, 1980" for t, m in mem.items()] + ["garbage"]
    m = stagetimes.processes_by_memory(rows, lines, idle_s=5, top=0.2)
    assert m["samples"] == 5 and m["memory_floor_mib"] == 900
    assert m["high"] == {"memory_mib": 900, "one_shot": 1, "workers_busy": 0, "workers_idle": 1}
    assert m["all"]["one_shot"] == 3 / 5 and m["all"]["workers_busy"] == 3 / 5 and m["all"]["workers_idle"] == 2 / 5
    line = stagetimes.describe_memory(m)
    assert line.startswith("GPU memory: in the 20 % of the 5 samples with the most used (≥ 900 MiB) 1.0 one-shot")
    assert "0.0 task workers running a step and 1.0 idle" in line
    assert stagetimes.processes_by_memory(rows[-1:], lines) is None
    assert stagetimes.processes_by_memory(rows, ["2026/12/04 10:00:00.000, 1, 5, 6"]) is None


def test_cpu_samples_busy_share():
    # user nice system idle iowait irq softirq: 100 jiffies per second, first second 75 % busy, then idle
    lines = ["1 cpu 0 0 0 0 0 0 0", "2 cpu 70 0 5 20 5 0 0", "3 cpu 70 0 5 120 5 0 0"]
    s = stagetimes.cpu_samples(lines)
    assert s["samples"] == 2 and abs(s["mean_busy_pct"] - 37.5) < 1e-9 and s["saturated_share"] == 0


def test_per_cpu_samples_and_only_sampler_files(tmp_path):
    """cpus-*: the highest CPU's busy and interrupt shares apart from the others' busy share;
    files that are not samplers (a Snakemake log beside them) are left out of the summary."""
    # columns: user nice system idle iowait irq softirq; cpu1 is busy 1/4 (all of it irq), cpu0 1/2
    lines = [
        "1 cpu0 0 0 0 0 0 0 0", "1 cpu1 0 0 0 0 0 0 0",
        "2 cpu0 2 0 0 2 0 0 0", "2 cpu1 0 0 0 6 0 2 0",
        "3 cpu0 4 0 0 4 0 0 0", "3 cpu1 0 0 0 12 0 3 1",
    ]
    s = stagetimes.per_cpu_samples(lines)
    assert s["samples"] == 2 and s["cpus"] == 2
    assert abs(s["cpu1_busy_pct"] - 25) < 1e-9 and abs(s["cpu1_irq_pct"] - 25) < 1e-9
    assert abs(s["others_busy_pct"] - 50) < 1e-9
    assert stagetimes.per_cpu_samples(["1 cpu  1 2 3 4 5 6 7"]) == {"samples": 0}  # the all-CPU line
    (tmp_path / "cpus-1.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "snakemake-1.log").write_text("Finished job 1\n")
    summary = stagetimes.samples_summary(tmp_path)
    assert summary.startswith("cpus-1.txt: samples 2, cpus 2, cpu1_busy_pct 25.00") and "snakemake" not in summary
    # the timing CPU the results record, where it is not the highest (a machine left narrowed)
    s0 = stagetimes.per_cpu_samples(lines, timing_cpu=0)
    assert abs(s0["cpu0_busy_pct"] - 50) < 1e-9 and abs(s0["others_busy_pct"] - 25) < 1e-9
    assert "cpu1_busy_pct" in stagetimes.per_cpu_samples(lines, timing_cpu=7)  # not sampled: the highest
    assert "cpu0_busy_pct 50.00" in stagetimes.samples_summary(tmp_path, 0)


def test_the_timing_cpu_is_the_one_most_results_record():
    rows = [{"provenance": {"timing_cpu": c}} for c in ("14", "14", "15", None)] + [{}]
    assert stagetimes.timing_cpu_of(rows) == 14
    assert stagetimes.timing_cpu_of([{"provenance": {}}]) is None


def test_a_page_is_the_printed_report_with_a_title_and_bullets(tmp_path, capsys):
    _result(tmp_path / "r/time/paper/default/L1_T001.json", "time", "2026-12-03T10:00:20+00:00",
            "2026-12-03T10:01:40+00:00", 35, mode="default")
    stagetimes.main([str(tmp_path / "r")])
    printed = capsys.readouterr().out
    page = tmp_path / "THROUGHPUT.md"
    stagetimes.main([str(tmp_path / "r"), "--page", str(page), "--title", "Throughput", "--about", "One run."])
    text = page.read_text()
    assert text.startswith("# Throughput\n\nOne run.\n\n| stage")
    assert "\n* first start to last finish 80 s; GPU lock held 35 s (44 % of it)\n" in text
    assert text.replace("\n* ", "\n").endswith(printed.split("\n\n", 1)[1])


def test_lock_time_by_step(tmp_path):
    for tid, held in (("L1_T001", {"warm-up calls": 0.5, "timed pairs": 1.0}), ("L1_T002", {"timed pairs": 2.0})):
        path = tmp_path / f"time/paper/default/{tid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": "time", "mode": "default", "protocol": "paper", "provenance": {},
                                    "phases_locked": held}))
    by = stagetimes.lock_by_phase(stagetimes.results(tmp_path))
    assert by == {"time:paper:default": {"warm-up calls": 0.5, "timed pairs": 3.0}}
    assert "| time:paper:default   |             3 |             0.5 |     3.5 |" in stagetimes.phase_table(by)
    assert "GPU lock by step" in stagetimes.report(tmp_path)


def test_the_lock_profile_sums_results_by_step_and_leaves_the_plumbing_out():
    def profile(inclusive, leaf):
        return {"sampled_s": sum(s for _, s in leaf), "inclusive_s": inclusive, "leaf_s": leaf}

    graph = "torch._inductor.runtime.compile_tasks"
    first = profile([["torch.nn.modules.module:_call_impl", 0.3], [f"{graph}.abc:call", 0.3],
                     [f"{graph}.def:call", 0.2], ["triton_heuristics:bench", 0.2]],
                    [["torch._ops:__call__", 0.1], ["benchmarking:benchmark_gpu", 0.2]])
    rows = [
        # the older key: the compile step alone
        {"kind": "time", "protocol": "paper", "mode": "torch_compile", "compile_lock_profile": first,
         "phases_locked": {stagetimes.COMPILE_STEP: 0.5, "timed pairs": 9}},
        {"kind": "time", "protocol": "paper", "mode": "torch_compile",
         "phases_locked": {stagetimes.COMPILE_STEP: 0.25, "reference warm-up": 0.5},
         "lock_profile": {stagetimes.COMPILE_STEP: profile([["triton_heuristics:bench", 0.1]],
                                                           [["benchmarking:benchmark_gpu", 0.1]]),
                          "reference warm-up": profile([], [["torch.cuda:synchronize", 0.01]])}},
        {"kind": "time", "protocol": "paper", "mode": "default", "phases_locked": {"timed pairs": 1}},
    ]
    prof = stagetimes.lock_profile(rows, min_sampled_s=0.1)
    assert list(prof) == [("time:paper:torch_compile", stagetimes.COMPILE_STEP)]  # warm-up: too few samples
    p = prof[("time:paper:torch_compile", stagetimes.COMPILE_STEP)]
    assert p["results"] == 2 and abs(p["locked_s"] - 0.75) < 1e-9 and abs(p["sampled_s"] - 0.4) < 1e-9
    assert [(n, round(s, 3)) for n, s in p["inclusive"]] == [("triton_heuristics:bench", 0.3)]  # plumbing out
    leaf = [(n, round(s, 3)) for n, s in p["leaf"]]
    assert leaf == [("benchmarking:benchmark_gpu", 0.3), ("torch._ops:__call__", 0.1)]
    assert ("time:paper:torch_compile", "reference warm-up") in stagetimes.lock_profile(rows, min_sampled_s=0)
    text = stagetimes.profile_tables(prof)
    step = stagetimes.COMPILE_STEP
    assert text.startswith(f'time:paper:torch_compile, step "{step}": 2 results, the step\'s lock 0.8 s')
    assert "| triton_heuristics:bench" in text and "module:_call_impl" not in text
    assert stagetimes.lock_profile(rows[2:]) == {}


def test_the_time_results_a_stopped_run_left_out_are_named(tmp_path):
    for tid in ("L1_T001", "L3_T015"):
        for kind, where, mode in (("check", "check", None), ("time", "time/paper/default", "default")):
            _result(tmp_path / f"{where}/{tid}.json", kind, "2026-12-03T10:00:00+00:00", "2026-12-03T10:00:20+00:00",
                    1, mode=mode)
    _result(tmp_path / "time/paper/torch_compile/L1_T001.json", "time", "2026-12-03T10:00:20+00:00",
            "2026-12-03T10:00:40+00:00", 1, mode="torch_compile")
    for path in tmp_path.glob("**/*.json"):  # real results name their task
        res = json.loads(path.read_text())
        path.write_text(json.dumps(res | {"tid": path.stem}))
    rows = list(stagetimes.results(tmp_path))
    assert stagetimes.missing_time_results(rows) == (4, ["time:paper:torch_compile L3_T015"])
    report = stagetimes.report(tmp_path)
    line = "time results: 3 of 4 (each checked task in each timed stage); missing: time:paper:torch_compile L3_T015"
    assert line in report
    assert "time results:" not in stagetimes.report(tmp_path, since="2026-12-03T09:00:00+00:00")
    assert stagetimes.describe_missing(3, []) == "time results: 3 of 3 (each checked task in each timed stage)"


def test_task_workers_line_counts_processes_steps_and_retirements():
    from l1lab.stagetimes import task_workers

    def row(pid, step, retired=None, started_cuda=False, wait=0.0):
        tw = {"pid": pid, "started": f"t{pid}", "step": step, "step_lock_wait_s": wait}
        if retired:
            tw["retired_after"] = retired
        phases = {"cuda_init (locked)": 0.2} if started_cuda else {}
        return {"kind": "check", "provenance": {"task_worker": tw}, "phases": phases}

    assert task_workers([{"kind": "check", "provenance": {}}]) is None
    rows = [
        row(1, 1, started_cuda=True), row(1, 2, wait=1.5), row(1, 3),
        row(2, 1, started_cuda=True, retired="the step replaced 1 of torch's bindings: torch.relu"),
        row(3, 1, started_cuda=True, wait=2.0),
    ]
    line = task_workers(rows)
    assert line.startswith("task workers: 3 processes served 5 steps (1.7 a process)")
    assert "CUDA started in the lock in 3 of them" in line and "4 s in all" in line
    assert line.endswith("retired early: 1× the step replaced 1 of torch's bindings")
    assert "(0.5 job slots held waiting, on average over the run)" in task_workers(rows, span_s=7.0)


def test_task_workers_line_counts_the_tasks_that_needed_another_worker():
    """A task whose next step came after its worker's idle exit starts another one: the line
    says how many tasks, and which steps opened the later workers."""
    from l1lab.stagetimes import task_workers

    def row(tid, pid, step, kind="time", protocol="strict"):
        tw = {"pid": pid, "started": f"2026-12-05T05:2{pid}:00+00:00", "step": step}
        return {"kind": kind, "tid": tid, "protocol": protocol, "mode": "default", "provenance": {"task_worker": tw}}

    rows = [
        row("L1_T001", 1, 1, kind="check"), row("L1_T001", 1, 2, protocol="paper"), row("L1_T001", 3, 1),
        row("L1_T002", 2, 1, kind="check"), row("L1_T002", 2, 2, protocol="paper"), row("L1_T002", 2, 3),
        row("L1_T003", 4, 1, kind="check"), row("L1_T003", 5, 1, protocol="paper"), row("L1_T003", 6, 1),
    ]
    line = task_workers(rows)
    assert line.startswith("task workers: 6 processes served 9 steps")
    tail = "; 2 tasks started another worker after their first, with 2× time:strict:default, 1× time:paper:default"
    assert line.endswith(tail)
    assert "started another worker" not in task_workers(rows[3:6])


def test_a_bound_on_idle_task_workers_replayed_on_recorded_steps():
    """Three tasks, two steps each; the third's second step comes after the idle exit. With at
    most one worker idle, the second and third task's workers exit after their first step."""
    def step(tid, start, end):
        prov = {"started": f"2026-12-05T05:00:{start:02d}+00:00", "finished": f"2026-12-05T05:00:{end:02d}+00:00",
                "task_worker": {"pid": 1, "started": "s"}}
        return {"kind": "time", "tid": tid, "provenance": prov}

    rows = [step("L1_T001", 0, 1), step("L1_T001", 10, 11), step("L1_T002", 2, 3), step("L1_T002", 12, 13),
            step("L1_T003", 4, 5), step("L1_T003", 40, 41), {"kind": "check", "tid": "L1_T004", "provenance": {}}]
    replay = stagetimes.replay_idle_bound
    assert replay(rows, 0, idle_s=30) == {"starts": 4, "max_idle": 3}
    assert replay(rows, 2, idle_s=30) == {"starts": 4, "max_idle": 2}
    assert replay(rows, 1, idle_s=30) == {"starts": 5, "max_idle": 1}
    assert replay(rows, 0, idle_s=5)["starts"] == 6
    assert replay(rows[-1:], 0) == {"starts": 0, "max_idle": 0}


def test_the_steps_allocator_peaks_in_one_line():
    rows = [{"kind": "time", "tid": f"L3_T00{i}", "mode": "default", "protocol": "paper",
             "gpu_memory": {"max_allocated_mib": 1.0, "max_reserved_mib": float(mib)}}
            for i, mib in enumerate([100, 4000, 300, 2000])] + [{"kind": "check", "tid": "L1_T001"}]
    line = stagetimes.allocator_peaks(rows, top=2)
    assert line == ("GPU memory reserved by a step's tensors (allocator peak, 4 steps): median 2000 MiB;"
                    " highest L3_T001 time:paper:default 4000, L3_T003 time:paper:default 2000 MiB")
    assert stagetimes.allocator_peaks(rows[-1:]) is None


def test_stalls_by_the_other_cpus_load_and_their_causes(tmp_path):
    """Each paper time result's stalled calls go to the bucket of the other CPUs' mean busy share
    over its span (the timing CPU left out); causes are summed from host_timing."""
    # cpu0 (other) busy 10 % in seconds 1-2, then 90 % in 2-4; cpu1 is the timing CPU (highest)
    lines = []
    cum0, cum1 = [0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]
    for t, busy0 in zip(range(1, 5), (None, 10, 90, 90), strict=True):
        if busy0 is not None:
            cum0 = [cum0[0] + busy0, 0, 0, cum0[3] + 100 - busy0, 0, 0, 0]
            cum1 = [cum1[0] + 100, 0, 0, cum1[3], 0, 0, 0]
        lines += [f"{t} cpu0 " + " ".join(map(str, cum0)), f"{t} cpu1 " + " ".join(map(str, cum1))]
    busy = stagetimes.others_busy_by_second(lines)
    assert busy == pytest.approx({2: 0.1, 3: 0.9, 4: 0.9})

    def res(start, end, ref_ms, causes=None):
        return {"kind": "time", "status": "ok", "protocol": "paper", "ref_ms": ref_ms, "custom_ms": [[1.0] * 5],
                "provenance": {"started": f"1970-01-01T00:00:0{start}+00:00",
                               "finished": f"1970-01-01T00:00:0{end}+00:00"},
                "host_timing": {"stall_causes": causes or {}}}

    quiet = res(1, 1, [[1.0] * 4 + [9.0]], {"host_slow": 1})  # one stalled call while the others idled
    loaded = res(3, 3, [[1.0] * 5], {})
    failed = {**res(1, 1, [[1.0] * 4 + [9.0]]), "status": "incorrect"}  # not ok: not in the headline either
    rows = [quiet, loaded, failed, res(8, 8, [[1.0] * 5]), {"kind": "check"}]  # no samples in 8-9: left out
    buckets = stagetimes.stalls_by_load(rows, busy)
    assert [(b["lo"], b["steps"], b["stalled_calls"], b["timed_calls"]) for b in buckets] == \
        [(0.0, 1, 1, 10), (0.75, 1, 0, 10)]
    line = stagetimes.describe_stalls_by_load(buckets)
    assert "0–25 %: 1 of 10 (100.0 per 1000, 1 steps)" in line and "75–100 %: 0 of 10" in line
    assert stagetimes.stall_causes(rows + [res(1, 1, [[1.0]], {"host_slow": 2, "gpu": 1})]) == \
        {"host_slow": 3, "gpu": 1}
    assert stagetimes.describe_stalls_by_load([]) is None


def _timed(tid, start_s, stalled, step=None, status="ok", calls=10):
    """An ok paper time result of ``calls`` reference calls, ``stalled`` of them stretched 9x
    (l1bench.timing.stalls counts those), started ``start_s`` seconds into the hour."""
    ref = [[1.0] * (calls - stalled) + [9.0] * stalled]
    prov = {"started": f"2026-12-05T10:00:{start_s:02d}+00:00", "finished": f"2026-12-05T10:00:{start_s + 1:02d}+00:00"}
    if step is not None:
        prov["task_worker"] = {"step": step}
    return {"kind": "time", "status": status, "protocol": "paper", "tid": tid, "ref_ms": ref,
            "custom_ms": [[1.0] * 10], "provenance": prov}


def test_a_burst_of_stalls_is_named_and_the_rest_of_the_run_rated_without_it():
    """The steps started within 10 s of each other that hold the most stalled calls are the
    burst; the other steps' rate leaves their calls out. Failed results and steps started
    outside the window are not in it."""
    rows = [_timed("L1_T001", 0, 1), _timed("L3_T010", 30, 3), _timed("L3_T046", 38, 2),
            _timed("L2_T001", 45, 0), _timed("L2_T002", 50, 1), _timed("L2_T003", 31, 9, status="incorrect")]
    burst = stagetimes.stall_burst(rows)
    assert burst["tids"] == ["L3_T010", "L3_T046"] and burst["stalled_calls"] == 5
    assert burst["all_stalled_calls"] == 7
    assert burst["rest_per_1000"] == pytest.approx(1000 * 2 / 60)  # 3 other steps x 20 calls
    line = stagetimes.describe_stall_burst(burst)
    assert "5 of 7, in 2 steps started from 10:00:30 UTC over 8 s (L3_T010, L3_T046)" in line
    assert "the other steps 33.3 per 1000" in line
    two_modes = stagetimes.stall_burst([_timed("L1_T001", 0, 1), {**_timed("L1_T001", 2, 1), "mode": "cudnn"}])
    assert two_modes["tids"] == ["L1_T001", "L1_T001 cudnn"]
    one = stagetimes.describe_stall_burst(stagetimes.stall_burst([_timed("L1_T001", 0, 1)]))
    assert "1 of 1, in 1 step (L1_T001, started 10:00:00 UTC)" in one
    assert stagetimes.stall_burst([_timed("L1_T001", 0, 0)]) is None
    assert stagetimes.describe_stall_burst(None) is None


def test_stalls_by_where_a_task_worker_step_ran():
    """A task worker's first step, its later ones and one-shot jobs are rated apart; without
    task workers (older results) there is no line."""
    rows = [_timed("L1_T001", 0, 0, step=1), _timed("L1_T001", 5, 2, step=2), _timed("L1_T001", 9, 1, step=3),
            _timed("L1_T001", 12, 1), _timed("L1_T002", 14, 5, step=2, status="incorrect")]
    by = stagetimes.stalls_by_worker_step(rows)
    assert by == {"first": [1, 20, 0], "later": [2, 40, 3], "one-shot": [1, 20, 1]}
    line = stagetimes.describe_stalls_by_worker_step(by)
    assert line.endswith("a task worker's first step 0.0 (0 of 20, 1 steps); its later steps 75.0 (3 of 40, 2 steps); "
                         "one-shot jobs 50.0 (1 of 20, 1 steps)")
    assert stagetimes.describe_stalls_by_worker_step(stagetimes.stalls_by_worker_step(rows[3:4])) is None


def test_the_cpu_probe_line_sums_the_results_that_ran_it():
    """Only paper time results carrying host_timing.probe count; runs without it get no line."""
    def res(probe, causes=None, protocol="paper"):
        return {"kind": "time", "status": "ok", "protocol": protocol,
                "host_timing": {"stall_causes": causes or {}, **({"probe": probe} if probe else {})}}

    a = {"setting": "retime", "probes": 141, "median_us": 8.2, "max_us": 90.0, "slow": 3,
         "pairs_beside_slow": 4, "retimed": 4}
    b = {"setting": "retime", "probes": 59, "median_us": 9.1, "max_us": 12.0, "slow": 0,
         "pairs_beside_slow": 0, "retimed": 0}
    rows = [res(a, {"cpu_slow": 2, "host_slow": 1}), res(b), res(None, {"host_slow": 5}),
            res({**a, "slow": 99}, protocol="strict"), {"kind": "check"}]
    probe = stagetimes.cpu_probe(rows)
    assert probe == {"results": 2, "settings": ["retime"], "probes": 200, "median_us": 9.1, "slow": 3,
                     "pairs_beside_slow": 4, "retimed": 4, "cpu_slow": 2}
    line = stagetimes.describe_cpu_probe(probe)
    assert line.startswith("CPU probe (L1BENCH_HOST_PROBE=retime) in 2 results: 200 probes")
    assert "3 slow (15.0 per 1000); 4 pairs beside a slow one, 4 of them timed again" in line
    assert stagetimes.cpu_probe([res(None)]) is None and stagetimes.describe_cpu_probe(None) is None


def test_kept_stalls_count_the_listed_calls_left_in_the_scores_and_their_episodes():
    cols = ["trial", "pair", "side", "event_ms", "retimed", "stall_cause", "launch_wall_us", "run_us", "wait_us",
            "lost_us", "nvcsw", "nivcsw"]

    def res(rows, status="ok"):
        return {"kind": "time", "status": status, "protocol": "paper",
                "host_timing": {"columns": cols, "calls_listed": [[*r, 0, 0, 0, 0, 0, 0] for r in rows]}}

    rows = [
        res([[4, 4, "ref", 5.5, 0, "host_slow"], [4, 4, "custom", 4.9, 0, "host_slow"],  # one pair, both sides
             [4, 6, "ref", 1.8, 0, "host_slow"], [4, 7, "ref", 1.8, 0, "driver_blocked"],  # neighbours
             [2, 3, "custom", 7.4, 0, "host_slow"],  # alone
             [1, 2, "ref", 3.0, 1, "host_lost"],  # retimed: not in the score
             [1, 5, "ref", 0.1, 0, "-"]]),  # disturbed, not stalled
        res([[0, 0, "ref", 9.0, 0, "gpu"]], status="incorrect"),  # not an ok result
        {"kind": "check"},
    ]
    kept = stagetimes.kept_stalls(rows)
    assert kept == {"calls": 5, "causes": {"host_slow": 4, "driver_blocked": 1}, "in_episodes": 4}
    line = stagetimes.describe_kept_stalls(kept)
    assert line == ("stalled calls left in the scores, as the host clock saw them: 5 (host_slow 4, driver_blocked 1); "
                    "4 of them beside another stalled call of their trial (the same or the next pair)")
    assert stagetimes.kept_stalls([res([[1, 2, "ref", 3.0, 1, "host_lost"]])]) is None


def test_the_host_bound_line_counts_the_ok_paper_results_that_record_launches():
    def res(custom_us, ref_us=10, status="ok", protocol="paper"):
        return {"kind": "time", "status": status, "protocol": protocol, "ref_ms": [[1.0]], "custom_ms": [[0.1]],
                "host_timing": {"launch_median_us": {"ref": ref_us, "custom": custom_us}}}

    rows = [res(90), res(90, ref_us=900), res(5), res(5, ref_us=950), res(90, status="incorrect"),
            res(90, protocol="strict"), {"kind": "time", "status": "ok", "protocol": "paper"}, {"kind": "check"}]
    hb = stagetimes.host_bound(rows)
    assert hb == {"known": 4, "custom": 1, "both": 1, "neither": 1, "ref": 1}
    assert stagetimes.describe_host_bound(hb).endswith(
        "median timed call): 3 of 4 (reference only 1, custom only 1, both 1); their scores move with the host's speed")
    assert stagetimes.host_bound(rows[6:]) is None and stagetimes.describe_host_bound(None) is None


def test_stall_rate_counts_paper_timings_only():
    params = {"outer_trials": 7, "early_stop_below": 0.3}
    fast = [0.030, 0.031, 0.029, 0.030, 0.030]

    def paper(custom_ms):
        ref_ms = [list(fast)] * 7
        trials = [sum(r) / len(r) / (sum(c) / len(c)) for r, c in zip(ref_ms, custom_ms, strict=False)]
        return {"kind": "time", "protocol": "paper", "mode": "default", "status": "ok", "params": params,
                "score": sum(trials) / len(trials), "ref_ms": ref_ms, "custom_ms": custom_ms}

    stalled = paper([[0.015, 4.2, 0.015, 0.015, 0.015]] + [[0.015] * 5] * 6)
    quiet = paper([[0.015] * 5] * 7)
    rate = stagetimes.stall_rate([stalled, quiet, stalled | {"protocol": "strict"}, {"status": "incorrect"}])
    assert rate == {"results": 2, "timed_calls": 140, "stalled_calls": 1, "flagged": 1}
    assert stagetimes.per_1000(rate) == pytest.approx(1000 / 140)


def test_bound_labels():
    assert [stagetimes.bound_label(s) for s in ([], ["ref"], ["custom"], ["ref", "custom"])] == [
        "neither", "ref", "custom", "both"]
