"""SEARCH/REPLACE edits (pure), the per-endpoint slot bookkeeping (pure), and the prompt budget."""
from __future__ import annotations

import time

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.prompts.budget import Section, estimate_tokens, fit
from kfray.prompts.builder import build_messages
from kfray.proposal import Elite, ProposalContext
from kfray.proposers.diff_edit import EditError, apply_edits, has_edits, parse_edits
from kfray.proposers.slots import LINGER_S, Slots, default_limit
from kfray.tasks import load_task

PARENT = """\
#include <cstdint>
extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        y[i] = a * x[i] + b;
    return 0;
}
"""


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def test_apply_one_edit():
    answer = "Parallelise the loop.\n" + block("    for (int64_t i = 0; i < n; ++i)",
                                              "    #pragma omp parallel for\n    for (int64_t i = 0; i < n; ++i)")
    out = apply_edits(PARENT, parse_edits(answer))
    assert "#pragma omp parallel for\n    for (int64_t i = 0; i < n; ++i)\n        y[i]" in out
    assert out.count("kf_forward") == 1 and out.endswith("}\n")


def test_several_edits_in_order_and_fenced():
    answer = ("```cpp\n" + block("#include <cstdint>", "#include <cstdint>\n#include <cmath>") + "\n```\n"
              + block("        y[i] = a * x[i] + b;", "        y[i] = std::fma(a, x[i], b);"))
    edits = parse_edits(answer)
    assert len(edits) == 2
    out = apply_edits(PARENT, edits)
    assert out.startswith("#include <cstdint>\n#include <cmath>\n") and "std::fma(a, x[i], b)" in out


def test_reindented_search_still_matches():
    # small models lose the indentation; the lines match with whitespace ignored
    answer = block("for (int64_t i = 0; i < n; ++i)\n  y[i] = a * x[i] + b;",
                   "    for (int64_t i = 0; i < n; ++i) y[i] = b + a * x[i];")
    out = apply_edits(PARENT, parse_edits(answer))
    assert "y[i] = b + a * x[i];" in out and "a * x[i] + b" not in out


def test_a_nearly_copied_block_matches_only_when_unambiguous():
    # the model wrote `float` for `int64_t` in the loop header: 90% alike, one such window
    answer = block("    for (float i = 0; i < n; ++i)\n        y[i] = a * x[i] + b;",
                   "    for (int64_t i = 0; i < n; ++i)\n        y[i] = std::fma(a, x[i], b);")
    assert "std::fma(a, x[i], b)" in apply_edits(PARENT, parse_edits(answer))
    with pytest.raises(EditError, match="does not match"):
        apply_edits(PARENT, parse_edits(answer), fuzzy=0)
    with pytest.raises(EditError, match="does not match"):      # far from anything: no guess
        apply_edits(PARENT, parse_edits(block("    while (k < m) z[k] = 0;", "")))


def test_no_match_names_block_and_closest_line():
    answer = block("#include <cstdint>", "#include <cstdint>\n#include <omp.h>") + "\n" + \
        block("    for (int i = 0; i < n; i++)", "    for (int i = 0; i < n; i += 2)")
    with pytest.raises(EditError) as e:
        apply_edits(PARENT, parse_edits(answer))
    msg = str(e.value)
    assert "SEARCH block 2 of 2 does not match the parent" in msg
    assert "'for (int i = 0; i < n; i++)'" in msg and "closest parent line 4" in msg  # block 1 added a line above


def test_malformed_and_empty():
    assert not has_edits("just prose") and parse_edits("just prose") == []
    with pytest.raises(EditError, match="malformed"):
        parse_edits("<<<<<<< SEARCH\nfoo\n>>>>>>> REPLACE")       # no ======= line
    with pytest.raises(EditError, match="no SEARCH/REPLACE block"):
        apply_edits(PARENT, [])
    with pytest.raises(EditError, match="block 1 of 1 is empty"):
        apply_edits(PARENT, parse_edits(block("", "int x;")))


def test_slots_fifo_limit_and_lease():
    s = Slots(limit=1)
    assert s.try_take("a", now=0.0, lease_s=10)
    assert not s.try_take("b", now=0.0) and not s.try_take("c", now=0.0)
    s.release("a")
    assert not s.try_take("c", now=1.0)          # b queued first: c waits its turn
    assert s.try_take("b", now=1.0) and not s.try_take("c", now=1.0)
    assert s.renew("b", now=5.0, lease_s=10)
    assert not s.try_take("c", now=14.0)         # b's renewed lease runs to 15
    assert s.try_take("c", now=15.5)             # b died holding it: its lease ran out
    assert s.stats()["peak"] == 1 and s.stats()["granted"] == 3
    assert default_limit("http://127.0.0.1:8080/v1", 0) == 1
    assert default_limit("https://api.example.com/v1", 0) == 16
    assert default_limit("http://localhost:8080/v1", 3) == 3


