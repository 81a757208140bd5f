"""LLMProposer against a real HTTP server speaking the OpenAI chat API, through the real openai client."""
from __future__ import annotations

import time

import numpy as np
import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import ProposerConfig
from kfray.errors import ConfigError
from kfray.prompts.builder import build_messages
from kfray.proposers.base import Elite, MetaPrompt, ProposalContext
from kfray.proposers.llm import LLMProposer, extract_code, parse_sections
from kfray.tasks import load_task
from llm_server import ScriptedServer

GOOD_CODE = """\
#include <cmath>
#include <cstdint>
// @kf.param BLOCK in [64, 128, 256]
// @kf.param CHUNK in [1, 4, 16]
// @kf.require BLOCK >= 64
extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) { /* ... */ }
    return 0;
}"""
GOOD_ANSWER = f"Here is a faster kernel.\n\n```cpp\n{GOOD_CODE}\n```\nIt blocks by BLOCK."
FEEDBACK_REASON = "max abs error 3.1e-02 at y[17, 5] on r4096c256"


@pytest.fixture
def task():
    return load_task("softmax")


def _ctx(task, parent_result=None, meta=True):
    seed = task.seeds_for("cpp")[1]  # twopass
    parent = Candidate(task=task.name, language="cpp", source=seed.source, params={"CHUNK": 4}, island=1)
    result = parent_result or EvalResult(
        candidate_id=parent.id, tier=5, times={"r1024c1024": 0.002, "r4096c256": 0.001},
        ref_times={"r1024c1024": 0.004, "r4096c256": 0.003})
    insp_seed = task.seeds_for("cpp")[2]
    insp = Candidate(task=task.name, language="cpp", source=insp_seed.source)
    insp_res = EvalResult(candidate_id=insp.id, tier=5, times={"r1024c1024": 0.001},
                          ref_times={"r1024c1024": 0.004})
    mp = MetaPrompt(id="mp-7", generation=2, sections={
        "philosophy": "Memory traffic is the enemy.",
        "strategies": "Fuse the max and sum passes with an online softmax.",
        "pitfalls": "Do not forget the tail when cols is not a multiple of the vector width.",
        "analysis": "Compare achieved GB/s with the device bandwidth.",
    }) if meta else None
    return ProposalContext(
        task=task, language="cpp", parent=Elite(parent, result), inspirations=[Elite(insp, insp_res)],
        target_cell=(2, 1, 0), meta_prompt=mp,
        device_facts={"name": "Xeon test CPU", "memory_bandwidth_gbs": 120, "simd_width": 16},
        island=1, generation=3, directives=["Try a larger CHUNK.", "Keep the output written once."])


def _proposer(srv, **kw):
    cfg = ProposerConfig(kind="llm", base_url=srv.base_url, model="test-model", api_key_env="KFRAY_TEST_NO_KEY",
                         backoff_s=kw.pop("backoff_s", 0.01), max_retries=kw.pop("max_retries", 2),
                         timeout_s=10, **kw)
    return LLMProposer(cfg)


def test_good_answer_gives_candidate(task):
    with ScriptedServer([GOOD_ANSWER]) as srv:
        p = _proposer(srv)
        ctx = _ctx(task)
        c = p.propose(ctx, np.random.default_rng(0))
    assert c.source.strip() == GOOD_CODE.strip()
    assert c.no_code_reason == ""
    assert c.params == {"BLOCK": 64, "CHUNK": 4}  # CHUNK kept from the parent, BLOCK the first allowed
    assert c.parent_id == ctx.parent.candidate.id and c.prompt_id == "mp-7"
    assert c.origin == "llm:test-model" and c.island == 1 and c.generation == 3
    assert c.task == "softmax" and c.language == "cpp" and c.propose_seconds > 0
    assert p.usage["calls"] == 1 and p.usage["prompt_tokens"] > 0 and p.usage["completion_tokens"] > 0
    assert len(srv.requests) == 1 and srv.requests[0]["model"] == "test-model"


def test_rate_limit_is_retried(task):
    err = (429, {"error": {"message": "slow down", "type": "rate_limit", "code": "rate_limit"}}, {"Retry-After": "0"})
    with ScriptedServer([err, GOOD_ANSWER]) as srv:
        p = _proposer(srv, backoff_s=30.0)  # Retry-After: 0 overrides the long backoff
        t0 = time.monotonic()
        c = p.propose(_ctx(task), np.random.default_rng(0))
        assert time.monotonic() - t0 < 10
        assert len(srv.requests) == 2
    assert c.source.strip() == GOOD_CODE.strip()
    assert p.usage["failures"] == 0


def test_malformed_answer_is_tier0(task):
    with ScriptedServer(["I think you should unroll the loop, but I will not write code."]) as srv:
        c = _proposer(srv).propose(_ctx(task), np.random.default_rng(0))
    assert c.source == ""
    assert "no code block" in c.no_code_reason


