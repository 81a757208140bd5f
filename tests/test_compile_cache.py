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
