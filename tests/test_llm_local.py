"""The LLM loop against a local server: one request in flight per endpoint (shared by islands in
other processes too), streaming with an idle timeout, diff proposals, and repair before charging.
A real openai client talks HTTP to tests/llm_server.py on 127.0.0.1."""
from __future__ import annotations

import random
import re
import threading
import time

import pytest

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig, ProposerConfig, SearchConfig
from kfray.driver.ledger import TaskLedger
from kfray.proposers.llm import LLMProposer
from kfray.search.island import Island
from llm_server import ScriptedServer

ANSWER = "```cpp\nextern \"C\" int kf_forward(const float* x, float* y) { return 0; }\n```"
MSGS = [{"role": "user", "content": "write a kernel"}]


def _cfg(srv, **kw) -> ProposerConfig:
    base = dict(kind="llm", base_url=srv.base_url, model="local-model", api_key_env="KFRAY_TEST_NO_KEY",
                backoff_s=0.01, max_retries=1, timeout_s=10.0)
    base.update(kw)
    return ProposerConfig(**base)


def _burst(srv, n: int, **kw) -> list:
    """n islands (threads, each its own proposer) ask the same endpoint at once."""
    out = [None] * n

    def one(i):
        try:
            out[i] = LLMProposer(_cfg(srv, **kw)).complete(MSGS)
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_one_request_in_flight_none_sent_twice():
    # a server that answers one request at a time, 0.4 s each; the last of 5 waits 1.6 s, longer
    # than the 1.2 s timeout: waiting for the slot must not count against it
    with ScriptedServer([ANSWER], delay_s=0.4, serial=True) as srv:
        got = _burst(srv, 5, timeout_s=1.2)
        assert all(isinstance(g, str) and "kf_forward" in g for g in got), got
        assert len(srv.requests) == 5 and srv.max_in_flight == 1


def test_the_same_prompt_asked_again_is_sampled_afresh():
    """A server that caches prompts (llama.cpp) restores the sampler with the prompt's state, so a
    request without a seed of its own got the same answer to the same prompt, a duplicate kernel
    each time: every request carries a fresh seed."""
    with ScriptedServer([ANSWER]) as srv:
        p = LLMProposer(_cfg(srv))
        for _ in range(3):
            p.complete(MSGS)
        seeds = [r.get("seed") for r in srv.requests]
        assert all(isinstance(x, int) for x in seeds) and len(set(seeds)) == 3, seeds


def test_without_the_limit_the_server_is_flooded():
    # the failure the limit prevents: 5 at once queue in the server past the timeout and are resent
    with ScriptedServer([ANSWER], delay_s=0.5, serial=True) as srv:
        got = _burst(srv, 5, timeout_s=1.0, max_concurrent=5, max_retries=0)
        time.sleep(0.5)
        assert srv.max_in_flight > 1
        # the 3rd to 5th waited 1.5 to 2.5 s in the server's queue, past the 1 s timeout: they failed
        failed = [g for g in got if isinstance(g, Exception)]
        assert len(failed) >= 3 and all("APITimeoutError" in str(g) for g in failed), got


def test_stream_timeout_is_idle_time_not_total():
    # 12 tokens 0.1 s apart: 1.2 s in all, never more than 0.1 s silent; a 0.5 s timeout holds
    text = " ".join(["word"] * 11) + " " + ANSWER
    with ScriptedServer([text], token_delay_s=0.1) as srv:
        p = LLMProposer(_cfg(srv, timeout_s=0.5, max_retries=0))
        assert p.complete(MSGS).endswith(ANSWER)
        assert srv.requests[0]["stream"] is True and len(srv.requests) == 1
        assert p.usage["completion_tokens"] > 0 and p.usage["prompt_tokens"] > 0
    with ScriptedServer([ANSWER], delay_s=1.0) as srv:       # silent past the timeout: dropped
        p = LLMProposer(_cfg(srv, timeout_s=0.3, max_retries=0))
        with pytest.raises(Exception) as e:
            p.complete(MSGS)
        assert "APITimeoutError" in str(e.value) and srv.base_url in str(e.value)


def test_limit_is_shared_across_ray_processes(ray_local):
    # islands are separate processes: the limit lives in one named actor per endpoint
    ray = ray_local

    def _call(url: str) -> str:          # nested: pickled by value for the workers
        from kfray.config import ProposerConfig
        from kfray.proposers.llm import LLMProposer

        cfg = ProposerConfig(kind="llm", base_url=url, model="m", api_key_env="KFRAY_TEST_NO_KEY",
                             timeout_s=0.6, max_retries=0)
        return LLMProposer(cfg).complete([{"role": "user", "content": "hi"}])

    from kfray.proposers.slots import EndpointSlots

    with ScriptedServer([ANSWER], delay_s=0.3, serial=True) as srv:
        keep = EndpointSlots(srv.base_url, 1).handle()      # owned here, as a run's driver owns it
        call = ray.remote(num_cpus=0)(_call)
        got = ray.get([call.remote(srv.base_url) for _ in range(3)], timeout=60)
        assert all("kf_forward" in g for g in got)
        assert srv.max_in_flight == 1 and len(srv.requests) == 3
        assert ray.get(keep.stats.remote())["granted"] == 3


