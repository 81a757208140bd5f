import torch
import torch.nn as nn


def forward_fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x scaled per column."""
    return x * weight


class Model(nn.Module):
    def __init__(self, cols: int = 8, gain: float = 1.0, init_method: str = "ones"):
        super().__init__()
        w = torch.ones(cols) if init_method == "ones" else torch.rand(cols) + 0.5
        self.weight = nn.Parameter(w * gain)

    def forward(self, x, fn=forward_fn):
        return fn(x, self.weight)


def get_inputs(rows: int = 4, cols: int = 8):
    return [torch.randn(rows, cols)]


input_names = ["x"]
