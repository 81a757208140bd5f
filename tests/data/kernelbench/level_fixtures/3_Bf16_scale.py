import torch
import torch.nn as nn


class Model(nn.Module):
    """A bfloat16 input scaled by a bfloat16 parameter."""

    def __init__(self, n):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n, dtype=torch.bfloat16))

    def forward(self, x):
        return x * self.gain


n = 64


def get_inputs():
    return [torch.randn(n, dtype=torch.bfloat16)]


def get_init_inputs():
    return [n]
