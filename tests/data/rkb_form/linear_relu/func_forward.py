import torch
import torch.nn as nn
import torch.nn.functional as F


def forward_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(x @ W^T + b).

    Args:
        x: (batch_size, in_features)
    """
    return F.relu(F.linear(x, weight, bias))


class Model(nn.Module):
    def __init__(self, in_features: int = 16, out_features: int = 8, init_method: str = "standard"):
        super().__init__()
        lin = nn.Linear(in_features, out_features)
        if init_method == "zeros_bias":
            nn.init.zeros_(lin.bias)
        self.weight = nn.Parameter(lin.weight.detach().clone())
        self.bias = nn.Parameter(lin.bias.detach().clone())

    def forward(self, x, fn=forward_fn):
        return fn(x, self.weight, self.bias)


def get_inputs(batch_size: int = 4, in_features: int = 16):
    return [torch.randn(batch_size, in_features)]


input_names = ["x"]
