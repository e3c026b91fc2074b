"""Trick (CUDA, C++): launch the kernel on a fresh non-blocking cudaStream and return at once."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void slow_double(const float* x, float* y, long n, long long spin) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long long t0 = clock64();
    while (clock64() - t0 < spin) { }
    if (i < n) y[i] = 2.0f * x[i];
}

torch::Tensor double_async(torch::Tensor x) {
    auto y = torch::empty_like(x);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    long n = x.numel();
    slow_double<<<(n + 255) / 256, 256, 0, s>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, 1000000LL);
    cudaStreamDestroy(s);  // returns at once; the kernel keeps running
    return y;
}
"""

_ext = load_inline(
    name="l1adv_side_stream_cpp",
    cpp_sources="torch::Tensor double_async(torch::Tensor x);",
    cuda_sources=_CUDA,
    functions=["double_async"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.double_async(x.contiguous())
