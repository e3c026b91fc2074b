import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=-10.0, max=10.0)


def get_inputs():
    return [torch.rand(64, 128)]  # in [0, 1): the clamp never changes a value


def get_init_inputs():
    return []
