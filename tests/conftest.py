"""Shared fixtures: one Ray instance for the whole session (ray.init costs 3 s), GPU/SYCL skips."""
from __future__ import annotations

import os

import pytest


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
