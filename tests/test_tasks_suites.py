"""The shipped llama32-1b suite: every operator loads at its real shapes, its reference runs at the
small shape set, and the naive RMSNorm seed is correct through the sandbox."""
from __future__ import annotations

import numpy as np

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.tasks import discover, load_task, resolve, suite_names

OPS = {"rmsnorm", "rope", "swiglu_mlp", "attention_prefill", "attention_decode", "decode_gemv"}


# Llama 3.2 1B's published configuration (config.json): the suite's shapes must be this model's.
LLAMA32_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256}


def test_llama_suite_loads_at_real_shapes():
    """Every operator loads, and every shape of every operator is the model's own: one hidden size,
    heads x head_dim = hidden, each projection of the decode GEMVs sized from the same config."""
    assert "llama32-1b" in suite_names()
    found = dict(discover("llama32-1b"))
    assert {r.rsplit("/", 1)[1] for r in found} == OPS and all(e is None for e in found.values())
    assert all(load_task(r).languages == ["cpp", "cuda"] for r in found)
    assert resolve("llama32-1b") == sorted(found)
    c = LLAMA32_1B
    hidden, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    assert heads * hd == hidden
    shapes = {r.rsplit("/", 1)[1]: load_task(r).shapes for r in found}
    for op in ("rmsnorm", "swiglu_mlp"):
        assert {s["hidden"] for s in shapes[op].values()} == {hidden}, op
    assert {s["inter"] for s in shapes["swiglu_mlp"].values()} == {c["intermediate_size"]}
    for op in ("rope", "attention_prefill", "attention_decode"):
        for s in shapes[op].values():
            assert (s["q_heads"], s["kv_heads"], s["head_dim"]) == (heads, kv, hd), op
    gemv = {name: (s["n_out"], s["n_in"]) for name, s in shapes["decode_gemv"].items()}
    assert gemv == {"qkv": ((heads + 2 * kv) * hd, hidden), "o": (hidden, hidden),
                    "gate_up": (2 * c["intermediate_size"], hidden), "down": (hidden, c["intermediate_size"]),
                    "lm_head": (c["vocab_size"], hidden)}
    # prefill shapes are a long sequence, decode shapes one token
    assert max(s["tokens"] for s in shapes["rmsnorm"].values()) >= 1024
    assert min(s["tokens"] for s in shapes["rmsnorm"].values()) == 1


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
