"""A stand-in for CUDA-L1's eval/eval_cuda.py on the CPU: the same entry point and the same
module-level functions, called through the module's globals as the real file calls them, so
the recorders of ``child.py`` see what they see there.

What the custom code sets decides what happens: ``SPEED`` (custom is this many times faster),
``WRONG`` (correctness fails), ``LAZY`` (the laziness check fails), ``RAISE_IN_TIMING`` (a
timed call raises). Crashing and hanging code does so while it is executed. Events are plain
tuples here: ``torch.cuda.Event.elapsed_time`` is replaced by a CPU function before the child
wraps it, and so is ``load_inline`` (a source containing ``BROKEN`` fails like a compiler).
"""

import json
import random
import types

import numpy as np
import torch
import torch.utils.cpp_extension as _cpp_extension


def _fake_load_inline(name, cpp_sources="", cuda_sources="", **kwargs):
    if "BROKEN" in str(cuda_sources):
        raise RuntimeError(
            f"Error building extension '{name}': [1/3] c++ -MMD -MF main.o.d ... -c main.cpp\n"
            f"FAILED: main.o\nmain.cpp:4:1: error: '{name}_kernel' was not declared in this scope\n"
            "ninja: build stopped: subcommand failed."
        )
    return types.SimpleNamespace(name=name)


_cpp_extension.load_inline = _fake_load_inline
torch.cuda.Event.elapsed_time = lambda self, end: end[0] - self[0]


def execute_model_with_timeout(model_src, context, timeout=300.0, build_directory=None, use_process_isolation=False,
                               info_string=""):
    try:
        exec(compile(model_src, "<string>", "exec"), context)
    except Exception as e:  # noqa: BLE001 - as the real harness catches it
        return False, f"Runtime Error: {e}", None
    return True, "", 0.01


def validate_no_lazy_evaluation(warmup_src, custom_model_src, device, seed_num=42, build_dir=None, timeout=300.0,
                                info_string=""):
    ctx = {}
    execute_model_with_timeout(custom_model_src, ctx)
    if ctx.get("LAZY"):
        return False, "Output is LazyTensor, not standard torch.Tensor"
    return True, ""


def check_kernel_correctness(warmup_src, original_model_src, custom_model_src, seed_num=42, num_correct_trials=5,
                             verbose=False, build_dir=None, device=None, timeout=300.0, info_string=""):
    ctx = {}
    execute_model_with_timeout(custom_model_src, ctx)
    if ctx.get("WRONG"):
        return False, "Value mismatch to the original model", {"trials_failed": 1, "max_difference": ["0.5"]}
    return True, "", {"trials_passed": num_correct_trials}


def eval_kernel_against_ref(warmup_src, original_model_src, custom_model_src, seed_num=42, num_perf_trials=10,
                            verbose=False, build_dir=None, device=None, info_string="", original_eval_setup="vanilla"):
    ctx = {}
    execute_model_with_timeout(custom_model_src, ctx)
    speed = ctx.get("SPEED", 2.0) * (1 + 0.01 * (seed_num - 42))
    reference_times, custom_times = [], []
    for trial in range(num_perf_trials):
        run_reference_first = random.choice([True, False])
        ref, cus = 1.0 + 0.01 * trial, (1.0 + 0.01 * trial) / speed
        if ctx.get("RAISE_IN_TIMING"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if run_reference_first:
            reference_time = torch.cuda.Event.elapsed_time((0.0,), (ref,))
            custom_time = torch.cuda.Event.elapsed_time((0.0,), (cus,))
        else:
            custom_time = torch.cuda.Event.elapsed_time((0.0,), (cus,))
            reference_time = torch.cuda.Event.elapsed_time((0.0,), (ref,))
        reference_times.append(reference_time)
        custom_times.append(custom_time)
    score = (sum(reference_times) / len(reference_times)) / (sum(custom_times) / len(custom_times))
    return score, (sum(reference_times) + sum(custom_times)) / 1000.0, "Success"


def eval_pipeline(warmup_src, original_model_src, custom_model_src, num_correct_trials, num_perf_trials,
                  global_n_trials, gpu_index, verbose=False, log_path=None, max_time=None, use_process_isolation=False,
                  info_string="", original_eval_setup=""):
    assert original_eval_setup != ""
    with open(log_path, "w") as log:
        log.write(json.dumps({"info_string": info_string, "code": custom_model_src}) + "\n")
    ok, error_msg, _ = execute_model_with_timeout(original_model_src, {})
    if not ok:
        return None, f"Original model compilation failed: {error_msg}"
    ok, error_msg, _ = execute_model_with_timeout(custom_model_src, {})
    if not ok:
        return None, "Custom model compilation failed"
    ok, error_msg = validate_no_lazy_evaluation(warmup_src, custom_model_src, None)
    if not ok:
        return None, error_msg
    ok, error_msg, _ = check_kernel_correctness(warmup_src, original_model_src, custom_model_src,
                                                num_correct_trials=num_correct_trials)
    if not ok:
        return None, error_msg
    scores = []
    for trial in range(global_n_trials):
        score, _, _ = eval_kernel_against_ref(warmup_src, original_model_src, custom_model_src, seed_num=42 + trial,
                                              num_perf_trials=num_perf_trials, original_eval_setup=original_eval_setup)
        scores.append(score)
        if score < 0.3:
            break
    with open(log_path, "a") as log:
        log.write(json.dumps({"score": float(np.mean(scores)), "scores": [round(s, 4) for s in scores],
                              "std": float(np.std(scores)), "error": False, "done": True}) + "\n")
    return 0
