"""The offline proposer: no network, no model. It edits kernels the way a cautious engineer would.

Operators: mutate one or two template parameters, switch to another seed strategy (keeping the
parameters whose names match), recombine the parameters of two parents, toggle the SIMD or
thread-parallel pragmas of OpenMP loops, contract multiply-adds into fma, and the loop edits of
kfray/proposers/loop_edits.py (thread the outer loop, vectorize an inner loop with its
reductions, a vectorizable exponential) and of kfray/proposers/cpu_edits.py (threads over blocks,
collapsed loops, the C library's vector math, AVX-512/AVX2 vector widths, aligned pointers,
prefetch) for C++, and for CUDA the edits of
kfray/proposers/cuda_edits.py and cuda_reductions.py (128-bit loads, grid-stride loops with an
occupancy-aware grid, unrolling, launch bounds, cache hints, shared-tile padding, warp-shuffle
reductions, online softmax); edits compound over generations. Like a model asked
for a target cell, it tries several edits and prefers one that lands in the target cell, or
else in a cell the island has not filled yet.
Meta-prompt hints raise the weight of the operators they name, so the co-evolved prompts steer
this proposer too, and so does the QD gradient: among its edits it favours one that steps up a
dimension the gradient says pays off. With `ctx.uniform` (the random-search baseline) nothing
steers it: operators are drawn uniformly and parameters uniformly from the declared space.
"""
from __future__ import annotations

import random
import re
import time

from kfray.candidate import Candidate
from kfray.languages import family
from kfray.proposers import cpu_edits, cuda_edits, cuda_reductions, loop_edits
from kfray.proposers.base import ProposalContext, Proposer
from kfray.descriptors import describe
from kfray.source import parse_params
from kfray.tasks.suite_form import is_modelnew

_COMMON = ("mutate_params", "switch_strategy", "recombine", "use_fma")
_CPP_OPS = ("toggle_simd", "toggle_parallel", "add_parallel", "add_simd", "fast_exp", *cpu_edits.EDITS)
_CUDA_EDITS = {**cuda_edits.EDITS, **cuda_reductions.EDITS}
OPERATORS = _COMMON + _CPP_OPS + tuple(_CUDA_EDITS)
_OMP_FOR = re.compile(r"^(\s*#pragma omp )(parallel for|for)( simd)?(.*)$", re.M)
_TERM = r"[\w.]+(?:\[[^\]\[;]+\])?"
_MUL_ADD = re.compile(rf"=\s*({_TERM})\s*\*\s*({_TERM})\s*\+\s*({_TERM})\s*;")
_ACC_ADD = re.compile(rf"([\w.]+(?:\[[^\]\[;]+\])*)\s*\+=\s*({_TERM})\s*\*\s*({_TERM})\s*;")
TRIES = 6


_INT_DECL = re.compile(r"\b(?:int|int64_t|int32_t|uint32_t|uint64_t|long|size_t|unsigned|auto|char|bool)\s+"
                       r"(?:const\s+)?\w+\s*$")


def _floaty(src: str, m: re.Match) -> bool:
    """Not index arithmetic: no integer literal among the terms, no integer declaration before."""
    line = src[src.rfind("\n", 0, m.start()) + 1:m.start()]
    return not (any(re.fullmatch(r"\d+", g) for g in m.groups()) or _INT_DECL.search(line))


def _use_fma(source: str, rng: random.Random) -> str | None:
    """`y = a * x + b;` -> `y = std::fma(a, x, b);` and `s += a * b;` -> `s = std::fma(a, b, s);`
    (float arithmetic only: index arithmetic such as `int64_t i = k * 4 + t;` stays exact)."""
    new = _MUL_ADD.sub(lambda m: f"= std::fma({m[1]}, {m[2]}, {m[3]});" if _floaty(source, m) else m[0], source)
    new = _ACC_ADD.sub(lambda m: f"{m[1]} = std::fma({m[2]}, {m[3]}, {m[1]});" if _floaty(new, m) else m[0], new)
    if new == source:
        return None
    return new if "<cmath>" in new else "#include <cmath>\n" + new


