"""Host buffers the judge and a candidate's runner both map (memfd + mmap, MAP_SHARED).

The judge allocates every buffer a kernel works on here, lays its guard zones and poison, and
reads the results straight out of it after the call: nothing the kernel produces needs to cross
the wire but a return code and a claimed time. The runner maps exactly the buffers of the calls
it is asked to make, never the judge's pristine inputs or the reference's outputs.
"""
from __future__ import annotations

import itertools
import mmap
import os
import weakref
from dataclasses import dataclass

import numpy as np


@dataclass
class _Buffer:
    id: int
    fd: int
    mm: mmap.mmap
    address: int


class Arena:
    """memfd-backed byte buffers, each with an id; `locate` finds the buffer and offset of a view."""

    POOL_BYTES = 256 << 20      # freed buffers kept for reuse, at most this much in all

    def __init__(self):
        self._ids = itertools.count(1)
        self._by_root: dict[int, _Buffer] = {}
        self._pool: dict[int, list[_Buffer]] = {}      # size -> freed buffers of that size
        self._pooled = 0
        self.freed: list[int] = []

    def empty(self, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` in a buffer of its own: a freed one of that size again (a runner
        that mapped it keeps its mapping: no new descriptor to send), else a new memfd."""
        size = max(int(nbytes), 1)
        pooled = self._pool.get(size)
        if pooled:
            buf = pooled.pop()
            self._pooled -= size
        else:
            fd = os.memfd_create("kfray-buffer", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            buf = _Buffer(next(self._ids), fd, mm, 0)
        root = np.frombuffer(buf.mm, dtype=np.uint8)
        buf.address = root.ctypes.data
        self._by_root[id(root)] = buf
        weakref.finalize(root, self._free, id(root))
        return root

    def _free(self, key: int) -> None:
        buf = self._by_root.pop(key, None)
        if buf is None:
            return
        size = len(buf.mm)
        if self._pooled + size <= self.POOL_BYTES:
            self._pool.setdefault(size, []).append(buf)
            self._pooled += size
            return
        self.freed.append(buf.id)
        os.close(buf.fd)

    def locate(self, a: np.ndarray) -> tuple[int, int, int]:
        """(buffer id, byte offset of `a` in it, descriptor) of a view of an arena buffer."""
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        buf = self._by_root.get(id(root))
        if buf is None:
            raise ValueError("this array does not live in a shared buffer")
        return buf.id, a.ctypes.data - buf.address, buf.fd

    def take_freed(self) -> list[int]:
        out, self.freed = self.freed, []
        return out
