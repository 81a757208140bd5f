"""Built-in tasks: one bandwidth-bound, one row reduction, one compute-bound.

Each has a `tails` shape set (`axpb@tails`): sizes that are no multiple of a vector, a tile or a
thread's share, for tests that a kernel is right at any shape; and a `tiny` set (`softmax@tiny`),
for runs that test the engine rather than the kernels (the judge's work is then a few kilobytes)."""
from __future__ import annotations

from importlib import resources

import numpy as np

from kfray.languages import suffix
from kfray.tasks.base import Scalar, Seed, Task, Tensor

_SEED_ORDER = {  # the first strategy of each task is its baseline (the simplest kernel)
    "axpb": ["naive", "omp", "simd", "stream", "vec", "stride"],
    "softmax": ["naive", "twopass", "online", "fused", "group"],
    "matmul": ["naive", "ikj", "tiled", "packed", "regblock"],
}
# sycl_jit: SYCL C++ kernels compiled at run time (seeds/sycl); sycl: whole SYCL programs built
# ahead of time by icpx (seeds/sycl/aot); opencl: OpenCL C kernels (seeds/opencl).
_LANG_DIR = {"cpp": "cpu", "cuda": "cuda", "sycl_jit": "sycl", "sycl": "sycl/aot", "opencl": "opencl"}


def load_seeds(task: str) -> list[Seed]:
    """Seed kernels shipped in kfray/tasks/seeds/<backend>/<task>_<strategy>.<ext>, baseline first."""
    seeds = []
    root = resources.files("kfray.tasks") / "seeds"
    for lang, folder in _LANG_DIR.items():
        d = root / folder
        if not d.is_dir():
            continue
        ext = suffix(lang)
        files = {f.name: f for f in d.iterdir() if f.name.startswith(task + "_") and f.name.endswith(ext)}
        order = _SEED_ORDER.get(task, [])
        names = sorted(files, key=lambda n: (order.index(n[len(task) + 1:-len(ext)])
                                             if n[len(task) + 1:-len(ext)] in order else 99, n))
        for n in names:
            seeds.append(Seed(n[len(task) + 1:-len(ext)], lang, files[n].read_text()))
    return seeds


def _axpb_ref(a):
    return {"y": a["a"] * a["x"] + a["b"]}


def _softmax_ref(a):
    x = a["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def _matmul_ref(a):
    return {"C": a["A"] @ a["B"]}


def axpb() -> Task:
    return Task(
        name="axpb",
        description="Elementwise y = a * x + b over a large float32 vector (bandwidth bound).",
        args=[Tensor("x", "float32", ("n",), "in"), Tensor("y", "float32", ("n",), "out"),
              Scalar("a", "float32"), Scalar("b", "float32"), Scalar("n", "int64", "n")],
        shapes={"n1M": {"n": 1 << 20}, "n4M": {"n": 1 << 22}},
        reference=_axpb_ref, rtol=1e-5, atol=1e-6,
        bytes_moved="8 * n", flops="2 * n", seeds=load_seeds("axpb"), ref="builtin:axpb",
        shape_sets={"gpu": {"n16M": {"n": 1 << 24}, "n64M": {"n": 1 << 26}},
                    "tiny": {"n4k": {"n": 4096}},
                    "tails": {"n100003": {"n": 100003}, "n17": {"n": 17}}})


def softmax() -> Task:
    return Task(
        name="softmax",
        description="Softmax over each row of a row-major float32 matrix (row reduction).",
        args=[Tensor("x", "float32", ("rows", "cols"), "in"), Tensor("y", "float32", ("rows", "cols"), "out"),
              Scalar("rows", "int64", "rows"), Scalar("cols", "int64", "cols")],
        shapes={"r1024c1024": {"rows": 1024, "cols": 1024}, "r4096c256": {"rows": 4096, "cols": 256}},
        reference=_softmax_ref, rtol=1e-4, atol=1e-7, input_scale=3.0,
        bytes_moved="8 * rows * cols", flops="5 * rows * cols", seeds=load_seeds("softmax"),
        ref="builtin:softmax",
        shape_sets={"gpu": {"r8192c4096": {"rows": 8192, "cols": 4096}, "r65536c512": {"rows": 65536, "cols": 512}},
                    "tiny": {"r16c256": {"rows": 16, "cols": 256}},
                    "tails": {"r37c1000": {"rows": 37, "cols": 1000}, "r5c4099": {"rows": 5, "cols": 4099}}})


def matmul() -> Task:
    return Task(
        name="matmul",
        description="Dense fp32 matrix multiply C = A @ B, all row-major (compute bound).",
        args=[Tensor("A", "float32", ("m", "k"), "in"), Tensor("B", "float32", ("k", "n"), "in"),
              Tensor("C", "float32", ("m", "n"), "out"),
              Scalar("m", "int64", "m"), Scalar("n", "int64", "n"), Scalar("k", "int64", "k")],
        shapes={"sq256": {"m": 256, "n": 256, "k": 256}, "r192x320x256": {"m": 192, "n": 320, "k": 256}},
        # atol: fp32 sums of up to 2048 products in another order differ by ~1e-4 near zero (gpu shapes)
        reference=_matmul_ref, rtol=1e-3, atol=2e-3,
        bytes_moved="4 * (m * k + k * n + m * n)", flops="2 * m * n * k", seeds=load_seeds("matmul"),
        ref="builtin:matmul",
        shape_sets={"gpu": {"sq2048": {"m": 2048, "n": 2048, "k": 2048},
                            "r4096x2048x1024": {"m": 4096, "n": 2048, "k": 1024}},
                    "tiny": {"sq32": {"m": 32, "n": 32, "k": 32}},
                    "tails": {"r37x45x300": {"m": 37, "n": 45, "k": 300}, "r13x70x5": {"m": 13, "n": 70, "k": 5}}})


BUILTIN = {"axpb": axpb, "softmax": softmax, "matmul": matmul}
