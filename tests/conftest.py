"""Shared fixtures: one Ray instance for the whole session (ray.init costs 3 s), GPU/SYCL skips."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

# One precompiled torch/extension.h for the whole session (a minute and 0.75 GB to build): every
# test's private compile cache would otherwise build its own. Set before Ray starts, so the
# evaluator actors see it too, and before pytest-xdist starts its workers, so they share it (its
# build is under a file lock); the process that made it removes it at the end.
_MADE_PCH_DIR = not os.environ.get("KFRAY_PCH_DIR")
_PCH_DIR = os.environ.get("KFRAY_PCH_DIR") or tempfile.mkdtemp(prefix="kfray-test-pch-")
os.environ["KFRAY_PCH_DIR"] = _PCH_DIR


# One judge at a time across pytest-xdist workers (kfray/eval/timing_turn.py): two workers on 2 cores
# once timed a reference against itself at 3.19x. Their builds, loads and searches still overlap.
os.environ.setdefault("KFRAY_TIMING_LOCK", os.path.join(_PCH_DIR, "timing.lock"))
open(os.environ["KFRAY_TIMING_LOCK"], "a").close()     # the sandbox is shown it read-only


# The suites' compile cache (the `suite_cache` fixture), shared by pytest-xdist workers like the above.
_MADE_SUITE_CACHE = not os.environ.get("KFRAY_TEST_SUITE_CACHE")
_SUITE_CACHE = os.environ.get("KFRAY_TEST_SUITE_CACHE") or tempfile.mkdtemp(prefix="kfray-test-suite-cache-")
os.environ["KFRAY_TEST_SUITE_CACHE"] = _SUITE_CACHE
_PREBUILD_FILES = {"test_judge_apart.py", "test_suite_harness.py", "test_sweep.py"}
_prebuild: list = []


def pytest_collection_finish(session):
    """In one process, when a file that uses the suites' cache is collected: tests/prebuild.py fills
    it in the background at autogroup nice 19 and the idle scheduling class (it gets a core only
    while the tests leave one free). KFRAY_TEST_PREBUILD=0 turns it off."""
    if any(item.path.name in _PREBUILD_FILES for item in session.items):
        _start_prebuild()


def pytest_sessionstart(session):
    """Under pytest-xdist the workers collect and the controller does not: the controller, which made
    the cache, starts the prebuild when its arguments reach one of those files (a -k that then
    deselects them costs only idle time)."""
    from pathlib import Path

    if not _on_workers(session.config) or hasattr(session.config, "workerinput"):
        return
    for arg in session.config.args:
        path = Path(session.config.invocation_params.dir, arg.split("::")[0])
        if path.name in _PREBUILD_FILES or (path.is_dir() and any(next(path.rglob(n), None) for n in _PREBUILD_FILES)):
            _start_prebuild()
            return


def _start_prebuild():
    import importlib.util
    import subprocess
    import sys

    if (not _MADE_SUITE_CACHE or _prebuild or os.environ.get("KFRAY_TEST_PREBUILD", "1") == "0"
            or shutil.which("g++") is None or importlib.util.find_spec("torch") is None):
        return

    def idle():
        # Its own session (killed with its compilers at the end) is its own autogroup where the
        # kernel has them (/proc/sys/kernel/sched_autogroup_enabled), and an autogroup shares the CPU
        # with the others as an equal whatever its processes' class: two idle-class spinners there
        # took 61 % of 2 cores from two test processes. At nice 19 the group takes 8 %.
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
        except OSError:
            pass
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            os.nice(19)

    with open(os.path.join(_PCH_DIR, "prebuild.log"), "w") as log:       # the child keeps its own copy
        _prebuild.append(subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "prebuild.py"),
                                           _SUITE_CACHE], stdout=log, stderr=subprocess.STDOUT, preexec_fn=idle,
                                          start_new_session=True))


def pytest_unconfigure(config):
    import signal

    for proc in _prebuild:          # with its compilers
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    if _MADE_SUITE_CACHE:
        shutil.rmtree(_SUITE_CACHE, ignore_errors=True)
    if _MADE_PCH_DIR:
        shutil.rmtree(_PCH_DIR, ignore_errors=True)


# --- spreading the suite over pytest-xdist workers (README: `-n auto`; pyproject adds loadgroup) ---
# A file's tests run on one worker (its module fixtures are made once); the tests that read the
# session's default run go together, first (it is made once); and the longest tests (each over ~15 s on
# 2 cores) go first, each on its own, so that no worker is left with a long test at the end while
# the other idles. A test missing from this list only costs time, never a result.
LONG_FIRST = (
    "test_a_kernel_whose_forked_processes_keep_its_request_thread_waiting_does_not_hide_a_patched_clock",
    "test_a_load_inline_modelnew_is_built_into_the_compile_cache_once",
    "test_sweep_shares_one_token_budget_and_reports_both_baselines",
    "test_heterogeneous_cluster_placement_and_node_loss",
    "test_a_kernel_that_keeps_its_own_request_thread_waiting_does_not_hide_a_patched_clock",
    "test_a_stopped_then_killed_driver_resumes_with_nothing_lost_and_nothing_repeated",
    "test_an_llm_search_evolves_a_kernelbench_task_in_kernelbenchs_form",
    "test_short_search_on_opencl_cpu_beats_its_seed", "test_a_modelnew_that_slows_the_references_torch_function_gains_nothing",
    "test_a_run_on_a_one_at_a_time_server", "test_a_modelnew_that_patches_the_clocks_is_flagged",
    "test_ray_start_up_lines_stay_out_of_the_terminal_unless_verbose",
    "test_a_kernel_far_slower_than_its_reference_is_charged_a_timeout_that_says_so",
)
# Files whose tests are long for a file group's place in the order (alphabetical after the above):
# test_torch_ext.py builds two extensions of its own, ~40 s on both cores, and came last, while the
# other worker, done, left a core idle for most of the last minute.
FILES_FIRST = ("test_torch_ext.py",)
SHARED_RUN_FILES = ("test_search.py", "test_report.py", "test_qd_gradient.py")
SHARED_RUN_TESTS = ("test_default_run_through_the_cli",)


def _work_unit(item) -> tuple[int, str]:
    """(order, group) of a test for pytest-xdist's loadgroup scheduling."""
    name = item.originalname or item.name
    if item.path.name in SHARED_RUN_FILES or name in SHARED_RUN_TESTS:
        return -1, "session_run"         # the longest unit: the default run, then what reads it
    if name in LONG_FIRST:
        return LONG_FIRST.index(name), f"{item.path.name}::{name}"
    if item.path.name in FILES_FIRST:
        return len(LONG_FIRST) + 1, item.path.name
    return len(LONG_FIRST) + 2, item.path.name