AXPB = """\
#include <cstdint>
extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        y[i] = a * x[i] + b;
    return 0;
}
"""
BROKEN = ("Use fma.\n<<<<<<< SEARCH\n        y[i] = a * x[i] + b;\n=======\n"
          "        y[i] = std::fma(a, x[i], b)\n>>>>>>> REPLACE")
FIXED = ("Add the include and the semicolon.\n<<<<<<< SEARCH\n#include <cstdint>\n=======\n"
         "#include <cmath>\n#include <cstdint>\n>>>>>>> REPLACE\n<<<<<<< SEARCH\n"
         "        y[i] = std::fma(a, x[i], b)\n=======\n        y[i] = std::fma(a, x[i], b);\n>>>>>>> REPLACE")


def test_diff_child_fails_then_repair_compiles(tmp_cache):
    """A diff child that does not compile goes back once with the compiler's message; the fix
    compiles and is correct; the budget counts the pair once."""
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    with ScriptedServer([BROKEN, FIXED], serial=True) as srv:
        prop = LLMProposer(_cfg(srv, edit_mode="diff", repair=True))
        isl = Island(0, "axpb", "cpp", SearchConfig(islands=1, batch=1), prop)
        seed = Candidate(task="axpb", language="cpp", source=AXPB, origin="seed:plain")
        isl.seed([(seed, EvalResult.from_dict(ev.evaluate(seed)))])
        led = TaskLedger(["axpb"], budget=2, batch=1)
        led.add_island("axpb", "cpu")

        child, = isl.propose(1)
        assert child.origin == "llm:local-model" and "std::fma(a, x[i], b)\n" in child.source
        res = EvalResult.from_dict(ev.evaluate(child))
        assert res.tier == 1 and "error:" in res.reason
        first_error = next(line for line in res.reason.splitlines() if "error:" in line)
        assert len(led.admit("axpb", 0, [child]).fresh) == 1
        isl.ingest([(child, res)])
        assert len(isl.repairs) == 1

        # First the fix-up the compiler names (<cmath> for std::fma), with no request to the model;
        # the missing semicolon it cannot fix, so that child fails again and goes to the model.
        auto, = isl.propose(0)                     # repairs come on top of the batch asked for
        assert auto.origin == "llm+fix" and auto.parent_id == child.id and len(srv.requests) == 1
        assert "#include <cmath>" in auto.source
        again = EvalResult.from_dict(ev.evaluate(auto))
        assert again.tier == 1 and "expected" in again.reason
        assert led.admit("axpb", 0, [auto]).fresh == [auto] and led.tasks["axpb"].spent == 1    # free
        isl.ingest([(auto, again)])
        fix, = isl.propose(0)
        assert fix.origin == "llm:repair" and fix.parent_id == auto.id
        first_error = next(line for line in again.reason.splitlines() if "error:" in line)
        prompt = srv.requests[1]["messages"][1]["content"]
        assert first_error in prompt and "std::fma(a, x[i], b)" in prompt
        fixed = EvalResult.from_dict(ev.evaluate(fix))
        assert fixed.tier == 5, fixed.reason
        got = led.admit("axpb", 0, [fix])
        assert got.fresh == [fix] and led.tasks["axpb"].spent == 1       # the repair is free
        rec = [r for r in isl.ingest([(fix, fixed)]) if r["candidate_id"] == fix.id][0]
        assert rec["origin"] == "llm:repair" and rec["parent_id"] == seed.id and not isl.repairs


def _seeded_island(srv, ev, **cfg) -> tuple:
    """An axpb island whose whole-file proposer asks `srv` and repairs, seeded with AXPB as `ev`
    judged it; and that seed."""
    isl = Island(0, "axpb", "cpp", SearchConfig(islands=1, batch=1),
                 LLMProposer(_cfg(srv, edit_mode="rewrite", repair=True, **cfg)))
    seed = Candidate(task="axpb", language="cpp", source=AXPB, origin="seed:plain")
    isl.seed([(seed, EvalResult.from_dict(ev.evaluate(seed)))])
    return isl, seed


def test_a_missing_header_is_fixed_without_asking_the_model_again(tmp_cache):
    """The slip a 1.5B model makes most: std::min without <algorithm>. The compiler names it, the
    fix-up adds the header, and the child is correct with one request to the model in all."""
    from kfray.eval.evaluator import Evaluator

    slip = "```cpp\n" + AXPB.replace("a * x[i] + b;", "std::min(a * x[i] + b, 1e30f);") + "```"
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer([slip], serial=True) as srv:
            isl, _ = _seeded_island(srv, ev)
            child, = isl.propose(1)
            res = EvalResult.from_dict(ev.evaluate(child))
            assert res.tier == 1 and "min" in res.reason, res.reason
            isl.ingest([(child, res)])
            auto, = isl.propose(0)
            done = EvalResult.from_dict(ev.evaluate(auto))
            assert auto.origin == "llm+fix" and "#include <algorithm>" in auto.source
            assert done.tier == 5, done.reason
            assert len(srv.requests) == 1
    finally:
        ev.shutdown()


