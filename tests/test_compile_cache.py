"""The compile cache: content-addressed on one node, and shared across nodes through Ray."""
from __future__ import annotations

from kfray.config import EvalConfig
from kfray.eval.backends.cpu import CpuBackend
from kfray.eval.compile_cache import CacheServer
from kfray.source import parse_params
from kfray.tasks import load_task


def test_a_build_made_on_one_node_is_fetched_not_compiled_on_another(ray_local, tmp_path):
    ray = ray_local
    server = ray.remote(CacheServer).options(name="test-compile-cache", num_cpus=0).remote()
    try:
        task = load_task("matmul")
        src = task.seeds_for("cpp")[2].source
        params = parse_params(src).default()
        # Two "nodes": separate cache folders, one shared server.
        node_a = CpuBackend(EvalConfig(cache_dir=str(tmp_path / "a"), cache_server="test-compile-cache"))
        node_b = CpuBackend(EvalConfig(cache_dir=str(tmp_path / "b"), cache_server="test-compile-cache"))
        built = node_a.compile(src, params, task)
        assert not built.cached and node_a.cache.stats()["misses"] == 1
        ray.get(server.stats.remote())                      # the put has landed (actor calls are ordered)
        fetched = node_b.compile(src, params, task)
        assert fetched.cached, "node b must fetch node a's build instead of compiling"
        assert node_b.cache.stats() == {"hits": 0, "remote_hits": 1, "misses": 0, "hit_rate": 1.0}
        assert open(fetched.artifact, "rb").read() == open(built.artifact, "rb").read()
        other = dict(params, BK=64 if params["BK"] != 64 else 32)
        assert not node_b.compile(src, other, task).cached, "another setting is another build"
    finally:
        ray.kill(server)


def test_server_drops_the_oldest_builds_beyond_its_size():
    s = CacheServer(max_bytes=10)
    s.put("k1", ".so", b"123456")
    s.put("k2", ".so", b"abcdef")
    assert s.get("k1") is None and s.get("k2") == {".so": b"abcdef"}
    assert s.stats()["bytes"] == 6


def test_a_second_builder_of_a_key_waits_and_gets_the_first_ones_build(tmp_path):
    """Two processes that want the same build (two evaluators, or the tests' background prebuild and
    a test) build it once: the second waits for the first and is handed its artifact."""
    import subprocess
    import sys
    import time

    from kfray.eval.compile_cache import CompileCache

    cache = CompileCache(tmp_path / "cache", isolation_mode="none")
    key = CompileCache.key(source="x", kind="test")
    started = tmp_path / "started"
    first = subprocess.Popen([sys.executable, "-c", f"""
import pathlib, time
from kfray.eval.compile_cache import CompileCache
cache = CompileCache({str(tmp_path / "cache")!r}, isolation_mode="none")
with cache.building({key!r}, ".so") as done:
    assert done is None
    pathlib.Path({str(started)!r}).write_text("")
    time.sleep(1.0)                               # "compiling"
    tmp = cache.temp_path({key!r}, ".so")
    tmp.write_bytes(b"built by the first")
    cache.commit(tmp, {key!r}, ".so")
"""])
    try:
        deadline = time.time() + 60
        while not started.exists():
            assert first.poll() is None and time.time() < deadline, "the first builder did not start"
            time.sleep(0.02)
        with cache.building(key, ".so") as done:
            assert done is not None, "the second builder got in before the first had finished"
            assert done.read_bytes() == b"built by the first"
        assert first.wait(60) == 0
    finally:
        first.kill()
    other = CompileCache.key(source="y", kind="test")
    with cache.building(other, ".so") as done:          # a key nobody built: build it
        assert done is None