def _on_workers(config) -> bool:
    """Whether pytest-xdist spreads this run over workers (-n N, N > 0): true in the controller and
    in each worker (where xdist sets numprocesses to None; reading only that, the groups below were
    never made and a file's tests were dealt out one by one)."""
    if hasattr(config, "workerinput"):
        return True
    try:
        return bool(config.getoption("numprocesses"))
    except ValueError:          # pytest-xdist not installed
        return False


@pytest.hookimpl(tryfirst=True)         # before xdist's own hook turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    if not _on_workers(config):
        return      # one process: files in their order, so each module's fixtures are made once
                    # (moving a file's long test first had torn them down and made them again:
                    # four torch-extension builds of test_suite_harness alone, ~55 s)
    units = {id(it): _work_unit(it) for it in items}
    for it in items:
        it.add_marker(pytest.mark.xdist_group(units[id(it)][1]))
    items.sort(key=lambda it: units[id(it)][0])     # stable: files keep their order after the long tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked `alone` runs (set-up and teardown too) while no other worker
    runs one: a readers-writer lock of two flocks in the shared folder. Every other test holds the
    main lock shared; an `alone` test first takes the gate, so that no new test starts, then the main
    lock exclusively, once the tests in flight have ended."""
    if not hasattr(item.config, "workerinput"):
        yield
        return
    import fcntl

    with open(os.path.join(_PCH_DIR, "gate.lock"), "a") as gate, open(os.path.join(_PCH_DIR, "alone.lock"), "a") as main:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if item.get_closest_marker("alone"):
            fcntl.flock(main, fcntl.LOCK_EX)
        else:
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most 4 (each worker starts its own Ray instance)."""
    return max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance shared by every test that needs actors."""
    import ray

    if not ray.is_initialized():
        # Ray's dashboard agent samples every worker's CPU and memory every 5 s for a dashboard no
        # test opens: ~6 CPU-s per instance over a suite run (here and in the Ray instances of the
        # `kfray` processes the tests start, which inherit it)
        os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
        # actors' prints reach their log files as they are made; set here, not as a runtime_env, whose
        # every worker starts through Ray's setup_worker.py, which imports Ray once more before it
        # execs the worker: 1.36 CPU-s an actor instead of 0.56 (~90 actors a suite run)
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        # no idle task workers started ahead (the tests start actors, each in a process of its own):
        # two of them cost ~3 CPU-s to start and ~0.4 CPU-s a minute each, for nothing
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False})
        from kfray.cluster import stop_log_monitor

        stop_log_monitor()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _shut_kept_judges():
    """The evaluators a file kept between its `verify` calls (tests/kept_judges.py) end with it."""
    yield
    import kept_judges

    kept_judges.shut_all()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private compile cache so tests never see each other's builds."""
    d = tmp_path / "cache"
    monkeypatch.setenv("KFRAY_CACHE", str(d))
    return d


