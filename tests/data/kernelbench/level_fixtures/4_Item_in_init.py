import torch
import torch.nn as nn

REAL_FORWARDS = []      # the test checks the load never ran the forward on real tensors


class Model(nn.Module):
    """Calls .item() in __init__ (as KernelBench's Swin models do): meta and fake tensors cannot build it."""

    def __init__(self, n_in, n_out):
        super().__init__()
        rates = [r.item() for r in torch.linspace(0, 0.5, 3)]
        self.scale = rates[1]
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        if x.device.type != "meta" and type(x) is torch.Tensor:
            REAL_FORWARDS.append(tuple(x.shape))
        return self.fc(x) * self.scale


batch = 64
n_in = 256
n_out = 128


def get_inputs():
    return [torch.randn(batch, n_in)]


def get_init_inputs():
    return [n_in, n_out]
