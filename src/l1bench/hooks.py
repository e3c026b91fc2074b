"""The run hooks: what the workflow does around its jobs. The Snakefile makes them once
(:func:`install`) and calls them from ``onstart``, ``onsuccess`` and ``onerror``:

* when the workflow is parsed, before Snakemake plans (not in a dry run): keep the results that
  jobs of a killed run completed, and release its locks (:mod:`l1bench.recovery`);
* ``onstart`` (:meth:`RunHooks.start`): stop before any job when a GPU job needs a GPU and none
  is visible; export what every job reads; keep the workflow off the GPUs' timing CPUs; record
  the locks it holds; note stop signals; progress lines (:mod:`l1bench.progress`);
* ``onsuccess``, ``onerror``: the run's last line (:mod:`l1bench.lastline`,
  :func:`l1bench.preflight.failure_hint`); the run's stale markers are spent;
* at exit, when the run found nothing to do: one line saying so, and how to measure afresh.

``workflow`` is Snakemake's; everything asked of it is public API but the lock files it holds
(:func:`snakemake_lock_files`, the one place that reads a private attribute).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from l1bench import attempts, lastline, lifeline, preflight, progress, recovery
from l1bench.results import STAGES


def snakemake_lock_files(workflow) -> list[str]:
    """The lock files (``.snakemake/locks/``) this Snakemake process holds. Snakemake's file
    persistence keeps them in ``_lockfile`` ({"input"/"output": path}) and offers no public way
    to ask (Snakemake 9); tests/test_hooks.py fails when an installed Snakemake changes that."""
    return list((getattr(workflow.persistence, "_lockfile", None) or {}).values())


def gpu_available() -> bool:
    """True when the local torch sees a CUDA device (checked in a child: no CUDA in this process)."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def gpu_job_outputs(planned: Iterable[tuple[str, list[str]]]) -> tuple[list[str], set[str]]:
    """(outputs of the planned check and time jobs, every planned output) of ``planned``
    ([(rule, outputs)]): what the GPU guard asks preflight.gpu_jobs about."""
    planned = list(planned)
    pending = {out for _, outs in planned for out in outs}
    gpu_rules = {s.rule for s in STAGES if s.gpu}
    outputs = [out for rule, outs in planned if rule in gpu_rules for out in outs]
    return outputs, pending


def install(workflow, run, reruns) -> RunHooks:
    """The hooks of this run (``run``: its :class:`l1bench.runplan.RunPlan`; ``reruns``: its
    :class:`l1bench.staleness.Reruns`), a killed run recovered from, and the nothing-to-do line
    registered for the exit."""
    hooks = RunHooks(workflow, run, reruns)
    hooks.recover_from_a_killed_run()
    atexit.register(hooks.nothing_to_do)
    return hooks


