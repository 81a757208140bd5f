import torch
import torch.nn as nn


class Model(nn.Module):
    """Rectified linear unit over a batch of vectors."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch = 8
features = 1000


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return []
