"""Connecting to Ray: attach to a cluster, or start a local instance sized for the run."""
from __future__ import annotations

import os
import socket
import tempfile

from kfray.config import usable_cores
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


_verbose = os.environ.get("KFRAY_VERBOSE", "") not in ("", "0")
# Ray's own lines that say nothing a kfray user acts on: the raylet's notice that it started more
# worker processes than CPUs (kfray's islands and evaluators are many small actors by design).
_RAY_NOISE = ("worker processes have been started", "workers have been started")


def set_verbose(on: bool = True) -> None:
    """Show Ray's own start-up lines and worker warnings (`--verbose`); off: kfray's lines only."""
    global _verbose
    _verbose = bool(on)


def _quiet_ray() -> None:
    """Keep Ray's start-up notices (token authentication, dashboard, deprecations) and its
    worker-pool warnings out of the terminal: its logger shows errors only, and the driver's
    listener for raylet messages drops the worker-pool ones (errors still come through)."""
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    show = ray_worker.print_to_stdstream
    if getattr(show, "_kfray_quiet", False):
        return

    def print_to_stdstream(data, ignore_prefix: bool, **kw):
        lines = [ln for ln in data.get("lines", []) if not any(n in str(ln) for n in _RAY_NOISE)]
        if data.get("lines") and not lines:
            return
        return show({**data, "lines": lines}, ignore_prefix, **kw)

    print_to_stdstream._kfray_quiet = True
    ray_worker.print_to_stdstream = print_to_stdstream


def connect(address: str = "", num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if not _verbose:
        _quiet_ray()
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=_verbose)
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
    ray.init(address="local", num_cpus=max(num_cpus or 0, usable_cores()), **kwargs)
    stop_log_monitor()


def stop_log_monitor() -> None:
    """End the log monitor of the Ray instance this process started: with log_to_driver off nobody
    reads what it publishes, and it reads every worker's log files ten times a second (about 0.02 of
    a core for as long as the instance lives, growing with the number of workers)."""
    try:
        from ray._private import worker as ray_worker

        node = ray_worker._global_node
        if node is not None and node.head:
            node.kill_log_monitor(check_alive=False)
    except Exception:           # a private Ray interface: if it moved, the monitor only costs CPU
        pass


def resources() -> dict:
    import ray

    return ray.cluster_resources()