@pytest.mark.parametrize("second", ["changed", "same again"])
def test_an_answer_that_repeats_a_kernel_is_asked_again_once_saying_so(tmp_cache, second):
    """A small model often answers with its parent unchanged. That answer is not evaluated; the
    model is asked once more, its prompt saying the last answer repeated a kernel, naming one concrete
    change to make, and its temperature raised. A second repeat ends the asking: kfray edits it into a
    kernel the island has not tried (origin llm+edit). Two requests, not the island's twelve tries,
    and both repeats are counted in the ledger."""
    from kfray.eval.evaluator import Evaluator
    from kfray.descriptors import DIMENSIONS, step_directive
    from kfray.prompts.builder import REPEATED
    from kfray.proposers.models import request_counts

    same = "```cpp\n" + AXPB + "```"
    changed = "```cpp\n" + AXPB.replace("for (int64_t i", "#pragma omp simd\n    for (int64_t i") + "```"
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer([same, changed if second == "changed" else same], serial=True) as srv:
            isl, seed = _seeded_island(srv, ev, temperature=0.5)
            child, = isl.propose(1)
            assert len(srv.requests) == 2, [r["messages"][-1]["content"][:80] for r in srv.requests]
            first, again = srv.requests
            assert REPEATED not in first["messages"][-1]["content"]
            assert REPEATED in again["messages"][-1]["content"]
            # and it names one change to make, one of the language's steps the first prompt did not ask for
            asked = [ln for ln in again["messages"][-1]["content"].splitlines() if "Make this one change" in ln]
            assert len(asked) == 1 and "Make this one change" not in first["messages"][-1]["content"]
            step = asked[0].split(": ", 1)[1].rstrip(".")
            assert step not in first["messages"][-1]["content"]
            assert any(step == s for d in DIMENSIONS for s in (step_directive(d, k, "cpp") for k in (1, 2, 3)))
            assert first["temperature"] == 0.5 and again["temperature"] > 0.5
            counts = request_counts(isl.proposer.usage_by_model(), 0)
            if second == "changed":
                assert "#pragma omp simd" in child.source and counts["repeats"] == 1
            else:
                assert child.origin == "llm+edit" and counts["repeats"] == 2
                assert (child.source, child.params) != (seed.source, seed.params)
            assert counts["proposal"] == 2
    finally:
        ev.shutdown()


def test_with_repeat_asks_off_a_repeated_answer_is_edited_and_evaluated_for_one_request(tmp_cache):
    """proposer.repeat_asks 0 (what a one-slot local endpoint gets): the model's answer that hands
    back its parent is not asked again; kfray makes one offline edit of it, which the island has not
    tried, and that kernel is evaluated and judged like any child: one request, one evaluation."""
    from kfray.eval.evaluator import Evaluator
    from kfray.proposers.models import request_counts
    from kfray.source import source_hash

    same = "```cpp\n" + AXPB + "```"
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer([same], serial=True) as srv:
            isl, seed = _seeded_island(srv, ev, repeat_asks=0)
            known = set(isl.seen)
            children = isl.propose(3)
            assert len(srv.requests) == 3
            for child in children:
                assert child.origin == "llm+edit" and child.source.strip()
                assert source_hash(child.source, child.params) not in known
            assert len({source_hash(c.source, c.params) for c in children}) == 3    # three different kernels
            results = [EvalResult.from_dict(ev.evaluate(c)) for c in children]
            assert all(r.tier >= 2 for r in results), [r.reason for r in results]   # each one built and ran
            records = isl.ingest(list(zip(children, results)))
            assert [r["origin"] for r in records] == ["llm+edit"] * 3
            assert request_counts(isl.proposer.usage_by_model(), 0)["repeats"] == 3
    finally:
        ev.shutdown()


def test_a_request_that_came_back_as_a_repeat_twice_is_not_sent_a_third_time(tmp_cache):
    """A one-slot local model answers the same prompt with the same kernel (a 45-minute run sent one
    prompt 16 times and got its parent back 15 times). Once the very same request has come back as a
    repeat twice, the next child of it is that answer from memory, with no request, and is edited
    like any repeat; the ledger counts it apart from the repeats, and a changed request is sent."""
    import dataclasses

    from kfray.eval.evaluator import Evaluator
    from kfray.proposal import ProposalContext
    from kfray.proposers.models import request_counts, requests_text
    from kfray.search import repeats
    from kfray.source import source_hash

    same = "```cpp\n" + AXPB + "```"
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer([same], serial=True) as srv:
            isl, seed = _seeded_island(srv, ev, repeat_asks=0)
            elite, = isl.archive.elites()
            ctx = ProposalContext(task=isl.task, language="cpp", parent=elite, inspirations=[], target_cell=None,
                                  meta_prompt=None, device_facts={}, island=0, generation=1)
            children = [repeats.ask(isl, dataclasses.replace(ctx)) for _ in range(4)]
            for c in children:
                isl.seen.add(source_hash(c.source, c.params))
            assert len(srv.requests) == 2, "the third and fourth children were asked again"
            assert srv.requests[0]["messages"] == srv.requests[1]["messages"]
            assert all(c.origin == "llm+edit" and c.source.strip() for c in children)
            assert len({source_hash(c.source, c.params) for c in children} | {source_hash(AXPB, seed.params)}) == 5
            counts = request_counts(isl.proposer.usage_by_model(), 0)
            assert (counts["proposal"], counts["repeats"], counts["remembered"]) == (2, 2, 2)
            assert "2 child(ren) given the remembered answer" in requests_text(counts)
            other = dataclasses.replace(ctx, generation=2, directives=["Unroll the loop by 4."])
            repeats.ask(isl, other)
            assert len(srv.requests) == 3, "a changed request is sent"
    finally:
        ev.shutdown()


