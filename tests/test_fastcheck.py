"""The native checks (kfray/eval/fastcheck.c) and the numpy ones judge alike, and pooled input
draws stay fresh: the two changes that made an evaluation of a fast kernel ~2.5x cheaper."""
import numpy as np
import pytest

from kfray.eval import fastcheck
from kfray.eval.closeness import compare
from kfray.eval.correctness import same
from kfray.eval.draws import InputPool

POISON = float(np.float32(3e29))


def _cases(dtype):
    rng = np.random.default_rng(7)
    w = rng.standard_normal(50_001).astype(dtype)
    noise = (1e-7 if dtype == np.float32 else 1e-12) * rng.standard_normal(w.size)
    good = (w + noise).astype(dtype)
    yield "right", good, w, None, False
    bad = good.copy(); bad[123] = np.nan
    yield "one NaN", bad, w, None, False
    held = good.copy(); held[5::1000] = -POISON
    yield "poison left", held, w, POISON, False
    tail = good.copy(); tail[-300:] = 0
    yield "wrong tail", tail, w, None, False
    yield "wrong tail, suite rule", tail, w, None, True
    few = good.copy(); few[::97] += 1
    yield "1% off", few, w, None, False
    yield "1% off, suite rule", few, w, None, True
    inf = good.copy(); inf[9] = np.inf
    yield "an inf", inf, w, None, False
    flat = (1 / 512 + 1e-6 * rng.standard_normal(w.size)).astype(dtype)
    yield "constant on a flat reference", np.full_like(flat, 1 / 512), flat, None, False
    yield "flat reference, right", flat.copy(), flat, None, False
    both = good.copy(); ref = w.copy(); both[7] = ref[7] = np.nan
    yield "NaN where the reference has one", both, ref, None, True
    yield "all zero", np.zeros_like(w), w, None, False


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_and_numpy_checks_reach_the_same_verdicts(dtype, monkeypatch):
    assert fastcheck._lib() is not None, "the native helper did not build (is a C compiler on PATH?)"
    native = [(name, compare("y", g, w, 1e-4, 1e-5, p, every=e)) for name, g, w, p, e in _cases(dtype)]
    monkeypatch.setitem(fastcheck._state, "lib", None)         # the numpy path
    numpy = [(name, compare("y", g, w, 1e-4, 1e-5, p, every=e)) for name, g, w, p, e in _cases(dtype)]
    for (name, a), (_, b) in zip(native, numpy):
        assert (a is None) == (b is None), (name, a, b)
        if a is not None:
            assert a.split(":")[0:2] == b.split(":")[0:2], (name, a, b)     # same rule, same figures
    verdicts = dict(native)
    assert verdicts["right"] is None and verdicts["flat reference, right"] is None
    assert "never written" in verdicts["one NaN"]
    assert "still hold the value" in verdicts["poison left"]
    assert "every element must be within it" in verdicts["wrong tail, suite rule"]
    assert verdicts["1% off"] is not None and verdicts["an inf"] is not None
    assert "variation about its mean" in verdicts["constant on a flat reference"]
    assert verdicts["NaN where the reference has one"] is not None     # as torch.allclose without equal_nan
    assert verdicts["all zero"] is not None


def test_input_checks_see_one_changed_element():
    a = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)
    b = a.copy()
    assert same(a, b)
    b[-1] = np.nextafter(b[-1], np.float32(np.inf))
    assert not same(a, b)
    n1, n2 = np.full(4, np.nan), np.full(4, np.nan)
    n2.view(np.uint64)[0] |= 1                       # another NaN payload: still NaN, still equal
    assert same(n1, n2)


def test_pooled_draws_are_fresh_normal_and_independent():
    pool, rng = InputPool(), np.random.default_rng(3)
    xs = [pool.normal(rng, (256, 1024), np.float32) for _ in range(8)]
    assert all(x.dtype == np.float32 and x.shape == (256, 1024) for x in xs)
    for i in range(len(xs)):
        for j in range(i):
            c = np.corrcoef(xs[i].ravel()[:50_000], xs[j].ravel()[:50_000])[0, 1]
            assert abs(c) < 0.05, "two draws are correlated: a kernel reading the wrong buffer could pass"
    allv = np.concatenate([x.ravel() for x in xs])
    assert abs(allv.mean()) < 0.05 and 0.6 < allv.std() < 1.4
    y = pool.normal(rng, (4,), np.float64)
    assert y.dtype == np.float64
