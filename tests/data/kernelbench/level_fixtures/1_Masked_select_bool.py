import torch
import torch.nn as nn


class Model(nn.Module):
    """A bool mask in, a masked copy and a bool sign map out."""

    def forward(self, x, mask):
        return torch.where(mask, x, torch.zeros_like(x)), x > 0


rows = 8
cols = 16


def get_inputs():
    return [torch.randn(rows, cols), torch.randint(0, 2, (rows, cols)).bool()]


def get_init_inputs():
    return []
