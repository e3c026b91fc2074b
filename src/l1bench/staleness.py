"""Which existing results are stale: the one place the workflow decides what reruns.

Read-only (no Snakemake): every answer comes from what a result records (its
``snippet_sha256``, ``params``, ``settings``, kind/mode/protocol, timing version, and the
sha256 of the earlier stage's result it was made from) compared with what the config and the
release (parsed in memory) expect now. A missing result is not stale: Snakemake plans it
anyway. A stale result's job takes a ``mark_stale`` marker as input, so the job reruns in the
same run, and ``snakemake -n`` shows why (docs/rerun-policy.md).

* :class:`Reruns` — the facade the workflow uses (rules/common.smk, ``RERUNS``): the reason and
  marker of each stale *subject* (a result, the tables, the task folders), a job's inputs with
  its marker (:meth:`Reruns.with_marker`), every marker of the run, and whether the tables are
  made again.
* :class:`Judge` — ``reason(path)``: why a build/check/time result is stale (None: current);
  ``split_reason``: task folders that differ from the release; ``tables_reason``: why the
  tables are to be made again.
* :func:`check_release_complete` — a release that lacks tasks its levels promise.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path

from l1bench import fetch, split, tables_inputs
from l1bench import release as rel
from l1bench.results import STAGE, STAGES
from l1bench.snippet import sha256_text
from l1bench.timing import TIMING_VERSION

#: Build settings that change how fast a build runs, not what it builds.
BUILD_SPEED_KEYS = ("max_jobs",)

#: Rules whose jobs make results (the stages' and the reference scan's): forcing one makes the
#: results after it stale.
EVALUATION_RULES = tuple(s.rule for s in STAGES) + ("scan_references",)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snippet_hashes(task: rel.Task) -> dict[str, str]:
    """{snippet name: sha256} of a task's snippets, as results record them."""
    return {name: sha256_text(src) for name, src in task.snippets().items()}


def check_release_complete(tasks: Iterable[rel.Task], path: str, subset: bool) -> None:
    """ReleaseError (one line) when the release lacks tasks its levels promise or holds ids
    outside KernelBench's levels, unless the user selected a subset (``subset``)."""
    if subset:
        return
    ids = {(t.level, t.task) for t in tasks}
    outside = sorted(
        f"{lv}/{tk}" for lv, tk in ids if lv not in rel.KERNELBENCH_LEVELS or not 1 <= tk <= rel.KERNELBENCH_LEVELS[lv]
    )
    if outside:
        raise rel.ReleaseError(
            f"{path}: task ids outside KernelBench's levels: {', '.join(outside[:5])}"
            f"{' ...' if len(outside) > 5 else ''} (select the others with levels/tasks)"
        )
    levels = sorted({lv for lv, _ in ids})
    missing = [f"{lv}/{tk}" for lv in levels for tk in range(1, rel.KERNELBENCH_LEVELS[lv] + 1) if (lv, tk) not in ids]
    if missing:
        raise rel.ReleaseError(
            f"{path}: {len(missing)} task(s) missing from levels {levels}: {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''} (a truncated file? select a subset with levels/tasks to go on)"
        )


def build_params(build: Mapping) -> dict:
    """What a build result records as its params for config ``build``."""
    return dict(build) | {"seed": 42}


def _differs(recorded: Mapping | None, expected: Mapping | None, skip=()) -> list[str]:
    """Keys both record, and whose values differ (a key one side lacks is not compared)."""
    if not isinstance(recorded, Mapping) or not isinstance(expected, Mapping):
        return []
    return sorted(k for k in recorded.keys() & expected.keys() if k not in skip and recorded[k] != expected[k])


def own_problem(res: Mapping, expect: Mapping) -> str | None:
    """Why a result is stale by what it records itself, else None. ``expect``: kind, tid,
    protocol, mode, snippets ({name: sha256} or None: the release is not on disk),
    release (its sha256 or None), params, settings."""
    for key in ("kind", "tid", "protocol", "mode"):
        if expect.get(key) is not None and res.get(key) is not None and res[key] != expect[key]:
            return f"made as {key} {res[key]}, expected {expect[key]}"
    recorded = res.get("snippet_sha256")
    if expect.get("snippets") is not None and isinstance(recorded, Mapping):
        wanted = expect["snippets"]
        changed = sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))
        if changed:
            return f"task code changed in the release ({', '.join(changed)})"
    elif expect.get("release") and res.get("release_fingerprint") not in (None, expect["release"]):
        return "made from another release"
    if isinstance(res.get("params"), Mapping) and res["params"].get("inputs_on_device"):
        return "inputs drawn on the GPU (the paper protocol draws them on the host, as published)"
    skip = BUILD_SPEED_KEYS if expect.get("kind") == "build" else ()
    changed = _differs(res.get("params"), expect.get("params"), skip)
    if changed:
        return f"protocol parameters changed ({', '.join(changed)})"
    settings, wanted = res.get("settings"), expect.get("settings") or {}
    if isinstance(settings, Mapping):
        changed = [k for k in wanted if settings.get(k) != wanted[k]]
        if changed:
            return f"parameters changed ({', '.join(sorted(changed))})"
    for key in ("timing_version", "timing_design"):  # timing_design: older results
        if key in res and res[key] != TIMING_VERSION:
            return f"timed by timing version {res[key]}, current is {TIMING_VERSION}"
    return None


