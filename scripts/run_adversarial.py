#!/usr/bin/env python3
"""Run the adversarial suite (tests/adversarial) through the integrity layer.

    python scripts/run_adversarial.py --device cuda:0 --out results/adversarial/h200.json
    python scripts/run_adversarial.py --device cpu --out results/adversarial/cpu.json

Every case runs in its own child process (this script with ``--child``) under
a timeout: ``run_detectors`` always, and on CUDA also ``time_strict`` (with
``verify_outputs``) and ``cache_sensitivity`` (``--timing on|off`` overrides;
cases marked ``timed``, caught by strict timing, are timed on every device).
On CPU the CUDA-only cases are skipped.  Writes ``{case: {"expected", "flags", "caught",
"false_positive", "error", ...}}`` to ``--out``, prints a summary table, and
exits 1 if a hack is missed or an honest case is flagged (or fails); misses
of cases listed in the index's ``KNOWN_LIMITS`` are reported but not failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_CASES_FILE = ROOT / "tests" / "adversarial" / "cases.py"


def load_cases(path: Path):
    """The adversarial index module, loaded by file path."""
    spec = importlib.util.spec_from_file_location("l1_adversarial_cases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- child


#: Timed outputs checked per strict timing run (``strict.verify_outputs``): the suite checks
#: what the integrity layer can catch, so it times with the checks on.
VERIFY_OUTPUTS = 3


def _timing(ref_cls, custom_cls, get_inputs, get_init_inputs, device, args) -> dict:
    """Strict timing and L2 sensitivity of one case; returns flags and a summary."""
    import torch

    from l1bench import detectors, snippet
    from l1bench.timing import strict

    seed = 42
    dev = detectors.as_device(device)
    snippet.set_seed(seed)
    init_inputs = get_init_inputs()
    state = detectors.snapshot_global_state()
    with torch.no_grad():
        ref = snippet.build_model(ref_cls, init_inputs, seed, dev)
        custom = snippet.build_model(custom_cls, init_inputs, seed, dev)
    detectors.restore_global_state(state)
    cfg = {"seed": seed, "budget_s": args.budget, "max_reps": args.max_reps, "verify_outputs": VERIFY_OUTPUTS}

    def make():
        return snippet.make_inputs(get_inputs, dev)

    timed = strict.time_strict(ref, custom, make, dev, cfg, global_state=state)
    l2 = strict.cache_sensitivity(ref, custom, make, dev, cfg, global_state=state)
    flags = timed["flags"] + l2["flags"] + detectors.ceiling_flag(timed["speedup_median"])
    keys = ("speedup_median", "ci95", "n", "rse", "stop_reason", "custom_sync_event_ratio", "speedup_event_median")
    summary = {k: timed.get(k) for k in keys}
    summary["l2"] = {k: v for k, v in l2.items() if k != "flags"}
    return {"flags": flags, "timing": summary}


def child(args) -> int:
    """Run one case; write its raw result (flags, details, error) as JSON to ``--result``."""
    from l1bench import detectors, snippet

    case = load_cases(Path(args.cases_file)).get_case(args.child)
    result = {"flags": [], "error": None}
    try:
        ref_cls, get_inputs, get_init_inputs = snippet.load_reference(case.ref_source, "ref")
        custom_cls = snippet.load_custom(case.custom_source, "custom")
        found = detectors.run_detectors(ref_cls, custom_cls, get_inputs, get_init_inputs, args.device, {})
        result["flags"] += found["flags"]
        result["details"] = found["details"]
        if args.timing_on:
            t = _timing(ref_cls, custom_cls, get_inputs, get_init_inputs, args.device, args)
            result["flags"] += t["flags"]
            result["timing"] = t["timing"]
    except Exception as err:  # noqa: BLE001 - reported, not raised
        result["error"] = snippet.short(f"{type(err).__name__}: {err}", 400)
    Path(args.result).write_text(json.dumps(result, default=str))
    return 0


# --------------------------------------------------------------------------- parent


def _verdict(case, raw: dict, known_limit=None) -> dict:
    names = []
    for f in raw.get("flags", []):
        if f["flag"] not in names:
            names.append(f["flag"])
    if case.expected_flag is None:
        caught = None
        false_positive = bool(names)
    else:
        caught = case.expected_flag in names
        false_positive = False
    entry = {
        "expected": case.expected_flag,
        "flags": names,
        "caught": caught,
        "false_positive": false_positive,
        "error": raw.get("error"),
        "reasons": [f"{f['flag']}: {f['reason']}" for f in raw.get("flags", [])],
        "needs_cuda": case.needs_cuda,
    }
    if known_limit:
        entry["known_limit"] = known_limit
    if "timing" in raw:
        entry["timing"] = raw["timing"]
    return entry


def run_case(case, args, timeout_s: float, known_limit=None) -> dict:
    """Run one case in a child process and turn its output into a verdict entry."""
    with tempfile.TemporaryDirectory(prefix="l1adv_") as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            case.name,
            "--device",
            args.device,
            "--result",
            str(result_path),
            "--cases-file",
            str(args.cases_file),
            "--budget",
            str(args.budget),
            "--max-reps",
            str(args.max_reps),
            "--timing",
            "on" if args.timing_on or case.timed else "off",
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return _verdict(case, {"error": f"timeout after {timeout_s:.0f} s"}, known_limit)
        if not result_path.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            return _verdict(case, {"error": f"child exited {proc.returncode}: {' | '.join(tail)}"}, known_limit)
        return _verdict(case, json.loads(result_path.read_text()), known_limit)


def is_failure(entry: dict) -> bool:
    """A missed hack, a flagged honest model, or an honest model that failed to run.

    A miss of a case listed in the index's KNOWN_LIMITS is reported, not failed,
    unless the case broke (error)."""
    if entry.get("skipped"):
        return False
    if entry["expected"] is None:
        return entry["false_positive"] or entry["error"] is not None
    if entry.get("known_limit") and entry["error"] is None:
        return False
    return not entry["caught"]


def print_table(results: dict) -> None:
    print(f"{'case':24s} {'expected':20s} {'verdict':9s} flags / error")
    for name, e in results.items():
        if e.get("skipped"):
            verdict = "skipped"
        elif e["expected"] is None:
            verdict = "FP" if is_failure(e) else "clean"
        elif e["caught"]:
            verdict = "caught"
        else:
            verdict = "missed*" if e.get("known_limit") else "MISSED"
        extra = ",".join(e["flags"]) or "-"
        if e.get("error"):
            extra += f"  error: {e['error'][:100]}"
        print(f"{name:24s} {str(e['expected']):20s} {verdict:9s} {extra}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    p.add_argument("--out", help="JSON file to write (parent mode)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--cases-file", default=str(DEFAULT_CASES_FILE))
    p.add_argument("--timeout", type=float, default=240.0, help="per-case child timeout, seconds")
    p.add_argument("--budget", type=float, default=4.0, help="time_strict budget_s per timing run")
    p.add_argument("--max-reps", type=int, default=100)
    p.add_argument("--timing", choices=("auto", "on", "off"), default="auto", help="auto: on for CUDA only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.timing_on = args.timing == "on" or (args.timing == "auto" and args.device.startswith("cuda"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if not args.out:
        print("--out is required", file=sys.stderr)
        return 2
    mod = load_cases(Path(args.cases_file))
    wanted = [n for n in args.cases.split(",") if n]
    unknown = set(wanted) - {c.name for c in mod.CASES}
    if unknown:
        print(f"unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    on_cuda = args.device.startswith("cuda")
    results = {}
    for case in mod.CASES:
        if wanted and case.name not in wanted:
            continue
        if case.needs_cuda and not on_cuda:
            results[case.name] = {
                "expected": case.expected_flag,
                "flags": [],
                "caught": None,
                "false_positive": False,
                "error": None,
                "skipped": "needs CUDA",
                "needs_cuda": True,
            }
            continue
        t0 = time.monotonic()
        timeout = max(args.timeout, getattr(mod, "TIMEOUT_S", {}).get(case.name, 0))
        known = getattr(mod, "KNOWN_LIMITS", {}).get(case.name)
        results[case.name] = run_case(case, args, timeout, known)
        results[case.name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"  {case.name}: {results[case.name]['flags']} ({results[case.name]['seconds']} s)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_table(results)
    failures = [n for n, e in results.items() if is_failure(e)]
    for name, e in results.items():
        if e.get("known_limit") and not e.get("caught"):
            print(f"* {name}: known limit: {e['known_limit']}")
    print(f"{len(failures)} failure(s): {', '.join(failures) or '-'}  -> {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
