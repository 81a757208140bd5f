"""The run's books without Ray or SQLite: admission and dedupe, budget, leftovers, batches,
replay after a crash, the per-task tally."""
from __future__ import annotations


from kfray.candidate import Candidate, EvalResult
from kfray.driver.ledger import TaskLedger


def cand(task: str, src: str, island: int = 0) -> Candidate:
    return Candidate(task=task, language="cpp", source=src, island=island)


def res(c: Candidate, tier: int = 5, speed: float = 2.0) -> EvalResult:
    return EvalResult(candidate_id=c.id, tier=tier, times={"s": 2.0 / speed}, ref_times={"s": 2.0}, hardware="cpu")


def ledger(budget: int = 4, tasks=("a",), islands: int = 2, **kw) -> TaskLedger:
    led = TaskLedger(list(tasks), budget=budget, batch=2, **kw)
    for t in tasks:
        for _ in range(islands):
            led.add_island(t, "cpu")
    return led


def test_the_ledger_works_where_neither_ray_nor_sqlite_can_be_imported():
    import subprocess
    import sys

    code = ("import sys\nsys.modules['ray'] = None\nsys.modules['sqlite3'] = None\n"
            "import importlib.util, kfray\n"            # the module alone: kfray.driver's package imports Ray
            "spec = importlib.util.spec_from_file_location('ledger', kfray.__path__[0] + '/driver/ledger.py')\n"
            "m = importlib.util.module_from_spec(spec)\nsys.modules['ledger'] = m\nspec.loader.exec_module(m)\nTaskLedger = m.TaskLedger\n"
            "led = TaskLedger(['a'], budget=3, batch=2)\nled.add_island('a', 'cpu')\nprint(led.requests())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[('a', 0, 2)]"


def test_requests_reserve_the_budget_and_mark_islands_busy():
    led = ledger(budget=3)
    asks = led.requests()
    assert asks == [("a", 0, 2), ("a", 1, 1)]          # 3 evaluations: 2 + 1, no more
    assert led.requests() == []                          # both busy now


def test_duplicates_are_never_evaluated_twice_and_known_results_come_back():
    led = ledger(budget=5)
    led.requests()
    first = [cand("a", "k1"), cand("a", "k2")]
    got = led.admit("a", 0, first)
    assert [c.source for c in got.fresh] == ["k1", "k2"] and got.known == []
    assert led.result("cpu", first[0], res(first[0])) is None            # batch not complete yet
    done = led.result("cpu", first[1], res(first[1], speed=3.0))
    assert done[0:2] == ("a", 0) and [p[0]["source"] for p in done[2]] == ["k1", "k2"]
    again = led.admit("a", 1, [cand("a", "k1", 1), cand("a", "k3", 1)])
    assert [c.source for c in again.fresh] == ["k3"]
    assert [k[0]["source"] for k in again.known] == ["k1"]                 # the island still learns it
    t = led.tasks["a"]
    assert t.spent == 3 and t.proposals == 4 and t.evaluated == 2


def test_admission_stops_at_the_budget_and_frees_the_rest_for_later():
    led = ledger(budget=2, islands=1)
    led.requests()
    got = led.admit("a", 0, [cand("a", "x"), cand("a", "y"), cand("a", "z")])
    assert len(got.fresh) == 2 and led.tasks["a"].spent == 2
    from kfray.source import source_hash
    assert ("cpu", source_hash("z", {})) not in led.tasks["a"].seen     # over the budget: may come again
    led2 = ledger(budget=2, islands=1)
    led2.requests()
    led2.admit("a", 0, [cand("a", "x")])
    assert led2.requests() == []                       # busy until its batch is ingested


def test_nothing_new_frees_the_island_at_once():
    led = ledger(budget=4, islands=1)
    led.requests()
    c = cand("a", "same")
    led.admit("a", 0, [c])
    led.result("cpu", c, res(c))
    led.ingested("a", 0, [], 1, None)
    led.requests()
    got = led.admit("a", 0, [cand("a", "same")])
    assert got.fresh == [] and len(got.known) == 1 and ("a", 0) in led.busy   # it ingests the known one
    led.ingested("a", 0, got.known, 2, None)
    led.requests()
    blank = led.admit("a", 0, [cand("a", "")])           # no code at all: evaluated (tier 0 result)
    assert len(blank.fresh) == 1


def test_a_saturated_task_hands_its_leftovers_to_the_others():
    led = ledger(budget=4, tasks=("a", "b", "c"), islands=1, share_budget=True, saturate_factor=1)
    led.tasks["a"].proposals = 5                        # > 1 x budget: it only proposes known kernels
    led.tasks["a"].spent = 1
    led.share_leftovers()
    assert led.tasks["a"].budget == 1
    assert led.tasks["b"].budget + led.tasks["c"].budget == 8 + 3


def test_replay_gives_a_restarted_island_its_checkpoint_and_what_came_after():
    led = ledger(budget=8, islands=1)
    led.tasks["a"].seed_pairs["cpu"] = [({"id": "s"}, {"tier": 5})]
    led.requests()
    c = cand("a", "k")
    led.admit("a", 0, [c])
    pair = led.result("cpu", c, res(c))[2]
    led.ingested("a", 0, pair, 1, None)                  # no checkpoint yet
    state, pairs = led.replay("a", 0)
    assert state is None and [p[0]["id"] for p in pairs] == ["s", c.id]   # seeds, then the batch
    led.ingested("a", 0, [], 2, {"generation": 2, "archive": {"elites": []}})
    state, pairs = led.replay("a", 0, [({"id": "late"}, {})])
    assert state["generation"] == 2 and [p[0]["id"] for p in pairs] == ["late"]
    assert led.tasks["a"].generations[0] == 2


def test_migration_is_due_when_every_island_reached_the_generation():
    led = ledger(budget=8, migrate_every=2)
    assert not led.ingested("a", 0, [], 2, None)
    assert led.ingested("a", 1, [], 2, None)
    assert led.migration_due("a") == 1 and led.tasks["a"].next_migration == 4


def test_the_tally_names_the_best_and_its_speedup_over_the_baseline_seed():
    led = ledger(budget=8, islands=1)
    seed = Candidate(task="a", language="cpp", source="seed", origin="seed:plain")
    assert led.submit_seed("a", "cpu", seed) and not led.submit_seed("a", "cpu", seed)   # once per class
    led.seed_result("cpu", seed, res(seed, speed=2.0), "plain")
    led.requests()
    c, wrong = cand("a", "fast"), cand("a", "broken")
    led.admit("a", 0, [c, wrong])
    led.result("cpu", c, res(c, speed=6.0))
    led.result("cpu", wrong, res(wrong, tier=4))
    t = led.tally("a", "cpu", {"cpu"})
    assert t["correct"] and t["best_candidate"] == c.id and t["best_hardware"] == "cpu"
    assert t["best_speedup_vs_reference"] == 6.0 and t["best_speedup_vs_seed"] == 3.0
    assert t["evaluated"] == 3 and t["correct_count"] == 2


def test_a_task_that_ran_dry_says_so_and_what_it_gave():
    from kfray.config import SearchConfig
    from kfray.driver.finish import dry_note

    assert SearchConfig().share_budget            # a plain run shares leftovers too, not only sweeps
    led = ledger(budget=4, tasks=("a", "b"), islands=1, share_budget=True, saturate_factor=1)
    led.tasks["a"].proposals, led.tasks["a"].spent = 9, 2
    led.share_leftovers()
    a, b = dry_note(led.ran_dry("a")), dry_note(led.ran_dry("b"))
    assert a["ran_dry"] and a["budget_given"] == 2 and "gave 2 evaluations" in a["note"]
    assert not b["ran_dry"] and b["budget_taken"] == 2 and b["budget"] == 6 and "took 2" in b["note"]
    led.tasks["b"].proposals = 9                    # both dry: nobody to give to
    alone = ledger(budget=4, tasks=("a",), islands=1, share_budget=True, saturate_factor=1)
    alone.tasks["a"].proposals, alone.tasks["a"].spent = 9, 1
    alone.share_leftovers()
    assert "3 evaluations left unspent" in dry_note(alone.ran_dry("a"))["note"]


def test_every_speedup_of_a_task_on_one_hardware_class_has_the_same_denominator():
    led = ledger(budget=4)
    led.requests()
    first, second = cand("a", "k1"), cand("a", "k2")
    led.admit("a", 0, [first, second])
    r1 = EvalResult(candidate_id=first.id, tier=5, times={"s": 1.0}, ref_times={"s": 2.0}, hardware="cpu")
    r2 = EvalResult(candidate_id=second.id, tier=5, times={"s": 1.0}, ref_times={"s": 2.6}, hardware="cpu")
    led.result("cpu", first, r1)
    led.result("cpu", second, r2)        # its evaluator re-timed the reference under more load
    assert r2.ref_times == {"s": 2.0} and r2.speedup == r1.speedup == 2.0
    assert r2.facts["ref_times_measured"] == {"s": 2.6}
