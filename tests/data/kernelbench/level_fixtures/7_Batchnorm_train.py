import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm in training mode (as KernelBench builds it): each call updates running statistics."""

    def __init__(self, features: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)


batch_size = 32
features = 16


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
