"""The static scan of custom code for self-timing (l1bench.codescan) and its table flag."""

import json

import pandas as pd

from l1bench import aggregate as agg
from l1bench import codescan
from l1bench.results import Flag

SELF_TIMED_CODE = '''
import time
import torch

class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        if self.best is None:
            start = torch.cuda.Event(enable_timing = True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(); a @ b; end.record(); torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.best = "half" if start.elapsed_time(end) > 1 else "float"
        return a @ b
'''


def test_self_timing_constructs_are_found_and_comments_are_not():
    assert codescan.self_timing(SELF_TIMED_CODE) == [".elapsed_time(", "enable_timing=True", "time.perf_counter("]
    quiet = "# we could time this with time.perf_counter() or start.elapsed_time(end)\nx = 1  # time.time()\n"
    assert codescan.self_timing(quiet) == []
    assert codescan.self_timing(None) == [] and codescan.self_timing("") == []
    assert codescan.self_timing("import time\nt = time.time()\n") == ["time.time("]
    assert codescan.self_timing("sleep_time = compute_time(x)\n") == []  # names that merely contain "time"


def test_scan_tasks_reads_the_custom_snippet_beside_each_meta(tmp_path):
    def task(tid, code):
        d = tmp_path / tid
        d.mkdir()
        snippets = {"custom": {"file": "custom.py"}} if code is not None else {}
        (d / "meta.json").write_text(json.dumps({"tid": tid, "snippets": snippets}))
        if code is not None:
            (d / "custom.py").write_text(code)
        return d / "meta.json"

    metas = [task("L1_T001", SELF_TIMED_CODE), task("L1_T002", "x = 1\n"), task("L1_T003", None)]
    assert codescan.scan_tasks(metas) == {
        "L1_T001": {"self_timed": [".elapsed_time(", "enable_timing=True", "time.perf_counter("]}
    }


def test_the_tables_flag_every_row_with_code_of_a_self_timed_task():
    df = pd.DataFrame([
        {"tid": "L1_T001", "mode": "default", "status": "ok", "flags": "OUTPUT_MISMATCH"},
        {"tid": "L1_T001", "mode": "cudnn", "status": "incorrect", "flags": ""},
        {"tid": "L1_T002", "mode": "default", "status": "ok", "flags": ""},
        {"tid": "L1_T008", "mode": "default", "status": "no_code", "flags": ""},
    ])
    scan = {"L1_T001": {"self_timed": ["enable_timing=True"]}, "L1_T008": {"self_timed": ["x"]}}
    out = agg.add_code_flags(df, scan)
    assert list(out["flags"]) == [f"OUTPUT_MISMATCH;{Flag.SELF_TIMED}", Flag.SELF_TIMED, "", ""]
    assert agg.add_code_flags(out, scan).equals(out)  # once only
    assert agg.add_code_flags(df, {}).equals(df)