class RunHooks:
    """The hooks of one run: ``workflow`` is Snakemake's, ``run`` the run's plan, ``reruns`` what
    reruns in it; what onstart learns (the planned jobs, the progress printer) serves its end."""

    def __init__(self, workflow, run, reruns):
        self.workflow, self.run, self.reruns = workflow, run, reruns
        self.planned: list[tuple[str, list[str]]] = []  # (rule, outputs) of each job the run executes
        self.progress: progress.Progress | None = None

    def _gpus_are_local(self) -> bool:
        return preflight.gpus_are_local(self.workflow.local_exec, self.run.is_demo, self.run.config["aggregate_only"])

    def recover_from_a_killed_run(self) -> None:
        """Before a run (not a dry run) plans its jobs: keep the results that jobs of a killed run
        completed, and release that run's locks, so the next run neither redoes them nor needs
        --unlock. It writes only inside .snakemake/, and only after a killed run: Snakemake reads
        both before onstart."""
        if not self.workflow.is_main_process or self.workflow.output_settings.dryrun:
            return
        kept = recovery.keep_completed_results(self.run.results)
        if kept:
            print(f"kept {len(kept)} result(s) that jobs of an interrupted run completed after its Snakemake "
                  f"process stopped recording them ({kept[0]}{', ...' * (len(kept) > 1)})", file=sys.stderr)
        for owner in recovery.release_locks_of_dead_runs():
            pid = owner["token"].split(":")[0]
            print(f"released the locks of a run that was killed (pid {pid})", file=sys.stderr)

    def start(self) -> None:
        """onstart (not in a dry run, which plans everything): the guards, then the bookkeeping
        that lets the next run recover if this one is killed."""
        jobs = list(self.workflow.dag.needrun_jobs())
        self.planned = [(job.rule.name, [str(f) for f in job.output]) for job in jobs]
        self.require_gpu_if_needed()
        lifeline.mark_workflow()  # every job stops when this process is gone (l1bench.lifeline)
        if self.run.gpu_slots_total is not None:  # a job that took fewer shared the GPU
            os.environ[attempts.GPU_SLOTS_ENV] = str(self.run.gpu_slots_total)
        self.reserve_timing_cpus()
        recovery.record_lock_owner(snakemake_lock_files(self.workflow))
        preflight.note_stop_signals()
        self.progress = progress.start([(job.jobid, job.rule.name) for job in jobs])

    def require_gpu_if_needed(self) -> None:
        """Stop before any job (downloads included) when a check/time job this run would execute
        needs a GPU and none is visible: one line. Results decided without a GPU (no code, a
        negative earlier stage, max_attempts reached: l1bench.results.no_worker_needed, as
        scripts/run_task.py and the worker decide) still run on a CPU-only machine. A cluster
        executor's jobs find their GPUs on the nodes it sends them to: no guard here."""
        if not self._gpus_are_local():
            return
        outputs, pending = gpu_job_outputs(self.planned)
        run = self.run
        needed = preflight.gpu_jobs(outputs, run.results, run.no_code_tids, run.config["max_attempts"], pending)
        if needed and not gpu_available():
            print(preflight.no_gpu_message(run.device, needed), file=sys.stderr)
            sys.exit(1)

    def reserve_timing_cpus(self) -> list[int]:
        """Keep this Snakemake process, and so every job it starts, off the GPUs' timing CPUs
        (gpulock.keep_workflow_off_timing_cpus): only a lock holder's timing thread runs there.
        Only where the jobs run on this host (not for a cluster executor, whose jobs time on
        other nodes), and not for the CPU demo or a table rebuild, which time nothing on a GPU."""
        if not self._gpus_are_local():
            return []
        from l1bench.gpu import gpulock

        timing = gpulock.keep_workflow_off_timing_cpus(gpulock.visible_gpu_count())
        if timing:
            print(f"timing CPUs {timing} reserved for the GPU lock holders; the workflow runs on the others",
                  file=sys.stderr)
        return timing

    def succeeded(self) -> None:
        """onsuccess: the run's one line: what was measured, where the tables are, what broke and
        how to retry it."""
        progress.stop(self.progress)
        made = lastline.made_results(self.planned)
        run = self.run
        line = lastline.success_line(run.device, run.results, run.logs, run.evaluation_results(), made,
                                    run.config["results_dir"])
        print(line, file=sys.stderr)
        self.reruns.clear_markers()

    def failed(self, logs) -> None:
        """onerror: what failed and why (or which signal stopped the run), and how to go on.
        ``logs``: Snakemake's log files."""
        self.reruns.clear_markers()
        progress.stop(self.progress)
        texts = []
        for path in logs or []:
            try:
                texts.append(Path(path).read_text(errors="replace"))
            except OSError:
                pass
        run = self.run
        hint = preflight.failure_hint(
            run.device, preflight.failed_jobs(texts), preflight.STOPPED_BY[0] if preflight.STOPPED_BY else None,
            run.config["max_attempts"], logs=run.logs, disk=preflight.disk_full_note(run.results),
        )
        print(f"\n{hint}", file=sys.stderr)

    def nothing_to_do(self) -> None:
        """At exit, when the run found nothing to do: one line saying the tables are current, from
        which GPU and dates, and how to measure afresh."""
        dag, run = self.workflow.dag, self.run
        if not self.workflow.is_main_process or dag is None or len(dag) != 0:
            return
        if not dag.targetjobs or run.config["aggregate_only"]:
            return
        if not all(Path(f).exists() for job in dag.targetjobs for f in job.input):
            return  # the DAG was not built (an error), not found complete
        lists = run.aggregate_inputs()
        gpu, first, last = self.reruns.judge.provenance(lists["check"] + lists["time"])
        when = f", {first}" + (f" to {last}" if last != first else "") if first else ""
        print(f"Nothing to do: the tables in {run.results} are current with its results (measured on "
              f"{gpu or 'the CPU'}{when}); to measure afresh: snakemake --cores 1 --config device={run.device} "
              "results_dir=results/mine", file=sys.stderr)