class Judge:
    """Decides, read-only, which results of one results root are stale (cached per path).

    ``res``: results/<device>; ``tasks``: {tid: {snippet: sha256}} of the release on disk, or
    None when it is not (then results are compared by ``release``, the expected release sha256);
    ``expected(kind, protocol, mode)``: {"params": ..., "settings": ...} of a job;
    ``forced``: a callable giving the rule names the user forces (their downstream results are
    stale), asked once the run's settings are known.
    """

    def __init__(self, res, tasks, release, expected, forced=lambda: ()):
        self.res = Path(res)
        self.tasks = tasks
        self.release = release
        self.expected = expected
        self._forced = forced
        self._reasons: dict[str, str | None] = {}
        self._read: dict[str, dict | None] = {}
        self._sha: dict[str, str | None] = {}

    @property
    def forced(self) -> set[str]:
        if callable(self._forced):
            self._forced = set(self._forced())
        return self._forced

    # ---------------------------------------------------------------- reading

    def read(self, path) -> dict | None:
        key = str(path)
        if key not in self._read:
            try:
                data = json.loads(Path(key).read_text())
                self._read[key] = data if isinstance(data, dict) else None
            except (OSError, ValueError):
                self._read[key] = None
        return self._read[key]

    def sha(self, path) -> str | None:
        key = str(path)
        if key not in self._sha:
            try:
                self._sha[key] = sha256_bytes(Path(key).read_bytes())
            except OSError:
                self._sha[key] = None
        return self._sha[key]

    @staticmethod
    def parse(path: Path, res: Path) -> tuple[str, str | None, str | None, str]:
        """(kind, protocol, mode, tid) of a result path."""
        parts = path.relative_to(res).parts
        tid = Path(parts[-1]).stem
        if parts[0] == "time":
            return "time", parts[1], parts[2], tid
        return parts[0], None, None, tid

    def upstream(self, path: Path) -> Path | None:
        kind, _, _, tid = self.parse(path, self.res)
        stage = STAGE[kind].upstream
        return self.res / stage / f"{tid}.json" if stage else None

    # ---------------------------------------------------------------- decisions

    def reason(self, path) -> str | None:
        """Why the existing result ``path`` is stale (one line), None when it is current or
        missing. Stale too when its earlier stage's result is stale, missing, forced, or
        another than the one it was made from."""
        path = Path(path)
        key = str(path)
        if key not in self._reasons:
            self._reasons[key] = self._reason(path)
        return self._reasons[key]

    def _reason(self, path: Path) -> str | None:
        res = self.read(path)
        if res is None:
            return None if not path.exists() else "unreadable"
        kind, protocol, mode, tid = self.parse(path, self.res)
        expect = {"kind": kind, "tid": tid, "protocol": protocol, "mode": mode, "release": self.release,
                  "snippets": None if self.tasks is None else self.tasks.get(tid, {})}
        expect |= self.expected(kind, protocol, mode)
        why = own_problem(res, expect)
        if why:
            return why
        up = self.upstream(path)
        if up is None:
            return None
        stage = up.parent.name
        if f"{stage}_task" in self.forced:
            return f"its {stage} is forced"
        if not up.exists():
            return f"its {stage} result is to be made"
        if self.reason(up):
            return f"its {stage} is stale ({self.reason(up)})"
        recorded = res.get("upstream_sha256")
        if recorded is not None and recorded != self.sha(up):
            return f"its {stage} result changed since"
        return None

    def split_reason(self, tasks_root, release_tasks) -> str | None:
        """Task folders on disk that differ from the release (edited by hand, split from
        another release), in one line; None when every existing folder matches. Missing
        folders are the split's missing outputs."""
        changed = []
        for task in release_tasks:
            folder = Path(tasks_root) / task.tid
            if not (folder / "meta.json").exists():
                continue
            for name, src in task.snippets().items():
                file = folder / rel.SNIPPET_FILES[name]
                if self.sha(file) != sha256_text(src):
                    changed.append(f"{task.tid}/{file.name}")
        if not changed:
            return None
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        verb = "differs" if len(changed) == 1 else "differ"
        return f"{', '.join(changed[:3])}{more} {verb} from the release: re-split from it"

    def tables_reason(self, outputs, results, record, digest) -> str | None:
        """Why the tables are to be made again, None when they are current. ``outputs``: the
        tables' files; ``results``: the evaluation results they read; ``record``: the
        tables' record; ``digest``: a callable giving the current inputs' digest (None when
        it cannot be known before the run)."""
        if any(not Path(p).exists() for p in outputs):
            return None  # a missing table: Snakemake makes the tables anyway
        for path in results:
            if not Path(path).exists():
                return f"{path} is to be made"
            if self.reason(path):
                return f"{path} is stale"
        if self.forced & set(EVALUATION_RULES):
            return "results are forced"
        try:
            recorded = json.loads(Path(record).read_text()).get("sha256")
        except (OSError, ValueError, AttributeError):
            return "no record of what the tables were made from"
        now = digest()
        if now is not None and now != recorded:
            return "the results differ from those the tables were made from"
        return None

    def provenance(self, paths) -> tuple[str | None, str | None, str | None]:
        """(GPU, first, last date) of the results ``paths`` that ran a worker."""
        gpus, dates = set(), []
        for path in paths:
            prov = (self.read(path) or {}).get("provenance") or {}
            if prov.get("gpu"):
                gpus.add(prov["gpu"])
            if prov.get("finished"):
                dates.append(str(prov["finished"])[:10])
        return (", ".join(sorted(gpus)) or None, min(dates, default=None), max(dates, default=None))


