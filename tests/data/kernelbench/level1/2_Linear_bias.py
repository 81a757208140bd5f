import torch
import torch.nn as nn


class Model(nn.Module):
    """y = x @ W^T + b, a fully connected layer with bias."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        return self.fc(x)


rows = 16
n_in = 48
n_out = 24


def get_inputs():
    return [torch.randn(rows, n_in)]


def get_init_inputs():
    return [n_in, n_out]
