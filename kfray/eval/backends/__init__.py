"""Backends behind one interface (kfray.eval.backends.base.Backend): cpu, cuda, sycl, sim and the
PyTorch-extension backends; `base.get_backend` picks one by name."""

__all__: list[str] = []       # modules are imported by name: kfray.eval.backends.base, .cpu, ...