def _mutate_params(source: str, params: dict, rng: random.Random) -> dict | None:
    space = parse_params(source)
    if not space.values:
        return None
    for _ in range(20):
        child = {k: params.get(k, v[0]) for k, v in space.values.items()}
        for name in rng.sample(list(space.values), k=min(len(space.values), rng.choice([1, 1, 2]))):
            options = [v for v in space.values[name] if v != child[name]] or list(space.values[name])
            child[name] = rng.choice(options)
        if child != params and space.allows(child):
            return child
    return None


def _random_params(source: str, rng: random.Random) -> dict | None:
    """A setting drawn uniformly from the declared values (re-drawn until the requires allow it)."""
    space = parse_params(source)
    if not space.values:
        return None
    for _ in range(50):
        p = {k: rng.choice(v) for k, v in space.values.items()}
        if space.allows(p):
            return p
    return None


def _fit_params(source: str, wanted: dict, rng: random.Random) -> dict:
    """Parameters for `source`: keep wanted values that are legal there, draw the rest."""
    space = parse_params(source)
    for _ in range(20):
        p = {k: wanted[k] if wanted.get(k) in v else rng.choice(v) for k, v in space.values.items()}
        if space.allows(p):
            return p
    return space.default()


def _toggle(source: str, rng: random.Random, what: str) -> str | None:
    matches = list(_OMP_FOR.finditer(source))
    if not matches:
        return None
    m = rng.choice(matches)
    head, kind, simd, rest = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    if what == "simd":
        simd = "" if simd else " simd"
    else:
        kind = "for" if kind == "parallel for" else "parallel for"
    return source[:m.start()] + f"{head}{kind}{simd}{rest}" + source[m.end():]


def operators_for(language: str, source: str = "") -> tuple[str, ...]:
    """The operators that can apply to a kernel: CUDA edits for CUDA kernels (a suite kernel that
    is a CUDA extension included, not a ModelNew file), OpenMP ones else."""
    cuda = family(language) == "cuda" and (language != "suite" or ("__global__" in source
                                                                     and not is_modelnew(source)))
    return _COMMON + (tuple(_CUDA_EDITS) if cuda else _CPP_OPS)


