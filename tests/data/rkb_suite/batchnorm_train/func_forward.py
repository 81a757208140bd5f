import torch
import torch.nn as nn
import torch.nn.functional as F


def forward_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
               running_var: torch.Tensor) -> torch.Tensor:
    """Batch normalisation in training mode: it updates the running statistics it is given, as
    robust-kbench's kernelbench/level_2 tasks with BatchNorm do."""
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.1, eps=1e-5)


class Model(nn.Module):
    def __init__(self, features: int = 8):
        super().__init__()
        bn = nn.BatchNorm1d(features)
        self.weight = nn.Parameter(bn.weight.data.clone() + 0.5)
        self.bias = nn.Parameter(bn.bias.data.clone() + 0.25)
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x, fn=forward_fn):
        return fn(x, self.weight, self.bias, self.running_mean, self.running_var)


def get_inputs(batch: int = 16, features: int = 8):
    return [torch.randn(batch, features)]


input_names = ["x"]
