"""kfray: island-model MAP-Elites search for fast GPU kernels, on Ray.

Layers, each importing only from those before it: core (errors, candidate, source, languages,
descriptors, proposal, config, cluster, store) < tasks < eval < prompts < proposers < search <
driver < commands (cli, sweep, report, verify). tests/test_layering.py holds them to it."""

__version__ = "0.1.0"
__all__ = ["__version__"]
