"""Connecting to Ray: attach to a cluster, or start a local instance sized for the run."""
from __future__ import annotations

import os
import socket
import tempfile

from kfray.errors import KfrayError


def _auto_address() -> str:
    """Where `address: auto` leads: $RAY_ADDRESS, else the cluster this machine last started."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    try:
        with open(os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")) as f:
            return f.read().strip()
    except OSError:
        return ""


def probe_address(address: str, timeout: float = 3.0) -> None:
    """Fail fast, with one clear line, when nothing listens at a Ray address.

    ray.init would otherwise retry for minutes and print C++ log lines while it does."""
    target = _auto_address() if address == "auto" else address
    if not target:
        return                       # `auto` with no cluster on record: ray.init says so at once
    hostport = target.split("://", 1)[1] if "://" in target else target
    host, colon, port = hostport.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit():
        raise KfrayError(f"Ray address {address!r} is not host:port (e.g. 10.0.0.5:6379 or ray://10.0.0.5:10001); "
                         "fix --address (or `address:` in the config), or leave it out to run on this machine")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        why = e.strerror or type(e).__name__
        via = f" (from {address!r})" if target != address else ""
        raise KfrayError(f"no Ray cluster at {host}:{port}{via}: {why}. Start one there with "
                         f"`ray start --head --port={port}` (token authentication: the same token on every node, "
                         "RAY_AUTH_MODE=token), fix --address (or `address:` in the config), or leave it out to run "
                         "on this machine") from None


def connect(address: str = "", num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    address = address or os.environ.get("RAY_ADDRESS", "")   # set by `ray job submit` for its jobs
    if address:
        probe_address(address)
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise KfrayError(f"no Ray cluster answered at {address!r} ({str(e).splitlines()[0][:200]}); start one "
                             "with `ray start --head` (and `RAY_AUTH_MODE=token` where token authentication is "
                             "on), or leave --address out to run locally") from None
        return
    # "local": always a new instance of our own, never whichever other Ray instance on this
    # machine wrote itself down last (another user's, or another run's)
    ray.init(address="local", num_cpus=max(num_cpus or 0, os.cpu_count() or 1), **kwargs)


def resources() -> dict:
    import ray

    return ray.cluster_resources()