def test_islands_that_send_one_prompt_share_what_it_came_back_as(tmp_cache):
    """Islands of a task share elites, so they send the same prompt; the memory of what it came back
    as is the endpoint's. Two islands each sent it once and got the parent back: the next child of
    it, on either island, is that answer from memory, with no request."""
    import dataclasses

    from kfray.eval.evaluator import Evaluator
    from kfray.proposal import ProposalContext
    from kfray.search import repeats

    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer(["```cpp\n" + AXPB + "```"], serial=True) as srv:
            a, seed = _seeded_island(srv, ev, repeat_asks=0)
            b = Island(1, "axpb", "cpp", SearchConfig(islands=2, batch=1),
                       LLMProposer(_cfg(srv, edit_mode="rewrite", repair=True, repeat_asks=0)))
            elite, = a.archive.elites()
            b.seed([(elite.candidate, elite.result)])            # as a migration brings it
            ctx = ProposalContext(task=a.task, language="cpp", parent=elite, inspirations=[], target_cell=None,
                                  meta_prompt=None, device_facts={}, island=0, generation=1)
            firsts = [repeats.ask(isl, dataclasses.replace(ctx)) for isl in (a, b)]
            assert len(srv.requests) == 2 and srv.requests[0]["messages"] == srv.requests[1]["messages"]
            assert all(c.origin == "llm+edit" for c in firsts), [c.origin for c in firsts]
            again = repeats.ask(a, dataclasses.replace(ctx))
            assert len(srv.requests) == 2, "asked a third time, though two islands had it back as the parent"
            assert again.origin == "llm+edit" and again.source.strip()
    finally:
        ev.shutdown()


COMMENTED = """\
#include <cstdint>
// quokka: y = a * x + b in one pass over x
// @kf.param UNROLL in [1, 2]
extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n) {
    /* wombat: a plain loop the compiler vectorises */
    for (int64_t i = 0; i < n; ++i)
        y[i] = a * x[i] + b;   // numbat: one multiply-add per element
    return 0;
}
"""


def test_with_comments_off_the_model_reads_and_writes_kernels_without_them(tmp_cache):
    """proposer.comments off (a one-slot local endpoint): the parent reaches the model without its
    comments but with its @kf lines, the model is told to write none, an answer that hands back the
    parent so shown is still known as a repeat (and edited), and a changed one is built and correct."""
    from kfray.eval.evaluator import Evaluator

    bare = COMMENTED.replace("// quokka: y = a * x + b in one pass over x\n", "").replace(
        "    /* wombat: a plain loop the compiler vectorises */\n", "").replace("   // numbat: one multiply-add per element", "")
    changed = bare.replace("for (int64_t i", "#pragma omp simd\n    for (int64_t i")
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer(["```cpp\n" + bare + "```", "```cpp\n" + changed + "```"], serial=True) as srv:
            isl = Island(0, "axpb", "cpp", SearchConfig(islands=1, batch=1),
                         LLMProposer(_cfg(srv, edit_mode="rewrite", repeat_asks=0, comments=False)))
            seed = Candidate(task="axpb", language="cpp", source=COMMENTED, params={"UNROLL": 1}, origin="seed:plain")
            isl.seed([(seed, EvalResult.from_dict(ev.evaluate(seed)))])
            repeat, = isl.propose(1)
            prompt = srv.requests[0]["messages"][1]["content"]
            assert bare.strip() in prompt and "// @kf.param UNROLL in [1, 2]" in prompt
            assert "quokka" not in prompt and "wombat" not in prompt and "numbat" not in prompt
            assert "Write no comments" in prompt
            assert repeat.origin == "llm+edit"              # the bare parent is the parent: a repeat
            child, = isl.propose(1)
            assert child.origin.startswith("llm:") and child.source.strip() == changed.strip()
            res = EvalResult.from_dict(ev.evaluate(child))
            assert res.tier == 5, res.reason
    finally:
        ev.shutdown()


def test_with_repair_asks_off_only_the_fix_ups_mend_a_child_and_the_model_is_not_asked_again(tmp_cache):
    """proposer.repair_asks off (what a one-slot local endpoint gets): a compile error the fix-ups
    name is mended without the model; what they cannot mend (a missing semicolon), a wrong value,
    and a fixed child that fails again are dropped, not sent back: one request in all."""
    from kfray.eval.evaluator import Evaluator

    slip = "```cpp\n" + AXPB.replace("a * x[i] + b;", "std::fma(a, x[i], b)") + "```"    # <cmath> and ';' missing
    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=1, min_time_s=0.0, warmup=0))
    try:
        with ScriptedServer([slip], serial=True) as srv:
            isl, seed = _seeded_island(srv, ev, repair_asks=False)
            child, = isl.propose(1)
            res = EvalResult.from_dict(ev.evaluate(child))
            assert res.tier == 1 and "fma" in res.reason, res.reason
            isl.ingest([(child, res)])
            auto, = isl.propose(0)
            assert auto.origin == "llm+fix" and "#include <cmath>" in auto.source
            again = EvalResult.from_dict(ev.evaluate(auto))
            assert again.tier == 1 and "expected" in again.reason, again.reason
            isl.ingest([(auto, again)])
            assert isl.repairs == [] and isl.propose(0) == []      # the fixed child's new error: not asked
            semicolon = isl.describe(Candidate(task="axpb", language="cpp", origin="llm:local-model",
                                               source=auto.source, parent_id=seed.id))
            isl._parents[semicolon.id] = (seed.id, 1.0, None, semicolon.origin)
            isl.ingest([(semicolon, again)])                       # a compile error no fix-up names
            assert len(isl.repairs) == 1 and isl.propose(0) == [] and isl.repairs == []
            wrong = isl.describe(Candidate(task="axpb", language="cpp", origin="llm:local-model",
                                           source=AXPB.replace("+ b", "- b"), parent_id=seed.id))
            isl._parents[wrong.id] = (seed.id, 1.0, None, wrong.origin)
            isl.ingest([(wrong, EvalResult(candidate_id=wrong.id, tier=4, reason="max abs error 1.0"))])
            assert isl.repairs == []
            assert len(srv.requests) == 1
    finally:
        ev.shutdown()