def test_slots_serve_the_earliest_batch_first_then_arrival():
    s = Slots(limit=1)
    assert s.try_take("a1", now=0.0, rank=1.0)
    assert not s.try_take("b1", now=0.1, rank=2.0)      # island b's batch began after a's
    assert not s.try_take("a2", now=0.2, rank=1.0)      # a's next request arrives later, ranks first
    s.release("a1")
    assert not s.try_take("b1", now=0.3) and s.try_take("a2", now=0.3)
    s.release("a2")
    assert not s.try_take("c", now=0.4, rank=2.0)       # b's rank and later: b first (arrival)
    assert s.try_take("b1", now=0.4) and s.stats()["waiting"] == 1
    s.release("b1")
    assert s.try_take("c", now=0.5)
    assert s.stats() == {"limit": 1, "in_flight": 1, "waiting": 0, "granted": 4, "peak": 1}
    # a slot freed with the time lingers for the next request of its batch: a later batch's
    # waiter polling in between does not cut in; after LINGER_S it may
    s.release("c", now=1.0)
    assert not s.try_take("d", now=1.0 + LINGER_S / 2, rank=9.0)
    assert s.try_take("c2", now=1.0 + LINGER_S / 2 + 0.01, rank=2.0)
    s.release("c2", now=2.0)
    assert not s.try_take("d", now=2.0 + LINGER_S / 2) and s.try_take("d", now=2.0 + LINGER_S)


def test_a_request_outside_a_batch_frees_its_slot_at_once_and_a_batchs_lingers(monkeypatch):
    """EndpointSlots without Ray (a script's proposer): a request sent with no batch rank gives its
    slot straight back, so the caller's next request or another waiter is not held LINGER_S; a
    request of a batch keeps the slot for that batch's next one."""
    import ray

    from kfray.proposers.slots import EndpointSlots, LocalSlots

    monkeypatch.setattr(ray, "is_initialized", lambda: False)     # the process-wide slots, whatever else runs
    ep = EndpointSlots("http://127.0.0.1:1/v1-slots-test", 1)
    local = ep._backend()
    assert isinstance(local, LocalSlots)
    with ep.hold("alone"):
        assert not local.slots.try_take("waiter", time.monotonic(), rank=time.time() + 60)
    assert local.slots.linger is None
    assert local.slots.try_take("waiter", time.monotonic())       # free now, to any waiter
    local.release("waiter")
    with ep.hold("batch-1", rank=5.0):
        pass
    assert local.slots.linger is not None and local.slots.linger[0] == 5.0
    assert not local.slots.try_take("later-batch", time.monotonic(), rank=6.0)
    assert local.slots.try_take("batch-2", time.monotonic(), rank=5.0)


def test_fit_keeps_essentials_and_drops_by_priority():
    secs = [Section("A" * 320), Section("B" * 3200, 5), Section("C" * 320, 1), Section("D" * 32)]
    text, dropped = fit(secs, budget_tokens=250)
    assert dropped == [1] and text == "\n".join(["A" * 320, "C" * 320, "D" * 32])
    assert fit(secs, 0)[1] == []
    assert estimate_tokens("x" * 320) == 101


def _ctx(insp_lines: int = 60):
    task = load_task("softmax")
    seeds = task.seeds_for("cpp")
    parent = Candidate(task="softmax", language="cpp", source=seeds[1].source)
    res = EvalResult(candidate_id=parent.id, tier=5, times={"r1024c1024": 0.002}, ref_times={"r1024c1024": 0.004})
    big = seeds[2].source + "\n".join(f"// filler line {i} " + "x" * 50 for i in range(insp_lines))
    insp = Elite(Candidate(task="softmax", language="cpp", source=big), res)
    return ProposalContext(task=task, language="cpp", parent=Elite(parent, res), inspirations=[insp],
                           target_cell=None, meta_prompt=None, device_facts={"cores": 2}, island=0,
                           generation=1, directives=["Try a larger ROW_STEP."])


def test_prompt_budget_keeps_parent_drops_inspirations():
    ctx = _ctx()
    full = build_messages(ctx, "diff", 0)[1]["content"]
    small = build_messages(ctx, "diff", 1500)[1]["content"]
    parent_src = ctx.parent.candidate.source.strip()
    assert "filler line 5" in full and "filler line 5" not in small
    for text in (full, small):
        assert parent_src in text                      # whole, so SEARCH lines can be copied
        assert "<<<<<<< SEARCH" in text and "kf_forward" in text and "correct; speedup" in text
    assert "Try a larger ROW_STEP." in small            # cheap, useful steering stays
    assert estimate_tokens(small) < 1500 < estimate_tokens(full)


def test_repair_prompt_shows_diagnostics_not_inspirations():
    ctx = _ctx()
    bad = Candidate(task="softmax", language="cpp", source=PARENT)
    ctx.parent = Elite(bad, EvalResult(candidate_id=bad.id, tier=1,
                                       reason="kernel.cpp:4:9: error: 'z' was not declared in this scope"))
    ctx.repair = True
    user = build_messages(ctx, "diff", 3000)[1]["content"]
    assert "it failed; fix it" in user and "compile error:" in user and "'z' was not declared" in user
    assert PARENT.strip() in user and "filler line" not in user and "Try a larger" not in user
