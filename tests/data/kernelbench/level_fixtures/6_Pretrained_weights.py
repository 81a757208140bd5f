import os

import torch
import torch.nn as nn

SEEN_OFFLINE = []       # HF_HUB_OFFLINE as the model's construction saw it


class Hub:
    """Stands in for transformers: fails as it does when offline and the weights are not cached."""

    @staticmethod
    def from_pretrained(name):
        SEEN_OFFLINE.append(os.environ.get("HF_HUB_OFFLINE"))
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {name} (offline mode)")
        raise RuntimeError("tried the network")


class Model(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.model = Hub.from_pretrained(name)

    def forward(self, x):
        return self.model(x)


def get_inputs():
    return [torch.randint(0, 100, (1, 8))]


def get_init_inputs():
    return ["gpt2"]
