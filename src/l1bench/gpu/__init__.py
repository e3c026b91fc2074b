"""Who owns the GPU: the visible GPUs (:mod:`~l1bench.gpu.gpus`), the exclusive per-GPU lock held
around every piece of GPU work (:mod:`~l1bench.gpu.gpulock`), the CPU kept for the lock holder's
thread (:mod:`~l1bench.gpu.timingcpus`), and GPU sections: the lock held, a GPU claimed, CUDA
started (:mod:`~l1bench.gpu.sections`). How a call is timed inside a section is
:mod:`l1bench.timing`'s.
"""
