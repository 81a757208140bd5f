"""Connecting to Ray: attach to a cluster, or start a local instance sized for the run."""
from __future__ import annotations

import os

from kfray.errors import KfrayError


def connect(address: str = "", num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise KfrayError(f"no Ray cluster answered at {address!r} ({str(e).splitlines()[0][:200]}); start one "
                             "with `ray start --head` (and `RAY_AUTH_MODE=token` where token authentication is "
                             "on), or leave --address out to run locally") from None
        return
    ray.init(num_cpus=max(num_cpus or 0, os.cpu_count() or 1), **kwargs)


def resources() -> dict:
    import ray

    return ray.cluster_resources()