def test_server_error_past_retries_is_tier0(task):
    err = (500, {"error": {"message": "backend exploded", "type": "server_error"}}, {})
    with ScriptedServer([err]) as srv:
        p = _proposer(srv, max_retries=2)
        c = p.propose(_ctx(task), np.random.default_rng(0))
        assert len(srv.requests) == 3  # first try + 2 retries
    assert c.source == ""
    assert srv.base_url in c.no_code_reason and "3 attempts" in c.no_code_reason
    assert p.usage["failures"] == 1


def test_client_error_is_not_retried(task):
    err = (400, {"error": {"message": "bad request", "type": "invalid_request_error"}}, {})
    with ScriptedServer([err]) as srv:
        c = _proposer(srv).propose(_ctx(task), np.random.default_rng(0))
        assert len(srv.requests) == 1
    assert c.source == "" and "not retried" in c.no_code_reason


def test_prompt_carries_context(task):
    parent_res = EvalResult(candidate_id="x", tier=4, reason=FEEDBACK_REASON)
    ctx = _ctx(task, parent_result=parent_res)
    with ScriptedServer([GOOD_ANSWER]) as srv:
        _proposer(srv).propose(ctx, np.random.default_rng(0))
        msgs = srv.requests[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user"]
    system, user = msgs[0]["content"], msgs[1]["content"]
    # the meta-prompt comes after the parent, and the system message is the same for every request,
    # so that a server's prompt cache reuses the task's sections and the parent (builder.system_message)
    assert "Memory traffic is the enemy." not in system and system in \
        {build_messages(_ctx(task, meta=False), mode)[0]["content"] for mode in ("diff", "rewrite")}
    assert user.index(task.signature("cpp")) < user.index(FEEDBACK_REASON) < user.index("Memory traffic is the enemy.")
    assert task.signature("cpp") in user
    assert FEEDBACK_REASON in user
    assert "memory_bandwidth_gbs: 120" in user and "name: Xeon test CPU" in user
    assert "online softmax" in user and "tail when cols" in user
    assert "- Try a larger CHUNK." in user
    assert "memory level 2" in user
    assert "r4096c256: rows=4096, cols=256" in user
    assert "@kf.param" in user and "```cpp" in user


def test_prompt_without_parent_shows_baseline(task):
    ctx = _ctx(task, meta=False)
    ctx.parent, ctx.inspirations, ctx.target_cell = None, [], None
    user = build_messages(ctx)[1]["content"]
    assert task.baseline_seed("cpp").source.strip().splitlines()[-1] in user
    assert "baseline" in user.lower()


def test_extract_code():
    body = 'extern "C" int kf_forward(float* y) { return 0; }'
    assert extract_code(f"```cpp\n{body}\n```", "cpp").strip() == body
    for tag in ("c++", "cuda", "cu", "c", "sycl", ""):
        assert extract_code(f"text\n```{tag}\n{body}\n```\n", "cuda").strip() == body
    # the largest block holding kf_forward wins; a helper snippet without it is ignored
    big = "#include <cmath>\n" + body + "\n// more\n"
    text = f"```cpp\nint helper();\n```\n```cpp\n{body}\n```\n```cpp\n{big}```"
    assert extract_code(text, "cpp") == big
    assert extract_code("```python\nkf_forward = 1\n```", "cpp") is None
    # a suite task's kernel is a ModelNew file (python) or an extension (cuda), by what it defines
    new = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass"
    assert extract_code(f"```python\n{new}\n```", "suite").strip() == new
    ext = '#include <torch/extension.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &f); }'
    assert extract_code(f"```cuda\n{ext}\n```", "suite").strip() == ext
    assert extract_code("```python\nclass Model:\n    pass\n```", "suite") is None
    assert extract_code("no code at all", "cpp") is None
    assert extract_code("```cpp\nint f() { return 0; }\n```", "cpp") is None
    cl = "__kernel void softmax_rows(__global const float* x) {}"
    assert extract_code(f"```opencl\n// @kf.launch softmax_rows global=(rows)\n{cl}\n```", "opencl").strip().endswith(cl)


def test_rewrite_meta_prompt(task):
    answer = """Here you go:
```yaml
philosophy: |
  Bandwidth first.
strategies: |
  - Single pass with an online max.
pitfalls: |
  - Races on the row sum.
analysis: |
  Compare to 4 TB/s.
```"""
    sections = _ctx(task).meta_prompt.sections
    with ScriptedServer([answer, "no mapping here"]) as srv:
        p = _proposer(srv)
        new = p.rewrite_meta_prompt(sections, "speedup stalled at 1.2x")
        assert p.rewrite_meta_prompt(sections, "again") is None
        assert "speedup stalled at 1.2x" in srv.requests[0]["messages"][1]["content"]
    assert set(new) == {"philosophy", "strategies", "pitfalls", "analysis"}
    assert new["philosophy"] == "Bandwidth first."
    assert parse_sections('{"philosophy": "a", "strategies": "b", "pitfalls": "c", "analysis": "d"}') == \
        {"philosophy": "a", "strategies": "b", "pitfalls": "c", "analysis": "d"}
    assert parse_sections("```yaml\nphilosophy: a\n```") is None


def test_a_meta_prompt_rewrite_is_held_to_the_prompt_budget():
    """On a local endpoint's budget the rewrite request keeps the sections it rewrites, the scores and
    the ask, and drops the other parent's sections first; a verbose rewrite is cut to a bound, so
    it cannot grow the next prompts (and the next rewrite) past the budget."""
    from kfray.prompts.budget import estimate_tokens
    from kfray.prompts.population import MAX_SECTION_CHARS, SECTIONS, MetaPromptPopulation

    verbose = "```yaml\n" + "".join(f"{k}: |\n" + "".join(f"  {k} line {i} " + "x" * 60 + "\n" for i in range(40))
                                     for k in SECTIONS) + "```"
    asked = {}
    for budget in (0, 600):
        with ScriptedServer([verbose]) as srv:
            p = _proposer(srv, prompt_tokens=budget)
            pop = MetaPromptPopulation(size=3, evolve_every=1000, seed=1)
            child = pop.evolve(p.rewrite_meta_prompt)
            asked[budget] = srv.requests[0]["messages"]
        assert all(len(child.sections[k]) <= MAX_SECTION_CHARS and child.sections[k].startswith(f"{k} line 0")
                   for k in SECTIONS), child.sections
    whole, held = asked[0][1]["content"], asked[600][1]["content"]
    assert "Other parent's sections" in whole and "Other parent's sections" not in held
    for text in (whole, held):
        assert "### strategies" in text and "mean child score" in text and "```yaml code block" in text
    assert sum(estimate_tokens(m["content"]) for m in asked[600]) <= 600 < sum(estimate_tokens(m["content"])
                                                                              for m in asked[0])


def test_config_errors(monkeypatch):
    for var in ("OPENAI_BASE_URL", "KFRAY_MODEL", "KFRAY_TEST_NO_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="KFRAY_MODEL"):
        LLMProposer(ProposerConfig(kind="llm", base_url="http://127.0.0.1:1/v1"))
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL"):
        LLMProposer(ProposerConfig(kind="llm", model="m"))
    with pytest.raises(ConfigError, match="KFRAY_TEST_NO_KEY"):
        LLMProposer(ProposerConfig(kind="llm", base_url="https://api.example.com/v1", model="m",
                                   api_key_env="KFRAY_TEST_NO_KEY"))
    # environment variables fill in what the config leaves empty
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:9/v1")
    monkeypatch.setenv("KFRAY_MODEL", "env-model")
    p = LLMProposer(ProposerConfig(kind="llm", api_key_env="KFRAY_TEST_NO_KEY"))
    assert p.model == "env-model" and p.base_url == "http://localhost:9/v1"


def test_a_block_whose_closing_fence_is_missing():
    """A small model forgets the closing fence: a whole file in the open block is taken. An answer cut
    off inside its block is not, and the reason says it was cut off rather than "no code block"."""
    from kfray.proposal import ProposalContext
    from kfray.proposers.llm import LLMProposer
    from kfray.tasks import load_task

    body = '#include <cstdint>\nextern "C" int kf_forward(const float* x, float* y, int64_t n) {\n' \
        '    for (int64_t i = 0; i < n; ++i) { y[i] = x[i] > 0.f ? x[i] : 0.f; }  // "{" in a comment\n' \
        '    return 0;\n}\n'
    assert extract_code(f"Here it is:\n```cpp\n{body}", "cpp").strip() == body.strip()
    cut = body[:body.index("return")]
    assert extract_code(f"```cpp\n{cut}", "cpp") is None
    ctx = ProposalContext(task=load_task("axpb"), language="cpp", parent=None, inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={}, island=0, generation=1)
    code, why = LLMProposer.read_answer(f"```cpp\n{cut}", ctx, "rewrite")
    assert code is None and why.startswith("the answer ends inside its code block") and "max_tokens" in why
    whole = body.replace("kf_forward", "kf_other")                  # whole, but not the kernel: not "cut off"
    code, why = LLMProposer.read_answer(f"```cpp\n{whole}", ctx, "rewrite")
    assert code is None and why.startswith("no code block in the model's answer"), why
    model = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    assert extract_code(f"```python\n{model}", "suite").strip() == model.strip()
    assert extract_code(f"```python\n{model}    def half(self", "suite") is None
