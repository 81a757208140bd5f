"""Tensors in USM device memory, as the sandbox hands them to kernels and back to the harness."""
from __future__ import annotations

import numpy as np


class UsmArray:
    """A tensor in USM device memory, with the host array it came from (for the reference)."""

    __slots__ = ("mem", "shape", "dtype", "host", "ptr")

    def __init__(self, mem, shape, dtype, host):
        self.mem, self.shape, self.dtype, self.host = mem, tuple(shape), np.dtype(dtype), host
        self.ptr = int(mem._pointer)

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        if out.nbytes:
            self.mem.copy_to_host(out.reshape(-1).view(np.uint8))
        return out

    # Enough of the ndarray protocol for the harness to compare it where it expects arrays.
    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def astype(self, dtype) -> np.ndarray:
        return self.numpy().astype(dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1
