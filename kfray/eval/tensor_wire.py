"""PyTorch tensors between the judge and a candidate's runner, without pickles and, on a GPU,
without copies of large tensors.

A tensor goes as a descriptor (dtype, shape, strides, offset) that is plain data, plus:
- on the CPU, the descriptor of a memfd holding its storage (SCM_RIGHTS beside the frame);
- on CUDA, the storage's CUDA IPC handle (`UntypedStorage._share_cuda_`, as torch.multiprocessing
  shares it), base64 in the descriptor; a storage that shares its allocation with the judge's other
  tensors goes as a copy from a pool of its own first (`export_tensor`).
The receiving side maps the same memory: a write by either side is seen by the other, which is
what the judge's checks of inputs and late writes need. Descriptors from the runner are untrusted:
`import_tensor` checks the dtype against a list, bounds shape, strides and offsets against the
storage's size, and the names torch would open.
"""
from __future__ import annotations

import base64
import mmap
import os
import re

from kfray.eval import wire

MAX_DIMS = 16
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")
_SHM_NAME = re.compile(r"^/?torch_[0-9]+_[0-9]+_[0-9]+$")


def _dtype(name: str):
    import torch

    if name not in DTYPES:
        raise wire.WireError(f"tensor dtype {str(name)[:20]!r} is not one kfray accepts")
    return getattr(torch, name)


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


ALONE_BYTES = 64 << 20      # the judge's max_split_size_mb (kfray.eval.sandbox.JUDGE_ALLOC_CONF)


def _alone(t) -> bool:
    """Whether `t`'s storage has its allocation to itself: under the judge's allocator settings a
    block over ALONE_BYTES is never split, so nothing else shares its segment."""
    import os

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return t.untyped_storage().nbytes() > ALONE_BYTES and f"max_split_size_mb:{ALONE_BYTES >> 20}" in conf \
        and "expandable_segments:True" not in conf


def export_tensor(t, pool=None) -> tuple[dict, list[int], object]:
    """(descriptor, descriptors to send, the tensor to use on this side) of tensor `t`. A CPU
    tensor is copied into a memfd of its own; a CUDA tensor is copied into `pool` (a
    torch.cuda.MemPool) where one is given, unless its allocation holds nothing else, else shared
    as it is. The copy (which the receiver will share) is what this side must use from then on.
    Why: an IPC handle opens the whole allocation a tensor lives in, so a judge shares only
    allocations that hold nothing else of its own."""
    import torch

    d = {"dtype": _dtype_name(t), "shape": list(t.shape), "stride": list(t.stride()),
         "offset": int(t.storage_offset()), "grad": bool(t.requires_grad)}
    if t.device.type == "cuda":
        if pool is not None and not _alone(t):
            with torch.no_grad(), torch.cuda.use_mem_pool(pool):
                copy = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                    t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())
            t = copy.requires_grad_(True) if d["grad"] else copy
        s = t.untyped_storage()
        (dev, handle, size, soff, rc, rco, ev, evs) = s._share_cuda_()
        d.update(kind="cuda", dev=int(dev), handle=base64.b64encode(handle).decode(), size=int(size),
                 soff=int(soff), rc=rc.decode() if isinstance(rc, bytes) else str(rc), rco=int(rco),
                 ev=base64.b64encode(ev or b"").decode(), evs=bool(evs))
        return d, [], t
    s = t.untyped_storage()
    fd = os.memfd_create("kfray-tensor", os.MFD_CLOEXEC)
    n = s.nbytes()
    os.ftruncate(fd, max(n, 1))
    d.update(kind="cpu", nbytes=n)
    if not n:
        return d, [fd], t
    mm = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    flat = torch.frombuffer(mm, dtype=torch.uint8)
    with torch.no_grad():
        flat.copy_(torch.empty(0, dtype=torch.uint8).set_(s))
        shared = torch.empty(0, dtype=t.dtype).set_(flat.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    if t.requires_grad:
        shared.requires_grad_(True)
    return d, [fd], shared


def import_tensor(d: dict, fds: list[int], device: str, keep: list | None = None):
    """The tensor a descriptor names, sharing the sender's memory (checked against its storage)."""
    import torch

    wire.fields(d, {"dtype": str, "shape": list, "stride": list, "offset": int, "grad": bool, "kind": str,
                    "nbytes": int, "dev": int, "handle": str, "size": int, "soff": int, "rc": str, "rco": int,
                    "ev": str, "evs": bool, "alias": int}, "tensor")
    dtype = _dtype(d.get("dtype"))
    shape, stride = d.get("shape", []), d.get("stride", [])
    if len(shape) > MAX_DIMS or len(stride) != len(shape):
        raise wire.WireError("tensor shape and strides do not match")
    shape = [wire.integer(x, "tensor dim", 0, 1 << 40) for x in shape]
    stride = [wire.integer(x, "tensor stride", 0, 1 << 44) for x in stride]
    offset = wire.integer(d.get("offset", 0), "tensor offset", 0, 1 << 44)
    item = torch.empty(0, dtype=dtype).element_size()
    span = (offset + (1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0)) * item
    kind = d.get("kind")
    if kind == "cpu":
        if len(fds) != 1:
            raise wire.WireError("a CPU tensor comes with exactly one memory descriptor")
        fd = fds[0]
        n = os.fstat(fd).st_size
        if n < wire.integer(d.get("nbytes", 0), "tensor bytes", 0, 1 << 44) or span > n:
            os.close(fd)
            raise wire.WireError(f"a tensor of {span} bytes does not fit its {n}-byte storage")
        if n == 0 or span == 0:
            os.close(fd)
            return torch.empty(shape, dtype=dtype).requires_grad_(d.get("grad", False) and dtype.is_floating_point)
        # populated now: a kernel's timed call is not charged for mapping the pages in
        mm = mmap.mmap(fd, n, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)
        if keep is not None:
            keep.append(mm)
        flat = torch.frombuffer(mm, dtype=torch.uint8)
        t = torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), offset, shape, stride)
    elif kind == "cuda":
        if device != "cuda":
            raise wire.WireError("a CUDA tensor was sent to a CPU side")
        rc = d.get("rc", "")
        if not _SHM_NAME.match(rc):
            raise wire.WireError(f"a CUDA tensor's reference-counter name {rc[:40]!r} is not torch's form")
        size = wire.integer(d.get("size"), "CUDA storage bytes", 0, 1 << 44)
        if span > size:
            raise wire.WireError(f"a tensor of {span} bytes does not fit its {size}-byte CUDA storage")
        handle = base64.b64decode(wire.text(d.get("handle"), "IPC handle", 512))
        ev = base64.b64decode(wire.text(d.get("ev", ""), "IPC event", 512)) or None
        storage = torch.UntypedStorage._new_shared_cuda(
            wire.integer(d.get("dev"), "CUDA device", 0, 64), handle, size,
            wire.integer(d.get("soff"), "storage offset", 0, 1 << 44), rc.encode(),
            wire.integer(d.get("rco"), "ref counter offset", 0, 1 << 40), ev, bool(d.get("evs")))
        t = torch.empty(0, dtype=dtype, device="cuda").set_(storage, offset, shape, stride)
    else:
        raise wire.WireError(f"unknown tensor kind {str(kind)[:20]!r}")
    if d.get("grad") and dtype.is_floating_point:
        t.requires_grad_(True)
    return t
