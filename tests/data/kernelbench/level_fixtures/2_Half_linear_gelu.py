import torch
import torch.nn as nn


class Model(nn.Module):
    """GELU of a linear layer, all in float16."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out, dtype=torch.float16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


batch = 4
n_in = 32
n_out = 16


def get_inputs():
    return [torch.randn(batch, n_in, dtype=torch.float16)]


def get_init_inputs():
    return [n_in, n_out]
