"""The plan of one run: the config, its results tree, the release on disk and the task
selection, bound once (rules/common.smk makes it, ``PLAN``), and every path, input, parameter,
priority and resource the rules are made of. Each answer applies a function of
:mod:`l1bench.plan` (tested there with explicit arguments) to this run; the methods that take
``wildcards`` are the rules' callables (priority, threads, resources, params). Nothing here
imports Snakemake (tests/test_runplan.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from l1bench import attempts, fetch, plan, preflight, staleness, tables_inputs
from l1bench import release as rel
from l1bench.io import logs_dir
from l1bench.results import STAGE


class RunPlan:
    """``config``: the validated config; ``gpu_slots``: Snakemake's global ``gpu`` resource
    (None without a bound). Loads the release if it is on disk (checksums verified); a bad
    ``release_dir``, release file, selection or slice report raises PlanError, ReleaseError
    or FetchError (one line)."""

    def __init__(self, config: Mapping, gpu_slots=None):
        self.config = config
        self.device = config["device"]
        self.results = f"{config['results_dir']}/{self.device}"
        if problem := preflight.results_dir_problem(config["results_dir"], self.results):
            raise plan.PlanError(problem)
        # job logs: logs/<device> for results/<device>, a folder of their own for other trees
        self.logs = logs_dir(self.results)
        self.is_demo = self.device == "demo"
        self.backend = "cpu" if self.is_demo else "cuda"
        self.protocols = plan.protocols(config["protocol"])
        self.modes = plan.modes(config["modes"])
        self.strict_modes = plan.strict_modes(self.modes, config["strict"]["modes"])
        self.release_path = plan.release_path(self.device)
        self.release = self._load_release()  # the parsed release on disk, else None
        ids = plan.task_index(self.release)
        self.all_tids = [rel.task_id(lv, tk) for lv, tk in ids]
        self.tids = plan.selected_tids(ids, config["levels"], config["tasks"])
        self.no_code_tids = plan.no_code_tids(self.release)
        self.extension_build_tids = plan.extension_build_tids(self.release)
        self.slice_reports = plan.slice_reports(config["slice_reports"])
        #: the run's GPU job slots, which every job reads (attempts.GPU_SLOTS_ENV, set at onstart)
        self.gpu_slots_total = plan.resource_value(gpu_slots)
        # cores a check or time job takes (none on a GPU, where `gpu` sets how many are in flight)
        self.evaluation_threads = plan.evaluation_threads(self.is_demo)
        self.tables_record = f"{self.results}/{tables_inputs.RECORD}"
        # the cross-release page (rule transfer_report, l1bench.aggregate.transfer)
        self.transfer_outputs = [f"{config['results_dir']}/{page}" for page in ("transfer.md", "figures/transfer.png")]
        # what identifies the release content: a param of every evaluation job
        self.fingerprint = (fetch.sha256_file(self.release_inputs()["release"]) if self.is_demo
                            else self.expected_sha256(self.release_path))

    # ---------------------------------------------------------------- the release

    def release_inputs(self) -> dict[str, str]:
        root = plan.release_root(self.is_demo, self.config["release_dir"], self.config["upstream"]["commit"])
        return plan.release_inputs(root, self.device, self.is_demo)

    def expected_sha256(self, path: str) -> str | None:
        return plan.expected_sha256(path, self.is_demo, self.config["release_sha256"])

    def release_checksums(self) -> dict[str, str | None]:
        """{release file key: its expected sha256} (the split's params)."""
        paths = {"release": self.release_path, **plan.BASELINE_PATHS}
        return {key: self.expected_sha256(path) for key, path in paths.items()}

    def _load_release(self):
        if self.config["release_dir"]:  # not a release, whatever is on disk: one line
            problem = preflight.release_dir_problem(self.config["release_dir"], self.release_path)
            if problem:
                raise plan.PlanError(problem)
        tasks = plan.load_release_files(self.release_inputs(), self.release_checksums())
        if tasks is not None and not self.is_demo:
            subset = self.config["levels"] != [1, 2, 3] or bool(self.config["tasks"])
            staleness.check_release_complete(tasks, self.release_inputs()["release"], subset)
        return tasks

    # ---------------------------------------------------------------- paths

    def task_paths(self, kind: str, protocols=None, modes=None, tids=None) -> list[str]:
        """plan.task_paths of the selected tasks (``tids``, ``protocols``, ``modes``: others)."""
        return plan.task_paths(self.results, kind, self.tids if tids is None else tids,
                               protocols or self.protocols, self.modes, self.strict_modes, modes)

    def evaluation_results(self) -> list[str]:
        """The build, check and time results of the selection."""
        return [p for kind in STAGE for p in self.task_paths(kind)]

    def result_path(self, kind: str, wildcards) -> str:
        """The result a build, check or time job makes."""
        w = dict(wildcards.items())
        if kind == "time":
            return f"{self.results}/time/{w['protocol']}/{w['mode']}/{w['tid']}.json"
        return f"{self.results}/{kind}/{w['tid']}.json"

    def aggregate_inputs(self) -> dict[str, list[str]]:
        """plan.aggregate_inputs of this run: the selection's results and the device's others."""
        return plan.aggregate_inputs(self.results, self.device, self.tids, self.all_tids, self.task_paths("check"),
                                     self.task_paths("time"), self.config["aggregate_only"])

    def report_outputs(self, slices: bool = True) -> list[str]:
        return plan.report_outputs(self.results, self.slice_reports if slices else [])

    def transfer_inputs(self) -> list[str]:
        """The scores.csv of each GPU release's tree: those on disk, and this run's."""
        trees = [f"{self.config['results_dir']}/{r}/scores.csv" for r in rel.GPU_DEVICES]
        return [p for p in trees if p == f"{self.results}/scores.csv" or os.path.exists(p)]

    def all_targets(self) -> list[str]:
        """Every result of the selection, the report, and the cross-release page once two or more
        release trees exist."""
        transfer = self.transfer_outputs if len(self.transfer_inputs()) >= 2 else []
        return plan.all_targets(self.task_paths("check"), self.task_paths("time"),
                                self.report_outputs() + transfer, self.config["aggregate_only"])

    def aggregate_params(self) -> dict:
        """The values the tables are made with: aggregate_results' params, the keywords of
        l1bench.aggregate.tables.make_tables."""
        c = self.config
        return {"device": self.device, "ceiling": c["detectors"]["speedup_ceiling"], "slices": list(self.slice_reports),
                "tolerances": c["tolerances"], "paper_tolerance": [c["paper"]["atol"], c["paper"]["rtol"]]}

    def table_params(self) -> dict:
        """The parameters the tables record (tables_inputs.table_params of :meth:`aggregate_params`)."""
        p = self.aggregate_params()
        return tables_inputs.table_params(p["device"], p["ceiling"], p["tolerances"])

    # ---------------------------------------------------------------- the evaluation jobs

    def timeout(self, kind: str) -> int:
        return plan.timeout(self.config["timeouts"], kind, self.is_demo)

    def evaluation_params(self, kind: str) -> dict:
        return plan.evaluation_params(kind, self.fingerprint, self.config)

    def job_settings(self, kind: str, protocol: str | None = None) -> dict:
        return plan.job_settings(kind, protocol, self.config)

    def ext_dir(self, wildcards) -> str:
        """Where a task's extensions are built (not committed)."""
        return f"{self.results}/build/ext/{wildcards.tid}"

    def build_priority(self, wildcards) -> int:
        return plan.build_priority(wildcards.tid)

    def check_priority(self, wildcards) -> int:
        return plan.check_priority(wildcards.tid, self.modes)

    def time_priority(self, wildcards) -> int:
        return plan.time_priority(wildcards.protocol, wildcards.mode, wildcards.tid)

    def build_slots(self, wildcards) -> int:
        return plan.build_slots(wildcards.tid, self.extension_build_tids)

    def build_threads(self, wildcards) -> int:
        return plan.build_threads(wildcards.tid, self.extension_build_tids, self.is_demo)

    def compile_slots(self, wildcards) -> int:
        return plan.compile_slots(wildcards.mode)

    def strict_params(self, wildcards) -> dict | None:
        return plan.strict_params(wildcards.protocol, self.config["strict"])

    def gpu_slots(self, wildcards) -> int:
        """plan.gpu_slots of a check or time job: every slot once an attempt ran out of GPU memory
        beside other jobs (its attempts ledger)."""
        out = self.result_path("time" if "mode" in dict(wildcards.items()) else "check", wildcards)
        return plan.gpu_slots(attempts.load(attempts.ledger_path(self.results, out)), self.gpu_slots_total)
