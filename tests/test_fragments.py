"""An answer that rewrote only part of its parent is made whole from the parent before its first build
(kfray/proposers/fragments.py): through the real proposer and a scripted OpenAI-compatible server,
built by the CPU backend's own compile and run."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig, ProposerConfig
from kfray.eval.backends.cpu import CpuBackend
from kfray.proposers.base import Elite, ProposalContext
from kfray.proposers.fragments import complete_from_parent
from kfray.proposers.llm import LLMProposer
from kfray.tasks import load_task
from llm_server import ScriptedServer

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

# What a 1.5B model wrote back in a 40-minute run, asked for the whole file of axpb's stream seed:
# kf_forward alone, still calling the parent's kf_slice and naming its parameter SLICE.
FRAGMENT = """\
#include <cstdint>
#include <omp.h>
extern "C" int kf_forward(const float* __restrict x, float* __restrict y, float a, float b, int64_t n) {
    if (n < (1 << 14)) { kf_slice(x, y, a, b, 0, n); return 0; }   // too small to share
    const int64_t piece = SLICE > 0 ? SLICE : 4096, pieces = (n + piece - 1) / piece;
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; ++p)
        kf_slice(x, y, a, b, p * piece, p * piece + piece < n ? p * piece + piece : n);
    return 0;
}"""

WHOLE = """\
#include <cstdint>
extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
    return 0;
}"""


def _ctx(task, parent: Candidate) -> ProposalContext:
    res = EvalResult(candidate_id=parent.id, tier=5, times={"n": 1e-3}, ref_times={"n": 2e-3})
    return ProposalContext(task=task, language="cpp", parent=Elite(parent, res), inspirations=[],
                           target_cell=(0, 0, 0), meta_prompt=None, device_facts={}, island=0, generation=1)


def _propose(answer: str):
    task = load_task("axpb")
    seed = next(s for s in task.seeds_for("cpp") if s.name == "stream")
    parent = Candidate(task="axpb", language="cpp", source=seed.source,
                       params={"NT": 0, "UNROLL": 2, "PF": 0, "SLICE": 65536})
    with ScriptedServer([f"Here it is.\n\n```cpp\n{answer}\n```\n"]) as srv:
        p = LLMProposer(ProposerConfig(kind="llm", base_url=srv.base_url, model="m", api_key_env="KFRAY_TEST_NO_KEY",
                                       edit_mode="rewrite", timeout_s=10))
        cand = p.propose(_ctx(task, parent), np.random.default_rng(0))
    return cand, p.last, seed.source


def _axpb(artifact: str, n: int) -> float:
    """The largest error of the built kernel's y against a * x + b, n elements."""
    lib = ctypes.CDLL(artifact)
    fn = lib.kf_forward
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_int64]
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    y = np.zeros(n, np.float32)
    assert fn(x.ctypes.data, y.ctypes.data, 1.5, -0.25, n) == 0
    return float(np.abs(y - (1.5 * x - 0.25)).max())


@needs_gxx
def test_an_answer_that_rewrote_only_kf_forward_is_built_with_its_parents_helpers(tmp_path):
    cand, last, parent_src = _propose(FRAGMENT)
    assert cand.no_code_reason == "", cand.no_code_reason
    assert last["borrowed"] == ["SLICE", "kf_slice"], last
    assert cand.source.count("static void kf_slice(") == 1                  # the parent's, once
    assert "schedule(static)" in cand.source and "schedule(dynamic)" not in cand.source   # the answer's kf_forward
    assert cand.params["SLICE"] == 65536                                    # the parent's setting, kept
    build = CpuBackend(EvalConfig(cache_dir=str(tmp_path / "cache"))).compile(cand.source, cand.params, None)
    for n in (1000, 1 << 20):                                               # both of the answer's paths
        assert _axpb(build.artifact, n) < 1e-5


def test_an_answer_that_defines_all_it_uses_is_taken_as_written():
    cand, last, _ = _propose(WHOLE)
    assert cand.source.strip() == WHOLE.strip()
    assert last["borrowed"] == []


def test_a_helper_the_answer_rewrites_replaces_the_parents():
    parent = ("#include <cstdint>\n// @kf.param B in [8, 16]\n"
              "static float kf_f(float v) { return v; }\n"
              "static void kf_row(float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = kf_f(y[i]); }\n"
              'extern "C" int kf_forward(float* y, int64_t n) { kf_row(y, n); return 0; }\n')
    answer = ("static float kf_f(float v) { return 2 * v; }\n"
              'extern "C" int kf_forward(float* y, int64_t n) { for (int64_t i = 0; i < n; i += B) kf_row(y + i, B); '
              "return 0; }\n")
    whole, borrowed = complete_from_parent(answer, parent)
    assert borrowed == ["B", "kf_row"]
    assert "return 2 * v;" in whole and "return v;" not in whole
    assert whole.index("kf_f(float v)") < whole.index("kf_row(float* y") < whole.index("i += B")
    assert whole.count("kf_forward(") == 1 and "// @kf.param B in [8, 16]" in whole