def forced_rules(settings) -> set[str]:
    """The rules the user forces (-R RULE; -F: all) in Snakemake's DAG settings (None: no run,
    as with --lint): their jobs run and the results after them are stale. Rerun triggers other
    than file dates are named in a note: they can redo results found current here."""
    if settings is None:
        return set()
    others = sorted(t.name.lower() for t in settings.rerun_triggers if t.name != "MTIME")
    if others:
        print(f"note: --rerun-triggers {' '.join(others)} can redo results that l1bench finds current "
              "(the profile uses mtime only: docs/rerun-policy.md)", file=sys.stderr)
    forced = {str(x) for x in settings.forcerun}
    return forced | set(EVALUATION_RULES) if settings.forceall else forced


class Reruns:
    """What reruns in one run (``run``: its :class:`l1bench.runplan.RunPlan`), and the
    ``mark_stale`` marker that reruns it: the facade the workflow uses.

    A *subject* is what a marker stands for: a build/check/time result (its path below the
    results root without ``.json``, as :meth:`subject` names it), ``tables`` (the tables and the
    pages made from them) or ``tasks`` (the task folders). ``dag_settings``: a callable giving
    Snakemake's DAG settings (:func:`forced_rules`), asked once the run's are known."""

    def __init__(self, run, dag_settings=lambda: None):
        self.run, self.results = run, run.results
        tasks = None if run.release is None else {t.tid: snippet_hashes(t) for t in run.release}
        self.judge = Judge(run.results, tasks, run.fingerprint, self.expected, lambda: forced_rules(dag_settings()))

    @property
    def forced(self) -> set[str]:
        return self.judge.forced

    def expected(self, kind: str, protocol: str | None, mode: str | None) -> dict:
        """What a result of this kind is to record: its params and settings."""
        if kind == "build":
            return {"params": build_params(self.run.config["build"])}
        return {"params": dict(self.run.config["paper"]), "settings": self.run.job_settings(kind, protocol)}

    def expected_snippets(self, wildcards) -> dict[str, str] | None:
        """{snippet: sha256} a job must run (None: the task folder's meta.json says)."""
        return None if self.judge.tasks is None else self.judge.tasks.get(wildcards.tid)

    # ---------------------------------------------------------------- subjects and markers

    def subject(self, result) -> str:
        """The subject of a result path."""
        return str(result)[len(self.results) + 1 : -len(".json")]

    def reason(self, subject: str) -> str | None:
        """Why ``subject`` is stale in this run, one line; None when it is not (for the tables:
        unless the user forces them)."""
        if subject == "tables":
            return self._tables_reason or ("aggregate_results is forced" if self.tables_forced() else None)
        if subject == "tasks":
            return None if self.run.release is None else self.judge.split_reason(f"{self.results}/tasks",
                                                                                  self.run.release)
        return self.judge.reason(f"{self.results}/{subject}.json")

    def marker(self, subject: str) -> str:
        """The marker of ``subject``: named after its reason and the content it was decided on
        (the result, the tables' record) and that file's date, so that a marker left behind (by a
        killed run) never stands for a later decision. Snakemake reruns a job whose marker is
        newer than its output: a marker left behind is older than an output copied or checked
        out since, and the file's date in its name makes that a new marker, made in this run."""
        why = (self.reason(subject) or "").encode()
        source = {"tables": self.run.tables_record, "tasks": None}.get(subject, f"{self.results}/{subject}.json")
        if source:
            date = Path(source).stat().st_mtime_ns if Path(source).exists() else ""
            why += b"\0" + f"{self.judge.sha(source) or ''}\0{date}".encode()
        return f"{self.results}/stale/{subject}.{sha256_bytes(why)[:12]}.txt"

    @cached_property
    def _selection(self) -> set[str]:
        return set(self.run.evaluation_results())

    def with_marker(self, inputs: dict, subject: str) -> dict:
        """A job's ``inputs`` with the marker of ``subject`` when it is stale: the input that
        reruns the job in this run."""
        if self.reason(subject):
            inputs["stale"] = self.marker(subject)
        return inputs

    def markers(self, wildcards=None) -> list[str]:
        """Every marker of this run, inputs of the default target: Snakemake looks for a missing
        input's job only below a job that runs, so the markers are asked for from the top, and
        each reruns the job that takes it as input (:meth:`with_marker`)."""
        results = [] if self.run.config["aggregate_only"] else self.run.evaluation_results()
        subjects = [self.subject(p) for p in results if self.judge.reason(p)]
        markers = [self.marker(s) for s in subjects + ["tables"] * bool(self.reason("tables"))]
        if self.reason("tasks"):  # the folders too, so that the split is in the DAG to take its marker
            markers += [self.marker("tasks"), *self.run.task_paths("meta", tids=self.run.all_tids)]
        return markers

    def clear_markers(self) -> None:
        """At the run's end: its markers are spent (the next run decides anew)."""
        shutil.rmtree(f"{self.results}/stale", ignore_errors=True)

    def job_runs(self, result: str, rule: str) -> bool:
        """Whether the job of ``result`` runs in this run: missing, its ``rule`` forced, or stale and
        in the run's selection. A stale result outside it (another mode, task or level than the run
        selects) is kept as it is, though the tables read it: a narrower run never re-times it,
        even when the task folders are split anew (a fresh clone)."""
        if not Path(result).exists() or rule in self.forced:
            return True
        return bool(self.judge.reason(result)) and str(result) in self._selection

    # ---------------------------------------------------------------- the tables

    def tables_forced(self) -> bool:
        return "aggregate_results" in self.forced

    def tables_made(self) -> bool:
        """Whether the tables are made in this run: stale, forced, or a table missing."""
        outputs = [*self.run.report_outputs(slices=False), self.run.tables_record]
        return bool(self.reason("tables")) or any(not Path(p).exists() for p in outputs)

    @cached_property
    def _tables_reason(self) -> str | None:
        """Judge.tables_reason of this run (asked once)."""
        lists = self.run.aggregate_inputs()
        return self.judge.tables_reason(
            [*self.run.report_outputs(slices=False), self.run.tables_record],
            # a table rebuild (aggregate_only) remakes no result: only their digest counts
            [] if self.run.config["aggregate_only"] else lists["check"] + lists["time"],
            self.run.tables_record,
            self._tables_digest,
        )

    def _tables_digest(self) -> str | None:
        """The digest the tables' record would hold if made now (None: not known before the run)."""
        contents = []
        for name, paths in self.run.aggregate_inputs().items():
            for path in paths:
                data = self._meta_text(path) if name == "meta" else Path(path).read_bytes()
                if data is None:
                    return None
                contents.append((path, data))
        return tables_inputs.digest_contents(self.results, contents, self.run.table_params())

    @cached_property
    def _release_by_tid(self) -> dict[str, rel.Task]:
        return {t.tid: t for t in self.run.release}

    @cached_property
    def _release_record(self) -> dict:
        """The release as the split records it in each meta.json."""
        return {"path": self.run.release_path, "sha256": fetch.sha256_file(self.run.release_inputs()["release"])}

    def _meta_text(self, path) -> bytes | None:
        """A task's meta.json as the split writes it (from the release in memory), else as on disk."""
        if self.run.release is None:
            return Path(path).read_bytes() if Path(path).exists() else None
        task = self._release_by_tid[Path(path).parent.name]
        return split.meta_text(task, self.run.device, self._release_record).encode()
