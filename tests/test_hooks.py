"""The run hooks (l1bench.hooks): the GPU guard's jobs, the run's nothing-to-do line, and the one
private attribute of Snakemake they read, held against the installed Snakemake."""

from pathlib import Path
from types import SimpleNamespace

from snakemake.persistence.file import FilePersistence

from l1bench import hooks


def touch(path, text="{}\n"):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_the_lock_files_are_those_snakemake_holds(tmp_path):
    """hooks.snakemake_lock_files reads Snakemake's file persistence where it keeps its lock files
    (``_lockfile``): when a Snakemake release moves them, this fails (the recovery after a killed
    run would release no lock)."""
    job = SimpleNamespace(input=[str(tmp_path / "in.txt")], output=[str(tmp_path / "out.txt")])
    settings = SimpleNamespace(dag_settings=SimpleNamespace(max_checksum_file_size=0))
    dag = SimpleNamespace(jobs=[job], needrun_jobs=lambda: [job], workflow=settings)
    persistence = FilePersistence(dag=dag, path=tmp_path / ".snakemake")
    workflow = SimpleNamespace(persistence=persistence)
    with persistence.lock():
        held = hooks.snakemake_lock_files(workflow)
        on_disk = sorted(str(p) for p in (tmp_path / ".snakemake/locks").glob("*.lock"))
        assert len(on_disk) == 2 and sorted(held) == on_disk
    assert hooks.snakemake_lock_files(workflow) == []


def test_the_gpu_guard_asks_about_the_planned_check_and_time_jobs(tmp_path):
    done = touch(tmp_path / "time/paper/default/L1_T001.json")
    scan = touch(tmp_path / "reference_scan.json")
    report = touch(tmp_path / "README.md")
    todo = str(tmp_path / "check/L1_T002.json")
    planned = [
        ("time_task", [done]),
        ("check_task", [todo]),
        ("scan_references", [scan]),
        ("aggregate_results", [report]),
        ("split_release", [str(tmp_path / "tasks/L1_T001/meta.json")]),
    ]
    outputs, pending = hooks.gpu_job_outputs(iter(planned))
    assert outputs == [done, todo]
    assert pending == {done, todo, scan, report, str(tmp_path / "tasks/L1_T001/meta.json")}


class Dag(list):
    """Snakemake's DAG as the nothing-to-do line asks it: its length, its target jobs."""

    def __init__(self, jobs, targets):
        super().__init__(jobs)
        self.targetjobs = targets


def nothing_to_do(tmp_path, capsys, dag, aggregate_only=False, main=True):
    res = str(tmp_path / "results/demo")
    check = touch(f"{res}/check/L1_T001.json", '{"provenance": {"gpu": "H100", "finished": "2026-12-03T10:00"}}')
    time = touch(f"{res}/time/paper/default/L1_T001.json", '{"provenance": {"finished": "2026-12-04T10:00"}}')
    run = SimpleNamespace(results=res, device="demo", config={"aggregate_only": aggregate_only},
                          aggregate_inputs=lambda: {"check": [check], "time": [time]})
    from l1bench.staleness import Judge

    reruns = SimpleNamespace(judge=Judge(res, None, None, lambda *a: {}))
    hooks.RunHooks(SimpleNamespace(dag=dag, is_main_process=main), run, reruns).nothing_to_do()
    return capsys.readouterr().err


def test_a_run_with_nothing_to_do_says_so_with_the_gpu_and_dates(tmp_path, capsys):
    target = SimpleNamespace(input=[touch(tmp_path / "results/demo/README.md")])
    line = nothing_to_do(tmp_path, capsys, Dag([], [target]))
    assert line.startswith(f"Nothing to do: the tables in {tmp_path}/results/demo are current with its results ")
    assert "(measured on H100, 2026-12-03 to 2026-12-04)" in line and "results_dir=results/mine" in line
    # not when there were jobs, no DAG (a dry run's error), a table rebuild, a job's own process
    assert nothing_to_do(tmp_path, capsys, Dag(["a job"], [target])) == ""
    assert nothing_to_do(tmp_path, capsys, None) == ""
    assert nothing_to_do(tmp_path, capsys, Dag([], [target]), aggregate_only=True) == ""
    assert nothing_to_do(tmp_path, capsys, Dag([], [target]), main=False) == ""
    # a target whose input is missing: the DAG was not built, not found complete
    missing = SimpleNamespace(input=[str(tmp_path / "nope")])
    assert nothing_to_do(tmp_path, capsys, Dag([], [missing])) == ""
