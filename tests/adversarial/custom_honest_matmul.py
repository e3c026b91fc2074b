"""Honest: the same product through einsum."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.einsum("ik,kj->ij", a, b)
