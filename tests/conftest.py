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
