"""CUDA-L1's published harness (eval/eval_cuda.py, unmodified) run beside the workflow: ``run``
times a task list through it into a results tree, ``compare`` puts two passes of each side by
side, ``gpu_run.sh`` does both on a bare GPU node in one call."""
