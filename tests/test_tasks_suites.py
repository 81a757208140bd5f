"""The shipped llama32-1b suite: every operator loads at its real shapes, its reference runs at the
small shape set, and the naive RMSNorm seed is correct through the sandbox."""
from __future__ import annotations

import numpy as np

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.tasks import discover, load_task, resolve, suite_names

OPS = {"rmsnorm", "rope", "swiglu_mlp", "attention_prefill", "attention_decode", "decode_gemv"}


def test_llama_suite_loads_at_real_shapes():
    assert "llama32-1b" in suite_names()
    found = dict(discover("llama32-1b"))
    assert {r.rsplit("/", 1)[1] for r in found} == OPS and all(e is None for e in found.values())
    assert load_task("suite:llama32-1b/rmsnorm").shapes["prefill"] == {"tokens": 2048, "hidden": 2048}
    assert load_task("suite:llama32-1b/decode_gemv").shapes["lm_head"] == {"n_out": 128256, "n_in": 2048}
    att = load_task("suite:llama32-1b/attention_prefill")
    assert att.shapes["seq2048"] == {"q_heads": 32, "kv_heads": 8, "seq": 2048, "head_dim": 64}
    assert all(load_task(r).languages == ["cpp", "cuda"] for r in found)
    assert resolve("llama32-1b") == sorted(found)


def test_llama_references_on_the_small_set():
    rng = np.random.default_rng(0)
    t = load_task("suite:llama32-1b/attention_decode@small")
    a = t.make_args("kv256", rng)
    # decode attention is prefill attention's last row when the query is the last token
    pre = load_task("suite:llama32-1b/attention_prefill@small")
    b = pre.make_args("seq64", rng)
    last = {"q": b["q"][:, -1, :], "k_cache": b["k"], "v_cache": b["v"], "scale": b["scale"]}
    assert np.allclose(t.reference(last)["o"], pre.run_reference(b)["o"][:, -1, :], atol=1e-5)
    assert t.run_reference(a)["o"].shape == (32, 64)
    r = load_task("suite:llama32-1b/rope@small")
    a = r.make_args("t16", rng)
    a["cos"][:], a["sin"][:] = 1.0, 0.0                       # angle 0: the identity
    assert np.allclose(r.run_reference(a)["q_out"], a["q"])


def test_naive_rmsnorm_seed_is_correct(tmp_path):
    from kfray.eval.evaluator import Evaluator

    ref = "suite:llama32-1b/rmsnorm@small"
    seed = load_task(ref).baseline_seed("cpp")
    assert seed is not None and "double ss" in load_task(ref).evolve_region("cpp")
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path / "cache"), timeout_s=30))
    try:
        r = EvalResult.from_dict(ev.evaluate(Candidate(task=ref, language="cpp", source=seed.source, params={})))
        assert r.tier == 5, r.reason
        assert set(r.times) == {"t4", "t64"}
    finally:
        ev.shutdown()