def test_repair_only_once_and_off_switch():
    wrong = EvalResult(candidate_id="x", tier=4, reason="max abs error 1.0")
    with ScriptedServer([ANSWER]) as srv:
        for repair, origin, queued in ((True, "llm:repair", 0), (False, "llm:local-model", 0)):
            isl = Island(0, "axpb", "cpp", SearchConfig(), LLMProposer(_cfg(srv, repair=repair)))
            c = isl.describe(Candidate(task="axpb", language="cpp", source=AXPB, origin=origin))
            isl._parents[c.id] = (None, 0.0, None, origin)
            isl.ingest([(c, wrong)])
            assert len(isl.repairs) == queued
        isl = Island(0, "axpb", "cpp", SearchConfig(), LLMProposer(_cfg(srv)))
        c = isl.describe(Candidate(task="axpb", language="cpp", source=AXPB, origin="llm:local-model"))
        isl._parents[c.id] = (None, 0.0, None, c.origin)
        isl.ingest([(c, wrong)])
        state = isl.state()
        again = Island(0, "axpb", "cpp", SearchConfig(), LLMProposer(_cfg(srv)))
        again.restore(state)
        assert [r[0].id for r in again.repairs] == [c.id]       # a restarted island still owes the fix


def test_auto_mode_tries_both_then_follows_reward():
    with ScriptedServer([ANSWER]) as srv:
        p = LLMProposer(_cfg(srv, edit_mode="auto"))
        from kfray.proposal import ProposalContext
        from kfray.tasks import load_task

        ctx = ProposalContext(task=load_task("axpb"), language="cpp", parent=None, inspirations=[],
                              target_cell=None, meta_prompt=None, device_facts={}, island=0, generation=1)
        first = [p.propose(ctx, random.Random(0)) for _ in range(2)]
        assert sorted(p.written[c.id][1] for c in first) == ["diff", "rewrite"]
        for c in first:
            good = p.written[c.id][1] == "diff"
            p.feedback(c, {"origin": c.origin, "improvement": 2.0 if good else -3.0})
        assert p.choose_mode(ctx) == "diff"
        assert "SEARCH/REPLACE" in srv.requests[-1]["messages"][1]["content"] or \
            "SEARCH/REPLACE" in srv.requests[0]["messages"][1]["content"]


def test_doctor_llm(capsys):
    from kfray.cli import main

    words = " ".join(f"tok{i}" for i in range(20))
    with ScriptedServer([words], token_delay_s=0.01) as srv:
        sets = [f"proposer.base_url={srv.base_url}", "proposer.model=local-model",
                "proposer.api_key_env=KFRAY_TEST_NO_KEY"]
        rc = main(["doctor", "--llm"] + [a for s in sets for a in ("--set", s)])
        out = capsys.readouterr().out
        assert re.search(rf"ok\s+endpoint\s+{re.escape(srv.base_url)}: models scripted-model", out), out
        assert "ok  model local-model 20 tokens; first after" in out and "tokens/s" in out
        assert srv.requests[0]["stream"] is True
    assert rc == 0
    rc = main(["doctor", "--llm"] + [a for s in sets for a in ("--set", s)])   # the server is gone
    out = capsys.readouterr().out
    assert rc == 1 and re.search(rf"BAD\s+endpoint\s+{re.escape(srv.base_url)}: APIConnectionError", out), out


def test_edit_that_does_not_apply_is_asked_again_as_a_whole_file():
    from kfray.proposal import ProposalContext
    from kfray.tasks import load_task

    wrong = "<<<<<<< SEARCH\n    while (k < m) z[k] = 0;\n=======\n    z[0] = 1;\n>>>>>>> REPLACE"
    whole = "```cpp\n" + AXPB.replace("a * x[i] + b", "b + a * x[i]") + "```"
    task = load_task("axpb")
    ctx = ProposalContext(task=task, language="cpp", parent=None, inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={}, island=0, generation=1)
    with ScriptedServer([wrong, whole, wrong]) as srv:
        p = LLMProposer(_cfg(srv, edit_mode="diff"))
        c = p.propose(ctx, random.Random(0))           # no parent: the edits are against the baseline seed
        assert "y[i] = b + a * x[i];" in c.source and c.no_code_reason == ""
        assert "does not match the parent" in p.last["edit_error"]
        assert "<<<<<<< SEARCH" in srv.requests[0]["messages"][1]["content"]      # asked for a diff
        assert "complete source file" in srv.requests[1]["messages"][1]["content"]  # then the file
        assert p.last["prompt_tokens"] > 0 and len(p.last["answers"]) == 2
        c = p.propose(ctx, random.Random(0))           # wrong twice: tier 0, and it says why
        assert c.source == "" and c.no_code_reason.startswith("the edit does not apply: SEARCH block 1 of 1")
        assert len(srv.requests) == 4


