"""The end-of-run re-timing picks its contenders among different kernels: candidates that share a
source and setting share one measurement (the tuner's cache), and timing it twice would keep a
lucky figure's rivals out of the re-timing."""
from types import SimpleNamespace

from kfray.candidate import TIER_CORRECT, EvalResult
from kfray.driver.retime import contenders

SRC_A = "extern \"C\" int kf_forward(float* y) { return 0; } // A\n// @kf.param NT in [0, 1]\n"
SRC_B = "extern \"C\" int kf_forward(float* y) { return 0; } // B\n"


def _pair(cid: str, src: str, params: dict, time_s: float, tuned: dict | None = None):
    c = {"id": cid, "source": src, "params": params}
    r = EvalResult(candidate_id=cid, tier=TIER_CORRECT, times={"n": time_s}, ref_times={"n": 1.0},
                   facts={"tuned_params": tuned} if tuned else {})
    return c, r.to_dict()


def test_two_candidates_with_one_source_and_setting_are_one_contender():
    book = SimpleNamespace(known={
        "a1": _pair("a1", SRC_A, {"NT": 1}, 0.25, tuned={"NT": 0}),    # lucky: 4x, tuned to NT=0
        "a2": _pair("a2", SRC_A, {"NT": 0}, 0.25),                      # the same kernel, same figure
        "a3": _pair("a3", SRC_A, {"NT": 1}, 0.4),                       # the same source, other setting
        "b1": _pair("b1", SRC_B, {}, 0.5),
    })
    ids = [c["id"] for c, _ in contenders(book, 2)]
    assert ids[0] in ("a1", "a2") and ids[1] == "a3", ids
    assert [c["id"] for c, _ in contenders(book, 5)][1:] == ["a3", "b1"]


def test_best_vs_seed_is_the_ratio_of_their_own_times_when_the_reference_was_slow_beside_one():
    """Both re-timed in the same rounds, each with its reference timed beside it: a round where the
    reference ran 10x slow (a BLAS sharing its cores) makes the seed's speedup look 10x better, and
    "vs seed" read from the two speedups said the best was slower than its seed. From the kernels'
    own times it is what a user timing the two files would find."""
    from kfray.driver.finish import vs_seed
    from kfray.driver.retime import summarize

    best_rounds = [EvalResult(candidate_id="b", tier=TIER_CORRECT, times={"s": 0.10, "t": 0.20},
                              ref_times={"s": 0.2, "t": 0.4}) for _ in range(3)]
    seed_rounds = [EvalResult(candidate_id="s", tier=TIER_CORRECT, times={"s": 0.25, "t": 0.50},
                              ref_times={"s": 2.0, "t": 4.0}) for _ in range(3)]    # slow references
    best = summarize(2.0, [r.speedup for r in best_rounds], times=[r.times for r in best_rounds])
    seed = summarize(8.0, [r.speedup for r in seed_rounds], times=[r.times for r in seed_rounds])
    assert seed["retimed"] > best["retimed"]              # the speedups alone put the seed ahead
    assert vs_seed(best, seed) == 2.5                     # its own time: 2.5x faster on each shape
    # with no times per shape in common, the speedups' ratio is what there is
    assert vs_seed(dict(best, times={"s": 0.1}), dict(seed, times={"t": 0.5})) == round(2.0 / 8.0, 4)