class OfflineProposer(Proposer):
    name = "offline"

    def propose(self, ctx: ProposalContext, rng: random.Random) -> Candidate:
        t0 = time.perf_counter()
        seeds = ctx.task.seeds_for(ctx.language)
        if ctx.parent is None:
            base = ctx.task.baseline_seed(ctx.language)
            src, params, parent_id = base.source, parse_params(base.source).default(), None
        else:
            src, params = ctx.parent.candidate.source, dict(ctx.parent.candidate.params)
            parent_id = ctx.parent.candidate.id
        weights = {op: 1.0 for op in operators_for(ctx.language, src)}
        if not ctx.uniform:
            weights["mutate_params"] = 2.0
            for hint in (ctx.meta_prompt.hints if ctx.meta_prompt else []):
                if hint in weights:
                    weights[hint] += 1.0
        ops = list(weights)
        options = []
        for _ in range(3 * TRIES):   # not every operator applies to every source
            op = rng.choices(ops, weights=[weights[o] for o in ops], k=1)[0]
            out = self._apply(op, src, params, ctx, seeds, rng)
            if out is not None:
                options.append((op, *out))
            if len(options) >= TRIES:
                break
        if not options:
            options = [("mutate_params", src, _mutate_params(src, params, rng) or params)]
        if ctx.uniform:
            op, new_src, new_params = options[0]
            return Candidate(task=ctx.task.name, language=ctx.language, source=new_src, params=new_params,
                             island=ctx.island, parent_id=parent_id,
                             prompt_id=ctx.meta_prompt.id if ctx.meta_prompt else None,
                             origin=f"offline:{op}", generation=ctx.generation,
                             propose_seconds=time.perf_counter() - t0)
        cells = [describe(o[1], ctx.language) for o in options]
        uphill = []
        if ctx.gradient is not None and ctx.parent is not None:
            here = tuple(ctx.parent.candidate.cell)
            score = [sum(g * (c[d] - here[d]) for d, g in enumerate(ctx.gradient)) if len(here) == len(c)
                     else 0.0 for c in cells]
            best = max(score)
            uphill = [o for o, sc in zip(options, score) if sc > 0 and sc == best]
        on_target = [o for o, c in zip(options, cells) if ctx.target_cell is not None
                     and c == tuple(ctx.target_cell)]
        novel = [o for o, c in zip(options, cells) if c not in ctx.occupied]
        if on_target and rng.random() < 0.6:
            op, new_src, new_params = on_target[0]
        elif uphill and rng.random() < 0.5:       # a step the QD gradient says pays off
            op, new_src, new_params = uphill[0]
        elif novel and rng.random() < 0.5:        # a new cell is worth a try: quality *diversity*
            op, new_src, new_params = novel[0]
        else:
            op, new_src, new_params = options[0]
        return Candidate(task=ctx.task.name, language=ctx.language, source=new_src, params=new_params,
                         island=ctx.island, parent_id=parent_id,
                         prompt_id=ctx.meta_prompt.id if ctx.meta_prompt else None,
                         origin=f"offline:{op}", generation=ctx.generation,
                         propose_seconds=time.perf_counter() - t0)

    def _apply(self, op, src, params, ctx, seeds, rng):
        if op in _CUDA_EDITS:
            try:
                new = _CUDA_EDITS[op](src, rng)
            except (ValueError, IndexError):        # a source the edit misreads: no option
                new = None
            return (new, _fit_params(new, params, rng)) if new else None
        if op == "mutate_params":
            p = _random_params(src, rng) if ctx.uniform else _mutate_params(src, params, rng)
            return (src, p) if p is not None else None
        if op == "switch_strategy":
            others = [s for s in seeds if s.source != src]
            if not others:
                return None
            s = rng.choice(others)
            if ctx.uniform:
                return s.source, _random_params(s.source, rng) or {}
            return s.source, _fit_params(s.source, params, rng)
        if op == "recombine":
            if not ctx.inspirations:
                return None
            other = rng.choice(ctx.inspirations).candidate
            merged = {k: (other.params[k] if k in other.params and rng.random() < 0.5 else v)
                      for k, v in params.items()}
            if rng.random() < 0.5 and other.source != src:   # take the other's code, our parameters
                return other.source, _fit_params(other.source, {**other.params, **merged}, rng)
            p = _fit_params(src, merged, rng)
            return (src, p) if p != params else None
        if op == "use_fma":
            new = _use_fma(src, rng)
            return (new, params) if new else None
        if op in ("add_parallel", "add_simd", "fast_exp"):
            if ctx.language != "cpp":          # OpenMP host code only
                return None
            new = (loop_edits.add_simd(src, rng) if op == "add_simd" else
                   loop_edits.add_parallel(src) if op == "add_parallel" else loop_edits.fast_exp(src))
            return (new, params) if new else None
        if op in cpu_edits.EDITS:
            if ctx.language != "cpp":          # OpenMP host code only
                return None
            new = cpu_edits.EDITS[op](src, rng)
            return (new, _fit_params(new, params, rng)) if new else None
        if op in ("toggle_simd", "toggle_parallel"):
            new = _toggle(src, rng, "simd" if op == "toggle_simd" else "parallel")
            return (new, _fit_params(new, params, rng)) if new else None
        return None


def make_proposer(cfg) -> Proposer:
    """The proposer a ProposerConfig asks for."""
    if cfg.kind == "llm":
        from kfray.proposers.llm import LLMProposer
        return LLMProposer(cfg)
    return OfflineProposer()
