"""The offline proposer over the built-in CPU tasks: legal parameters, seeds, operator mix, hints."""
from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.proposers import cpu_edits
from kfray.proposers.base import Elite, MetaPrompt, ProposalContext
from kfray.proposers.offline import OPERATORS, OfflineProposer
from kfray.source import parse_params
from kfray.tasks import Seed, load_task

TASKS = ["axpb", "softmax", "matmul"]


def _elite(task, seed, params=None, speedup=1.0, cell=(0, 0, 0)) -> Elite:
    src = seed.source
    c = Candidate(task=task.name, language="cpp", source=src,
                  params=params if params is not None else parse_params(src).default(), cell=cell)
    return Elite(c, EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": speedup}))


def _ctx(task, parent=None, inspirations=(), meta=None, generation=1) -> ProposalContext:
    return ProposalContext(task=task, language="cpp", parent=parent, inspirations=list(inspirations),
                           target_cell=None, meta_prompt=meta, device_facts={}, island=3,
                           generation=generation)


def _meta(hints) -> MetaPrompt:
    return MetaPrompt(id="mp-0001", generation=0, sections={}, hints=list(hints))


@pytest.mark.parametrize("name", TASKS)
def test_children_have_allowed_params(name):
    """A random walk of 200 proposals, children becoming parents, never leaves the legal space."""
    task = load_task(name)
    seeds = task.seeds_for("cpp")
    assert len(seeds) == 4
    rng = random.Random(11)
    prop = OfflineProposer()
    pool = [_elite(task, s, cell=(i, 0, 0)) for i, s in enumerate(seeds)]
    parent = None
    for i in range(200):
        others = [e for e in pool if parent is None or e is not parent]
        child = prop.propose(_ctx(task, parent, rng.sample(others, k=min(2, len(others)))), rng)
        space = parse_params(child.source)
        assert set(child.params) == set(space.values), (child.origin, child.params)
        assert all(child.params[k] in space.values[k] for k in space.values), (child.origin, child.params)
        assert space.allows(child.params), (child.origin, child.params)
        assert child.task == name and child.language == "cpp"
        assert child.origin.startswith("offline:")
        assert child.origin.split(":", 1)[1] in OPERATORS
        pool.append(Elite(child, EvalResult(candidate_id=child.id, tier=5, times={"s": 1.0},
                                            ref_times={"s": 1.0})))
        parent = rng.choice(pool)


CONSTRAINED = """\
// @kf.param A in [1, 2, 4, 8]
// @kf.param B in [1, 2, 4, 8]
// @kf.require A * B <= 8
extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
    return 0;
}
"""


def test_children_respect_requires_that_exclude_settings():
    """The built-in seeds' requires exclude nothing; here half the grid is illegal."""
    base = load_task("axpb")
    seeds = [Seed("naive", "cpp", CONSTRAINED), Seed("alt", "cpp", CONSTRAINED.replace("A * B", "B * A"))]
    task = dataclasses.replace(base, seeds=seeds)
    space = parse_params(CONSTRAINED)
    assert 0 < len(list(space.settings())) < space.size()
    rng = random.Random(18)
    prop = OfflineProposer()
    pool = [_elite(task, s) for s in seeds]
    ops = Counter()
    for _ in range(200):
        parent = rng.choice(pool)
        child = prop.propose(_ctx(task, parent, [e for e in pool if e is not parent]), rng)
        ops[child.origin] += 1
        assert parse_params(child.source).allows(child.params), (child.origin, child.params)
        pool.append(Elite(child, EvalResult(candidate_id=child.id, tier=5, times={"s": 1.0},
                                            ref_times={"s": 1.0})))
    assert ops["offline:mutate_params"] > 20


@pytest.mark.parametrize("name", TASKS)
def test_without_parent_starts_from_baseline(name):
    task = load_task(name)
    base = task.baseline_seed("cpp")
    seeds = {s.source for s in task.seeds_for("cpp")}
    prop = OfflineProposer()
    rng = random.Random(12)
    ops = Counter()
    for _ in range(100):
        child = prop.propose(_ctx(task, None), rng)
        assert child.parent_id is None
        op = child.origin.split(":", 1)[1]
        ops[op] += 1
        if op == "mutate_params":
            assert child.source == base.source
            assert child.params != parse_params(base.source).default()
        elif op == "switch_strategy":
            assert child.source in seeds and child.source != base.source
        assert parse_params(child.source).allows(child.params)
    assert ops["mutate_params"] > 0
    assert set(ops) <= {"mutate_params", "switch_strategy", "toggle_simd", "toggle_parallel", "use_fma",
                        "add_parallel", "add_simd", "fast_exp", *cpu_edits.EDITS}


def test_parent_identity_is_recorded():
    task = load_task("matmul")
    parent = _elite(task, task.seeds_for("cpp")[2])
    meta = _meta([])
    child = OfflineProposer().propose(_ctx(task, parent, meta=meta, generation=7), random.Random(0))
    assert child.parent_id == parent.candidate.id
    assert child.prompt_id == "mp-0001"
    assert child.generation == 7 and child.island == 3
    assert child.id != parent.candidate.id


def test_proposals_differ_from_parent():
    task = load_task("matmul")
    parent = _elite(task, task.seeds_for("cpp")[2])
    rng = random.Random(13)
    prop = OfflineProposer()
    same = 0
    for _ in range(200):
        c = prop.propose(_ctx(task, parent), rng)
        same += (c.source == parent.candidate.source and c.params == parent.candidate.params)
    assert same < 10


@pytest.mark.parametrize("name", TASKS)
def test_operator_variety(name):
    task = load_task(name)
    seeds = task.seeds_for("cpp")
    pool = [_elite(task, s, cell=(i, 0, 0)) for i, s in enumerate(seeds)]
    rng = random.Random(14)
    prop = OfflineProposer()
    ops = Counter()
    for _ in range(200):
        parent = rng.choice(pool)
        ins = [e for e in pool if e is not parent]
        ops[prop.propose(_ctx(task, parent, ins), rng).origin] += 1
    assert len(ops) >= 4, ops
    assert all(o.startswith("offline:") for o in ops)


@pytest.mark.parametrize("name", TASKS)
def test_hints_raise_the_hinted_operator(name):
    task = load_task(name)
    seeds = task.seeds_for("cpp")
    last = seeds[2]                               # a seed of simple loops (the last ones are hand-tuned)
    if "#pragma omp" not in last.source:          # give it an OpenMP loop to toggle
        from kfray.proposers.loop_edits import add_parallel
        last = dataclasses.replace(last, source=add_parallel(last.source))
    parent = _elite(task, last)
    ins = [_elite(task, seeds[0])]
    prop = OfflineProposer()

    def frequency(meta, seed):
        rng = random.Random(seed)
        n = 300
        return sum(prop.propose(_ctx(task, parent, ins, meta), rng).origin == "offline:toggle_simd"
                   for _ in range(n)) / n

    plain = frequency(None, 15)
    no_hints = frequency(_meta([]), 15)
    hinted = frequency(_meta(["toggle_simd"] * 5), 15)
    assert plain > 0
    assert hinted > 2 * max(plain, no_hints), (plain, no_hints, hinted)
    assert hinted > 0.35


def test_unknown_hints_are_ignored():
    task = load_task("axpb")
    parent = _elite(task, task.seeds_for("cpp")[1])
    rng = random.Random(16)
    child = OfflineProposer().propose(_ctx(task, parent, meta=_meta(["no_such_operator"] * 3)), rng)
    assert child.origin.split(":", 1)[1] in OPERATORS


def test_toggle_simd_edits_only_a_pragma():
    task = load_task("axpb")
    parent = _elite(task, task.seeds_for("cpp")[1])   # axpb_omp: one "parallel for" loop
    rng = random.Random(17)
    prop = OfflineProposer()
    meta = _meta(["toggle_simd"] * 50)
    for _ in range(50):
        c = prop.propose(_ctx(task, parent, meta=meta), rng)
        if c.origin != "offline:toggle_simd":
            continue
        old = parent.candidate.source.splitlines()
        new = c.source.splitlines()
        assert len(old) == len(new)
        changed = [(a, b) for a, b in zip(old, new) if a != b]
        assert len(changed) == 1
        a, b = changed[0]
        assert "#pragma omp" in a and b.replace(" simd", "") == a.replace(" simd", "")
        assert c.params == parent.candidate.params
        return
    pytest.fail("toggle_simd never chosen despite a strong hint")


def test_loop_edits_compound_on_softmax():
    """Each loop edit is one step, and steps stack: the exponential made vectorizable, then the
    sum loop vectorized with its reduction clause, then the rows threaded."""
    from kfray.proposers.loop_edits import add_parallel, add_simd, fast_exp

    src = next(s for s in load_task("softmax").seeds_for("cpp") if s.name == "twopass").source
    assert fast_exp("int f() { return 0; }") is None
    step1 = fast_exp(src)
    assert "kf_fast_exp(" in step1 and "std::exp(" not in step1
    pragmas = set()
    for seed in range(20):
        out = add_simd(step1, random.Random(seed))
        pragmas |= {ln.strip() for ln in out.splitlines() if "#pragma omp simd" in ln} - {"#pragma omp simd"}
    assert pragmas == {"#pragma omp simd reduction(max:m)", "#pragma omp simd reduction(+:s)"}
    step3 = add_parallel(step1)
    lines = step3.splitlines()
    at = next(i for i, ln in enumerate(lines) if "parallel for" in ln)
    assert lines[at + 1].lstrip().startswith("for (int64_t r0 = 0")    # the outermost loop
    assert add_parallel(step3) is None                                   # it already has one
    # a loop that writes a scalar from outside in a way no clause covers is not vectorized
    assert add_simd("void g(float* y, int n) { float t = 0;\n  for (int i = 0; i < n; ++i) t = y[i] * t + 1; }",
                    random.Random(0)) is None


@pytest.mark.parametrize("name", TASKS)
def test_cuda_walk_uses_cuda_edits_and_fills_cells(name):
    """On CUDA the proposer edits sources (not only parameters): over 150 proposals the children
    reach at least 6 descriptor cells and keep the kf_forward signature and legal parameters."""
    from kfray.descriptors import describe
    from kfray.proposers.offline import operators_for

    task = load_task(name)
    seeds = task.seeds_for("cuda")
    rng = random.Random(7)
    prop = OfflineProposer()
    pool = []
    for s in seeds:
        c = Candidate(task=task.name, language="cuda", source=s.source, params=parse_params(s.source).default(),
                      cell=describe(s.source, "cuda"))
        pool.append(Elite(c, EvalResult(candidate_id=c.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0})))
    cells, ops = set(), Counter()
    for i in range(150):
        parent = rng.choice(pool)
        ctx = ProposalContext(task=task, language="cuda", parent=parent, inspirations=rng.sample(pool, k=2),
                              target_cell=None, meta_prompt=None, device_facts={}, island=0, generation=i + 1,
                              occupied={tuple(e.candidate.cell) for e in pool})
        child = prop.propose(ctx, rng)
        op = child.origin.split(":", 1)[1]
        assert op in operators_for("cuda") and op not in ("add_simd", "toggle_parallel")
        assert task.signature("cuda") in child.source, op
        space = parse_params(child.source)
        assert set(child.params) == set(space.values) and space.allows(child.params), (op, child.params)
        ops[op] += 1
        child.cell = describe(child.source, "cuda")
        cells.add(tuple(child.cell))
        pool.append(Elite(child, EvalResult(candidate_id=child.id, tier=5, times={"s": 1.0}, ref_times={"s": 1.0})))
    edits = {o for o in ops if o not in ("mutate_params", "switch_strategy", "recombine", "use_fma")}
    assert len(edits) >= 3, ops
    assert len(cells) >= 6, cells


def test_fma_contracts_float_arithmetic_not_index_arithmetic():
    from kfray.proposers.offline import _use_fma

    src = ("    for (int64_t i = kf_v * 4 + kf_t; i < n; i += s) y[i] = a * x[i] + b;\n"
           "    const int64_t j = row * cols + c;\n    float acc = w * v + u;\n    acc += p[k] * q[k];\n")
    out = _use_fma(src, random.Random(0))
    assert "i = kf_v * 4 + kf_t" in out and "j = row * cols + c" in out
    assert "y[i] = std::fma(a, x[i], b)" in out and "acc = std::fma(w, v, u)" in out
    assert "acc = std::fma(p[k], q[k], acc)" in out
