"""Honest: convolution as unfold + matrix product, same parameters as the reference."""
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)  # same init under the same seed

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        cols = F.unfold(x, k)  # (n, cin*k*k, L)
        weight = self.conv.weight.reshape(self.conv.out_channels, -1)
        out = weight @ cols + self.conv.bias[:, None]
        return out.reshape(n, self.conv.out_channels, h - k + 1, w - k + 1)
