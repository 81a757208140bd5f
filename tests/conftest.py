"""Shared fixtures: one Ray instance for the whole session (ray.init costs 3 s), GPU/SYCL skips."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# One precompiled torch/extension.h for the whole session (a minute and 0.75 GB to build): every
# test's private compile cache would otherwise build its own. Set before Ray starts, so the
# evaluator actors see it too.
_PCH_DIR = os.environ.get("KFRAY_PCH_DIR") or tempfile.mkdtemp(prefix="kfray-test-pch-")
os.environ["KFRAY_PCH_DIR"] = _PCH_DIR


@pytest.fixture(scope="session", autouse=True)
def _shared_torch_pch():
    yield _PCH_DIR
    if os.path.basename(_PCH_DIR).startswith("kfray-test-pch-"):
        shutil.rmtree(_PCH_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance shared by every test that needs actors."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, runtime_env={"env_vars": {"PYTHONUNBUFFERED": "1"}})
    yield ray
    ray.shutdown()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A private compile cache so tests never see each other's builds."""
    d = tmp_path / "cache"
    monkeypatch.setenv("KFRAY_CACHE", str(d))
    return d


@pytest.fixture(scope="session")
def matmul_run(ray_local, tmp_path_factory):
    """One real matmul search (g++ builds, real timings), shared by the tests that look at a finished
    run: 2 islands, 2 evaluators, migrations every 2 generations, prompts evolved every 2 reports.
    test_search checks the search itself, test_report renders it, test_qd_gradient reads its
    transitions; none of them changes what the run wrote (reports go beside it)."""
    from kfray.config import load_config
    from kfray.driver import run_search

    root = tmp_path_factory.mktemp("matmul_run")
    cache = root / "cache"
    cfg = load_config(None, ["tasks=[matmul]", "search.islands=2", "search.budget=14", "search.batch=2",
                             "search.migrate_every=2", "eval.evaluators=2", "prompts.evolve_every=2",
                             f"eval.cache_dir={cache}"])
    summary = run_search(cfg, root / "run", progress=False)
    return {"run_dir": root / "run", "summary": summary, "cfg": cfg, "cache": cache}
