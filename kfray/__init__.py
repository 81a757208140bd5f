"""kfray: island-model MAP-Elites search for fast GPU kernels, on Ray."""

__version__ = "0.1.0"