def test_a_local_models_answer_is_bounded_by_the_source_it_rewrites():
    from kfray.proposal import ProposalContext
    from kfray.proposers.answers import answer_tokens
    from kfray.tasks import load_task

    task = load_task("axpb")
    seed = task.baseline_seed("cpp").source
    ctx = ProposalContext(task=task, language="cpp", parent=None, inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={}, island=0, generation=1)
    whole = "```cpp\n" + AXPB.replace("a * x[i] + b", "b + a * x[i]") + "```"
    with ScriptedServer([whole]) as srv:
        for mode in ("rewrite", "diff"):
            LLMProposer(_cfg(srv, edit_mode=mode, max_tokens=8192)).propose(ctx, random.Random(0))
        whole_file, edits = (r["max_tokens"] for r in srv.requests)
    assert 512 <= whole_file <= 2 * len(seed) // 3 + 300 < 8192, (whole_file, len(seed))
    assert edits <= whole_file, (edits, whole_file)
    # nothing to go by, or a source longer than the ceiling: proposer.max_tokens as set
    assert answer_tokens(None, "rewrite", 4096) == 4096 and answer_tokens("x" * 30000, "rewrite", 4096) == 4096


def _streamed_axpb_rewrite(answer: str):
    """(the child, how many answers the client hung up on) of an axpb rewrite that a local server
    streams as `answer`, a word every 2 ms."""
    from kfray.proposal import ProposalContext
    from kfray.tasks import load_task

    ctx = ProposalContext(task=load_task("axpb"), language="cpp", parent=None, inspirations=[],
                          target_cell=None, meta_prompt=None, device_facts={}, island=0, generation=1)
    with ScriptedServer([answer], token_delay_s=0.002) as srv:
        c = LLMProposer(_cfg(srv, edit_mode="rewrite")).propose(ctx, random.Random(0))
        deadline = time.monotonic() + 10
        while srv.dropped == 0 and srv.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return c, srv.dropped


def test_a_local_models_whole_file_ends_where_its_code_block_does():
    """A small model writes on after its file (an explanation nobody reads); on a one-slot server
    each of those tokens is the whole server's time. The streamed answer ends at the closing fence
    of a block that holds kf_forward: the client hangs up and the file is the kernel. A block
    without the entry point, or one still open, does not end it."""
    from kfray.proposers.answers import written

    prose = " ".join(["and this is why the loop is faster"] * 60)
    c, dropped = _streamed_axpb_rewrite("Here is the kernel.\n```cpp\n" + AXPB + "```\n" + prose)
    assert c.source.strip() == AXPB.strip(), c.no_code_reason
    assert dropped == 1                      # the client hung up before the prose was sent
    assert written("```cpp\n" + AXPB + "```", "cpp")
    assert not written("```cpp\n" + AXPB, "cpp")                              # still open
    assert not written("```cpp\n#include <cmath>\n```\nnow the kernel:", "cpp")   # no entry point yet
    signature = '```cpp\n#include <cstdint>\nextern "C" int kf_forward(const float* x, float* y, int64_t n)\n```\nThe code'
    assert not written(signature, "cpp")     # the contract's signature alone, as a 1.5B model began two answers


HELPER = """\
static void kf_slice(const float* __restrict x, float* __restrict y, float a, float b, int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        #pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) y[i + u] = a * x[i + u] + b;
    }
    for (; i < hi; ++i) y[i] = a * x[i] + b;
}

extern "C" int kf_forward(const float* __restrict x, float* __restrict y, float a, float b, int64_t n) {
    if (n <= 0) return 0;
    if (n < (1 << 14)) { kf_slice(x, y, a, b, 0, n); return 0; }
"""


def test_a_local_model_that_repeats_itself_is_stopped_at_its_first_repeat():
    """A 1.5B model once wrote its helper and entry point three times over until its token limit
    (236 s of a one-slot server) and left the file unfinished. The stream ends once the last 400
    characters stand earlier in the answer, and the child says why it has no code; no built-in
    seed, written out whole, reads as a loop at any point."""
    from kfray.proposers.answers import LOOP_SPAN, looping
    from kfray.tasks import load_task

    c, dropped = _streamed_axpb_rewrite("```cpp\n#include <cstdint>\n" + HELPER * 12)
    assert dropped == 1                      # the client hung up before the twelfth copy
    assert not c.source and "repeat itself" in c.no_code_reason, c.no_code_reason
    assert len(HELPER) + LOOP_SPAN <= int(re.search(r"\((\d+) characters", c.no_code_reason)[1]) < 3 * len(HELPER)
    for name in ("axpb", "softmax", "matmul"):
        for seed in load_task(name).seeds_for("cpp"):
            whole = "```cpp\n" + seed.source + "```"
            assert not any(looping(whole[:n]) for n in range(1, len(whole) + 1, 16)), (name, seed.name)


