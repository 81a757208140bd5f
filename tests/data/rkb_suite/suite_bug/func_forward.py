import torch
import torch.nn as nn
import torch.nn.functional as F


def forward_fn(x: torch.Tensor) -> torch.Tensor:
    """Max pooling with kernel size 2 (as robust-kbench's mnist_pool forward)."""
    return F.max_pool2d(x, kernel_size=2)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, fn=forward_fn):
        return fn(x)


def get_inputs(batch_size: int = 2, channels: int = 3, size: int = 8):
    return [torch.randn(batch_size, channels, size, size)]


input_names = ["x"]
