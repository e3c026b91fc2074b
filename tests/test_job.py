"""l1bench.job, the job of build/check/time (scripts/run_task.py passes it the rule's values)."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from l1bench import job as job_mod
from l1bench import lifeline, release, split
from l1bench.job import JobSpec

ROOT = Path(__file__).resolve().parents[1]

DEMO = ROOT / "config/demo/optimized_cuda_code/demo.json"
PAPER = dict(seed=42, correctness_trials=1, atol=1e-2, rtol=1e-2, warmup=1, outer_trials=1, inner_trials=1,
             early_stop_below=None)


def job_spec(work, kind, tid, backend="cpu", **values) -> JobSpec:
    """A build or check job of the demo release split below ``work`` (its rule's values)."""
    res = work / "results/demo"
    protocol = {"release": "x", "paper": dict(PAPER)}
    if kind == "build":
        protocol["build"] = {"max_jobs": 1, "cuda_arch_list": ""}
    return JobSpec(
        rule=f"{kind}_task", kind=kind, tid=tid, output=f"{res}/{kind}/{tid}.json", log=str(work / f"{kind}.log"),
        results=res, backend=backend, protocol_params=protocol, ext_dir=str(res / "build/ext" / tid), timeout=60,
        max_attempts=3, upstream=str(work / "build.json") if kind == "check" else None,
        section_timeout=30 if kind != "build" else None, **values,
    )


@pytest.fixture
def work(tmp_path):
    tasks = release.load_release(DEMO)
    split.split_release(tasks, tmp_path / "results/demo/tasks", "demo", {"path": "demo", "sha256": "x"})
    (tmp_path / "build.json").write_text(json.dumps({"kind": "build", "status": "ok", "reason": ""}))
    return tmp_path


def test_cpu_locks_belong_to_the_results_directory(work, tmp_path_factory, monkeypatch):
    """The demo's (CPU) lock lies in its results directory, not machine-wide: runs of other
    clones, and the tests, never wait for each other. GPU locks stay machine-wide."""
    machine_wide = tmp_path_factory.mktemp("machine-wide-locks")
    monkeypatch.setenv("L1BENCH_LOCK_DIR", str(machine_wide))
    monkeypatch.delenv(lifeline.WORKFLOW_ENV, raising=False)
    spec = job_spec(work, "check", "L1_T001")
    assert job_mod.worker_job(spec)["lock_dir"] == str(work / "results/demo/tmp")
    assert "lock_dir" not in job_mod.worker_job(job_spec(work, "check", "L1_T001", backend="cuda"))
    job_mod.main(spec)
    assert json.loads(Path(spec.output).read_text())["status"] == "pass"
    assert (work / "results/demo/tmp/l1bench-cpu.lock").exists()
    assert not list(machine_wide.iterdir())


def test_the_task_folder_is_found_by_its_place(work):
    """A job whose result exists takes no meta.json input while the release is still to be
    split (common.smk): the task folder comes from the results directory."""
    got = job_mod.worker_job(job_spec(work, "check", "L1_T001"))
    assert got["task_dir"] == str(work / "results/demo/tasks/L1_T001")


def test_the_script_passes_the_rules_values(work):
    """scripts/run_task.py is an adapter: it reads the rule's values into a JobSpec and calls
    l1bench.job.main; the values a time job's worker gets are the rule's."""
    text = (ROOT / "scripts/run_task.py").read_text()
    assert len(text.splitlines()) <= 60 and "from l1bench.job import JobSpec, main" in text
    spec = job_spec(work, "check", "L1_T001")
    timed = dataclasses.replace(spec, kind="time", rule="time_task", mode="cuda_graph", protocol="strict",
                                strict={"l2_flush": True}, upstream="check.json")
    got = job_mod.worker_job(timed)
    assert (got["mode"], got["protocol"], got["strict"], got["check_result"]) == (
        "cuda_graph", "strict", {"l2_flush": True}, "check.json")
    assert got["params"] == PAPER and "detectors" not in got


def test_a_stopped_job_is_not_an_attempt(work, monkeypatch):
    """Its Snakemake process is gone: the job ends without a result and without a ledger entry
    (attempts count only what broke by itself); its task worker, which ends with the workflow, is
    not read as "died during the step"."""
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv(lifeline.WORKFLOW_ENV, f"{gone.pid}:0")  # no such process (any more)
    spec = job_spec(work, "check", "L1_T005")  # hangs: only the stop ends it
    with pytest.raises(SystemExit, match="stopped"):
        job_mod.main(spec)
    assert not Path(spec.output).exists()
    assert not (work / "results/demo/attempts/check/L1_T005.json").exists()
    assert "not counted as an attempt" in Path(spec.log).read_text()


def test_out_of_memory_beside_other_jobs_is_marked_in_the_ledger(work, monkeypatch):
    """A job that ran out of GPU memory while it held 1 of the run's 32 GPU slots records so in
    its ledger and is not counted (the retry takes the GPU alone: plan.gpu_slots); the same
    failure with every slot counts. Only this attempt's log lines are read (an earlier
    attempt's out-of-memory line in the appended log does not mark a later crash)."""
    from l1bench import attempts
    from l1bench.pool.runner import JobFailed

    spec = job_spec(work, "check", "L1_T005", gpu_slots=1)
    ledger = work / "results/demo/attempts/check/L1_T005.json"
    oom = "l1bench worker: infrastructure failure: warm-up: OutOfMemoryError: CUDA out of memory.\n"

    def broken(text):
        def run_in_worker(spec_, job):
            with open(spec_.log, "a") as fh:
                fh.write(text)
            raise JobFailed("L1_T005: infrastructure failure (CUDA fault or out of memory), see log", "infra")
        return run_in_worker

    monkeypatch.setenv(attempts.GPU_SLOTS_ENV, "32")
    monkeypatch.setattr(job_mod, "run_in_worker", broken(oom))
    for _ in range(3):
        with pytest.raises(SystemExit):
            job_mod.main(spec)
    got = attempts.load(ledger)
    assert [a["gpu_shared"] for a in got] == [True] * 3 and all(a["out_of_memory"] for a in got)
    assert not Path(spec.output).exists()  # 3 attempts, none counted: no terminal result
    assert "not counted, the retry takes the GPU alone" in Path(spec.log).read_text()
    monkeypatch.setattr(job_mod, "run_in_worker", broken("Segmentation fault\n"))
    with pytest.raises(SystemExit):
        job_mod.main(spec)
    assert "out_of_memory" not in attempts.load(ledger)[-1]  # the earlier attempts' lines not read
    spec = dataclasses.replace(spec, gpu_slots=32)
    monkeypatch.setattr(job_mod, "run_in_worker", broken(oom))
    for _ in range(2):
        try:
            job_mod.main(spec)
        except SystemExit:
            pass
    res = json.loads(Path(spec.output).read_text())
    assert res["status"] == "crashed" and len(res["failed_attempts"]) == 6
    assert res["failed_attempts"][-1]["gpu_shared"] is False


def test_the_workflow_gives_a_job_that_ran_out_beside_others_every_gpu_slot(tmp_path):
    """Snakemake asks plan.gpu_slots through the rule's `gpu` resource: a time job whose ledger
    holds an out-of-memory attempt beside other jobs takes all 6 slots of `--resources gpu=6`,
    the others 1 (dry run of the demo release)."""
    from helpers import SNAKEMAKE, copy_workflow, run

    from l1bench import attempts

    copy_workflow(tmp_path)
    out = "results/demo/time/paper/default/L1_T001.json"
    attempts.record(attempts.ledger_path(tmp_path / "results/demo", tmp_path / out), "L1_T001: infrastructure failure",
                    "infra", out_of_memory=True, gpu_shared=True, gpu_slots=1)
    proc = run(SNAKEMAKE + ["-n", "--cores", "1", "--resources", "gpu=6", "--config", "device=demo"], tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-2000:]
    blocks = {b.split("output: ")[1].split("\n")[0]: b for b in text.split("rule ")[1:] if "output: " in b}
    assert "gpu=6" in blocks[out]
    assert "gpu=1" in blocks["results/demo/time/paper/default/L1_T002.json"]


def test_a_job_that_takes_every_gpu_slot_asks_the_idle_workers_to_leave(work, monkeypatch):
    """run_in_worker: with every one of the run's several GPU slots the job runs inside gpu_alone (the
    request file exists while its worker runs, and is gone after); with one slot, or where the
    run's slots are unknown, no request is made."""
    from l1bench import attempts
    from l1bench.pool import client, idle

    spec = job_spec(work, "check", "L1_T005")
    alone = work / "results/demo/tmp/task-workers" / idle.ALONE_FILE
    seen = []
    monkeypatch.setattr(client, "run_in_task_worker",
                        lambda *a, **k: seen.append(alone.exists()) or {"status": "pass"})
    monkeypatch.setattr(client, "ALONE_SETTLE_S", 0.0)
    job = job_mod.worker_job(spec)
    for slots, run_slots, want in ((32, "32", True), (1, "32", False), (1, "1", False), (32, None, False)):
        if run_slots is None:
            monkeypatch.delenv(attempts.GPU_SLOTS_ENV, raising=False)
        else:
            monkeypatch.setenv(attempts.GPU_SLOTS_ENV, run_slots)
        assert job_mod.run_in_worker(dataclasses.replace(spec, gpu_slots=slots), job) == {"status": "pass"}
        assert seen[-1] is want, (slots, run_slots)
        assert not alone.exists()
    assert attempts.takes_every_slot(32, "32") and not attempts.takes_every_slot(31, 32)
    assert not attempts.takes_every_slot(1, 1) and not attempts.takes_every_slot("x", 32)


@pytest.mark.slow
def test_out_of_memory_beside_others_is_retried_with_the_gpu_alone_in_the_same_run(tmp_path):
    """End to end, on the demo's CPU backend: L1_T002's model raises torch's out-of-memory
    error unless a job has asked the idle task workers to leave (the gpu-alone file exists). Its
    check, 1 of `--resources gpu=2`, fails so; the run's own retry (`--retries 1`) takes both
    slots, sends the idle workers away, and passes; the result keeps the uncounted attempt."""
    from helpers import SNAKEMAKE, copy_workflow, run

    from l1bench.pool import idle

    copy_workflow(tmp_path)
    demo = tmp_path / "config/demo/optimized_cuda_code/demo.json"
    alone = tmp_path / "results/demo/tmp/task-workers" / idle.ALONE_FILE
    lines = [json.loads(line) for line in demo.read_text().splitlines()]
    keep = [d for d in lines if d["level_id"] == 1 and d["task_id"] in (1, 2)]
    keep[1]["custom_code"] = keep[1]["custom_code"].replace(
        "        super().__init__()\n",
        "        super().__init__()\n"
        "        import pathlib\n"
        f"        if not pathlib.Path({str(alone)!r}).exists():\n"
        "            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n",
    )
    assert "OutOfMemoryError" in keep[1]["custom_code"]
    demo.write_text("".join(json.dumps(d) + "\n" for d in keep))
    res = tmp_path / "results/demo"
    targets = [f"results/demo/check/{tid}.json" for tid in ("L1_T001", "L1_T002")]
    proc = run(SNAKEMAKE + ["--cores", "2", "--resources", "gpu=2", "--retries", "1", "--config", "device=demo",
                            "--", *targets], tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    got = json.loads((res / "check/L1_T002.json").read_text())
    assert got["status"] == "pass", got
    [first] = got["failed_attempts"]
    assert first["out_of_memory"] and first["gpu_shared"] and first["gpu_slots"] == 1
    # the first attempt's log as Snakemake printed it (the retry's replaces the file)
    assert "out of GPU memory beside other jobs: not counted, the retry takes the GPU alone" in text
    assert "this job takes every GPU slot" in (tmp_path / "logs/demo/check_task/L1_T002.log").read_text()
    assert not alone.exists()