class _TaskServer(ScriptedServer):
    """Answers by what is asked: a whole file for the task named in the prompt, broken (an
    undeclared name) for a first try and fixed for a repair; each answer a new variant."""

    def __init__(self, seeds: dict, **kw):
        super().__init__(["unused"], **kw)
        self.seeds, self.n = seeds, 0

    def _take(self, body: dict):
        with self._lock:
            self.requests.append(body)
            self.n += 1
            user = body["messages"][1]["content"]
            name = next((t for t in self.seeds if f"**{t}**" in user), None)
            if name is None:                # the prompt evolver asking for new meta-prompts
                return "no new sections"
            src = self.seeds[name].replace("return 0;", f"volatile int v{self.n} = {self.n}; (void)v{self.n};\n"
                                                        "    return 0;")
            if "it failed; fix it" not in user:
                src = src.replace("return 0;", "return zero;")
            return f"```cpp\n{src}```"


def test_a_run_on_a_one_at_a_time_server(ray_local, tmp_path, tmp_cache):
    """The issue's scene: 2 tasks x 2 islands x batch 2 against a server that answers one request at
    a time, with a timeout shorter than the queue: nothing is dropped or sent twice, and every
    broken child is repaired once, free of the budget."""
    from kfray.config import load_config
    from kfray.driver import run_search
    from kfray.store import Store
    from kfray.tasks import load_task

    seeds = {t: load_task(t).baseline_seed("cpp").source for t in ("axpb", "softmax")}
    with _TaskServer(seeds, delay_s=0.3, serial=True) as srv:
        cfg = load_config(None, ["tasks=[axpb, softmax]", "search.islands=2", "search.retime_top=0", "search.budget=6", "search.batch=2",
                                 "eval.evaluators=1", "eval.tune_budget=0", "eval.trials=1", "eval.repeats=1",
                                 f"eval.cache_dir={tmp_cache}", "proposer.kind=llm", "proposer.model=local",
                                 f"proposer.base_url={srv.base_url}", "proposer.api_key_env=KFRAY_TEST_NO_KEY",
                                 "proposer.timeout_s=1.0", "proposer.max_retries=2", "proposer.edit_mode=rewrite",
                                 "search.near_duplicate=0", "prompts.evolve_every=1000",
                                 "proposer.repair_asks=true"])      # repairs asked, though the endpoint is local
        out = run_search(cfg, tmp_path / "run", progress=False)
        assert srv.max_in_flight == 1 and srv.dropped == 0
        n_requests = len(srv.requests)
    assert out["llm"]["local"]["failures"] == 0 and out["llm"]["local"]["calls"] == n_requests
    store = Store(tmp_path / "run" / "kfray.db")
    try:
        rows = [(c, r) for c, r in store.evaluated() if c.origin.startswith("llm:")]
    finally:
        store.close()
    first = [(c, r) for c, r in rows if c.origin == "llm:local"]
    fixed = [(c, r) for c, r in rows if c.origin == "llm:repair"]
    # the budget of 6 per task less its seeds went to LLM children, every one broken as scripted
    expected = sum(6 - len(load_task(t).seeds_for("cpp")) for t in ("axpb", "softmax"))
    assert len(first) == expected > 0 and all(r.tier == 1 for _, r in first)
    assert fixed and all(r.tier == 5 for _, r in fixed)                # repairs compile and are right
    assert {c.parent_id for c, _ in fixed} <= {c.id for c, _ in first}
    # every request is accounted by purpose, in the summary and in `kfray status`
    req = out["llm_requests"]
    assert req["total"] == n_requests and req["proposal"] == len(first) and req["repair"] == len(fixed), req
    assert req["llm_candidates"] == len(rows) and req["per_candidate"] == round(n_requests / len(rows), 3)
    from kfray.report.data import connect_ro
    from kfray.report.status import llm_requests_line

    con = connect_ro(tmp_path / "run")
    try:
        line = llm_requests_line(con)
    finally:
        con.close()
    assert f"LLM requests: {n_requests} (proposals {len(first)}" in line and "per evaluated LLM candidate" in line


def test_a_snippet_in_answer_to_a_diff_request_is_asked_again_as_a_whole_file():
    from kfray.proposal import ProposalContext
    from kfray.tasks import load_task

    snippet = "Add this:\n```cpp\n#pragma omp parallel for\n```"        # seen from the 1.5B model
    whole = "```cpp\n" + AXPB + "```"
    ctx = ProposalContext(task=load_task("axpb"), language="cpp", parent=None, inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={}, island=0, generation=1)
    with ScriptedServer([snippet, whole]) as srv:
        c = LLMProposer(_cfg(srv, edit_mode="diff")).propose(ctx, random.Random(0))
        assert c.source.strip() == AXPB.strip() and len(srv.requests) == 2
    with ScriptedServer([snippet, whole]) as srv:                     # repair off: no second request
        c = LLMProposer(_cfg(srv, edit_mode="diff", repair=False)).propose(ctx, random.Random(0))
        assert c.source == "" and "no code block with kf_forward" in c.no_code_reason and len(srv.requests) == 1