@pytest.fixture(scope="session")
def suite_cache():
    """One compile cache for the suites' extensions across test files (robust-kbench's forward and
    backward, the judge's hostile kernels, KernelBench ModelNew files): a torch extension is 25-30 s
    of g++ on 2 cores, and test_sweep built again the two that test_suite_harness had built. A test
    that checks caching itself builds a kernel of its own, or uses a cache of its own. Made at
    start-up, so that tests/prebuild.py can fill it in the background (_start_prebuild)."""
    from pathlib import Path

    return Path(_SUITE_CACHE)


# `kfray run` as a new user types it, on a smaller budget: the default config (three tasks, 2
# evaluators, real g++ builds, the inner tuner, migrations, evolving prompts, re-timing). 10 a task
# gives every island two generations after its seeds; the budget is run out rather than the default
# 45 s of proposing, which on a loaded host once ended before any island's second generation.
DEFAULT_RUN_SETS = ("search.islands=2", "search.budget=10", "search.time_limit_s=0")


@pytest.fixture(scope="session")
def session_run(ray_local, tmp_path_factory):
    """The session's one real default search (DEFAULT_RUN_SETS, through the CLI), shared by the
    tests that look at a finished run: test_cli checks the run as a user sees it, test_search its
    matmul search, test_report renders it and test_qd_gradient reads its transitions; none of them
    changes what the run wrote (reports go beside it). Its terminal output is kept in "out"."""
    import contextlib
    import io

    from kfray.cli import main
    from kfray.config import load_config

    root = tmp_path_factory.mktemp("session_run")
    cache = root / "cache"
    sets = [*DEFAULT_RUN_SETS, f"eval.cache_dir={cache}"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", "--run-dir", str(root / "run"), "--quiet", *(a for k in sets for a in ("--set", k))])
    assert rc == 0, out.getvalue()[-3000:]
    summary = json.loads((root / "run" / "summary.json").read_text())
    return {"run_dir": root / "run", "summary": summary, "cfg": load_config(None, sets), "cache": cache,
            "out": out.getvalue()}
