import torch
import torch.nn as nn


def forward_fn(x: torch.Tensor, weight: torch.Tensor, proj_weight: torch.Tensor = None) -> torch.Tensor:
    """x scaled per column, plus a second scaled copy where the model has a projection (like
    resnet_block's downsample: a weight that is None in some configurations)."""
    out = x * weight
    if proj_weight is not None:
        out = out + x * proj_weight
    return out


class Model(nn.Module):
    def __init__(self, cols: int = 8, proj: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(cols))
        self.proj_weight = nn.Parameter(torch.rand(cols)) if proj else None

    def forward(self, x, fn=forward_fn):
        return fn(x, self.weight, self.proj_weight)


def get_inputs(rows: int = 4, cols: int = 8):
    return [torch.randn(rows, cols)]


input_names = ["x"]
