"""The Task model: arguments, shape configs, reference, tolerances, cost model and seed kernels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kfray.errors import TaskError
from kfray.source import safe_eval

# The dtypes a kf_forward kernel takes, with their C type, and the numpy dtype of their host arrays.
C_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "int64_t", "bool": "bool"}
# Dtypes a task may hold (suite problems in half precision) that kf_forward cannot take: no one C type
# serves every backend (_Float16, __half, sycl::half) and numpy has no bfloat16. Such a task still
# loads and runs as a PyTorch extension or ModelNew kernel; its host arrays hold bfloat16 widened.
TORCH_ONLY_TYPES = ("float16", "bfloat16")
DTYPES = (*C_TYPES, *TORCH_ONLY_TYPES)
NP_TYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
            "bool": np.bool_, "float16": np.float16, "bfloat16": np.float32}
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[str, ...]          # expressions over the shape config, e.g. ("rows", "cols")
    role: str = "in"                # in | out

    def dims(self, config: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(safe_eval(str(e), config)) for e in self.shape)


@dataclass(frozen=True)
class Scalar:
    name: str
    dtype: str
    value: str | float | None = None  # expression over the shape config; None: fresh random each trial


@dataclass(frozen=True)
class Seed:
    name: str                       # strategy name: naive, blocked, simd_omp...
    language: str
    source: str


@dataclass
class Task:
    name: str
    description: str
    args: list[Tensor | Scalar]
    shapes: dict[str, dict[str, int]]                 # shape config name -> sizes
    reference: Callable[[dict[str, Any]], dict[str, np.ndarray]]
    rtol: float = 1e-4
    atol: float = 1e-5
    bytes_moved: str = "0"                             # expression over the shape config
    flops: str = "0"
    seeds: list[Seed] = field(default_factory=list)   # the first seed of a language is its baseline
    ref: str = ""                                      # how a worker process loads it again, e.g. builtin:axpb
    input_scale: float = 1.0
    instructions: str = ""
    shape_sets: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # e.g. {"gpu": {...}}

    def __post_init__(self):
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise TaskError(f"task {self.name}: duplicate argument names in {names}")
        if not self.shapes:
            raise TaskError(f"task {self.name}: needs at least one shape config")
        if not any(isinstance(a, Tensor) and a.role == "out" for a in self.args):
            raise TaskError(f"task {self.name}: needs at least one output tensor")
        for a in self.args:
            if a.dtype not in DTYPES:
                raise TaskError(f"task {self.name}: argument {a.name} has unknown dtype {a.dtype!r} "
                                f"(known: {', '.join(DTYPES)})")

    @property
    def inputs(self) -> list[Tensor]:
        return [a for a in self.args if isinstance(a, Tensor) and a.role == "in"]

    @property
    def outputs(self) -> list[Tensor]:
        return [a for a in self.args if isinstance(a, Tensor) and a.role == "out"]

    @property
    def languages(self) -> list[str]:
        return sorted({s.language for s in self.seeds})

    def seeds_for(self, language: str) -> list[Seed]:
        return [s for s in self.seeds if s.language == language]

    def baseline_seed(self, language: str) -> Seed | None:
        seeds = self.seeds_for(language)
        return seeds[0] if seeds else None

    def cost(self, shape: str) -> tuple[float, float]:
        """(bytes moved, flops) for one run on a shape config: for roofline figures."""
        cfg = self.shapes[shape]
        return float(safe_eval(self.bytes_moved, cfg)), float(safe_eval(self.flops, cfg))

    def signature(self, language: str) -> str:
        """The exact entry point a candidate must export (DESIGN.md kernel contract)."""
        parts = []
        odd = [f"{a.name} ({a.dtype})" for a in self.args if a.dtype not in C_TYPES]
        if odd:
            raise TaskError(f"task {self.name}: kf_forward kernels cannot take {', '.join(odd)}; "
                            f"only a PyTorch extension or ModelNew kernel can")
        for a in self.args:
            ct = C_TYPES[a.dtype]
            if isinstance(a, Tensor):
                parts.append(f"{'const ' if a.role == 'in' else ''}{ct}* {a.name}")
            else:
                parts.append(f"{ct} {a.name}")
        if language == "cuda":
            parts.append("cudaStream_t stream")
        elif language == "sycl":
            parts.append("sycl::queue* queue")
        return f'extern "C" int kf_forward({", ".join(parts)})'

    def make_args(self, shape: str, rng: np.random.Generator, xp=np, normal=None) -> dict[str, Any]:
        """Fresh random inputs, NaN-poisoned outputs, scalar values, for one shape config.

        `xp` is the array module: numpy, or cupy to draw the inputs on the GPU (large shapes).
        `normal(rng, dims, dtype)`, when given, draws the float inputs on the host (the harness
        passes a pooled draw: kfray/eval/draws.py)."""
        cfg = self.shapes[shape]
        gen = rng if xp is np else xp.random.RandomState(int(rng.integers(2 ** 63)))
        out: dict[str, Any] = {}
        for a in self.args:
            if isinstance(a, Tensor):
                dims = a.dims(cfg)
                dt = NP_TYPES[a.dtype]
                if a.role == "out":
                    out[a.name] = xp.full(dims, np.nan if np.issubdtype(dt, np.floating) else -1, dtype=dt)
                elif dt is np.bool_:           # a fair coin per element (a mask)
                    out[a.name] = (rng.random(dims) if xp is np else gen.rand(*dims)) < 0.5
                elif np.issubdtype(dt, np.floating):
                    if xp is not np:
                        x = gen.standard_normal(dims, dtype=dt)
                    elif dt in (np.float32, np.float64):       # drawn in its own precision: no copy
                        x = normal(rng, dims, dt) if normal else rng.standard_normal(dims, dtype=dt)
                    else:
                        x = (normal(rng, dims, np.float32) if normal
                             else rng.standard_normal(dims, dtype=np.float32)).astype(dt)
                    if self.input_scale != 1.0:
                        x *= dt(self.input_scale)
                    out[a.name] = x
                elif xp is np:
                    out[a.name] = rng.integers(0, 100, size=dims, dtype=dt)
                else:
                    out[a.name] = gen.randint(0, 100, size=dims, dtype=dt)
            else:
                if a.value is None:
                    v = float(rng.uniform(0.5, 2.0)) * (1 if rng.random() < 0.5 else -1)
                else:
                    v = safe_eval(str(a.value), cfg)
                out[a.name] = int(v) if a.dtype.startswith("int") else float(np.float32(v))
        return out

    def run_reference(self, args: dict[str, Any]) -> dict[str, np.ndarray]:
        res = self.reference({k: v for k, v in args.items()
                              if k not in {o.name for o in self.outputs}})
        return {o.name: np.asarray(res[o.name], dtype=NP_TYPES[o.dtype]) for o in self.outputs}
