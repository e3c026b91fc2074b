import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * 2.0


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