def test_a_local_one_slot_endpoint_gets_islands_and_batch_that_keep_it_busy():
    from kfray.config import load_config
    from kfray.proposers.slots import fit_to_endpoint

    local = ["proposer.kind=llm", "proposer.base_url=http://127.0.0.1:8080/v1", "proposer.model=m"]
    cfg = load_config(None, local)
    line = fit_to_endpoint(cfg)
    assert (cfg.search.batch, cfg.search.islands, cfg.search.migrate_every) == (1, 2, 1)
    assert cfg.proposer.edit_mode == "rewrite"          # no diff that fails to apply, then a second request
    assert "one request at a time" in line and "search.batch=1" in line and "search.islands=2" in line
    assert "proposer.edit_mode=rewrite" in line and "search.migrate_every=1" in line
    assert cfg.prompts.evolve_every == 12 and "prompts.evolve_every=12" in line   # fewer requests that evaluate nothing
    assert cfg.proposer.prompt_tokens == 1500 and "proposer.prompt_tokens=1500" in line   # less to read per answer
    assert not cfg.proposer.repair_asks and "proposer.repair_asks=false" in line   # fix-ups only, no repair request
    assert cfg.proposer.repeat_asks == 0 and "proposer.repeat_asks=0" in line   # a repeat is edited, not asked again
    assert not cfg.proposer.comments and "proposer.comments=false" in line      # a fifth fewer tokens to read and write
    asks = load_config(None, local + ["proposer.repair_asks=true"])
    assert "repair_asks" not in fit_to_endpoint(asks) and asks.proposer.repair_asks
    diff = load_config(None, local + ["proposer.edit_mode=diff"])
    assert "edit_mode" not in fit_to_endpoint(diff) and diff.proposer.edit_mode == "diff"
    mine = load_config(None, local + ["search.batch=3", "proposer.prompt_tokens=3000"])   # what the user set stays
    line = fit_to_endpoint(mine)
    assert "search.batch" not in line and mine.search.batch == 3 and mine.search.islands == 2
    assert "prompt_tokens" not in line and mine.proposer.prompt_tokens == 3000
    remote = load_config(None, ["proposer.kind=llm", "proposer.base_url=https://api.example.com/v1", "proposer.model=m"])
    assert fit_to_endpoint(remote) == "" and remote.search.batch == 2 and remote.proposer.edit_mode == "auto"
    offline = load_config(None, [])
    assert fit_to_endpoint(offline) == "" and offline.search.islands == 4


def test_an_islands_batch_is_answered_whole_before_a_later_islands_request():
    """On a one-at-a-time server, island A's batch (3 requests, begun first) is answered whole
    before island B's request, which arrived while A's first was being answered: A's batch goes to
    evaluation after 3 answers, not after all 4 (first come, first served interleaved them)."""
    with ScriptedServer([ANSWER], delay_s=0.4, serial=True) as srv:
        a, b = LLMProposer(_cfg(srv)), LLMProposer(_cfg(srv))
        a.batch_began = time.time()
        b.batch_began = a.batch_began + 0.05
        done: list[str] = []

        def island(p, name, n):
            for k in range(n):
                p.complete([{"role": "user", "content": f"{name}{k}"}])
                done.append(f"{name}{k}")

        ta = threading.Thread(target=island, args=(a, "A", 3))
        tb = threading.Thread(target=island, args=(b, "B", 1))
        ta.start()
        deadline = time.time() + 30
        while not srv.requests and time.time() < deadline:
            time.sleep(0.01)
        tb.start()                         # A's first request is being answered; B asks now
        ta.join(30)
        tb.join(30)
        asked = [r["messages"][-1]["content"] for r in srv.requests]
    assert srv.max_in_flight == 1
    assert asked == ["A0", "A1", "A2", "B0"], asked
    assert done == ["A0", "A1", "A2", "B0"], done


def test_a_stopped_runs_summary_counts_requests_when_its_islands_are_busy(ray_local):
    """A run stopped while an island waits on a model's answer (minutes on a local server) gets no
    island state in time, and its stored checkpoints carry an older usage, if any: the summary's
    request counts then come from the run-wide ledger actor, which never waits on a model. In
    45-minute local runs the summary had lost them, then counted the checkpoints' (30 of 52)."""
    from types import SimpleNamespace

    from kfray.config import load_config
    from kfray.driver.finish import ledger_usage, run_usage
    from kfray.proposers.models import RemoteLedger, request_counts

    cfg = load_config(None, ["proposer.kind=llm", "proposer.base_url=http://127.0.0.1:9/v1", "proposer.model=m"])
    co = SimpleNamespace(cfg=cfg, name="kfray-stopped-run")
    assert ledger_usage(co) == {}                          # no request made yet: nothing to count
    ledger = RemoteLedger("kfray-stopped-run-prompt-evolver-ledger")   # the name the run's islands use
    ledger.charge("m", 1200, 300, 0.0, purpose="proposal")
    ledger.charge("m", 1300, 310, 0.0, purpose="proposal")
    ledger.charge("m", 900, 200, 0.0, purpose="repair")
    counts = request_counts(ledger_usage(co), llm_candidates=3)
    assert (counts["total"], counts["proposal"], counts["repair"], counts["per_candidate"]) == (3, 2, 1, 1.0)
    # an island's last checkpoint, taken after the first request, holds an older snapshot: the
    # summary counts what the ledger holds now (it had counted the checkpoint's, 30 of 52 requests)
    stale = [{"llm_usage": {"m": {"calls": 1, "req_proposal": 1, "prompt_tokens": 1200}}}, {"archive": {}}]
    counts = request_counts(run_usage(co, stale), llm_candidates=3)
    assert (counts["total"], counts["proposal"], counts["repair"]) == (3, 2, 1)
    offline = SimpleNamespace(cfg=load_config(None, []), name="kfray-stopped-run")
    assert ledger_usage(offline) == {}                     # an offline run has no model to account
