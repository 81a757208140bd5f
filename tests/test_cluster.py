"""Multi-node behaviour on one machine: a ray.cluster_utils.Cluster with nodes of different
resources, run in its own process (it needs its own Ray instance, not the session's)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "cluster" / "multinode_search.py"


@pytest.mark.slow
def test_heterogeneous_cluster_placement_and_node_loss(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["finished"], out
    gpu = {k: v for k, v in out["placement"].items() if k.startswith("gpuA")}
    sycl = {k: v for k, v in out["placement"].items() if k.startswith("syclgpu")}
    assert len(gpu) == 2 and set(gpu.values()) <= {"gpuA-1", "gpuA-2"}, out["placement"]
    assert list(sycl.values()) == ["sycl"], out["placement"]
    assert "head" not in gpu.values() and "head" not in sycl.values()
    # the node went away mid-search: nothing lost, nothing evaluated twice, the budget is kept
    assert out["removed_at"] < out["budget"]
    assert out["rows"] == out["distinct"] == out["evaluated"] == out["budget"], out


def test_evaluators_start_as_a_gang_or_the_run_says_what_is_missing(ray_local):
    """eval.placement: one placement group for a class's evaluators; too big a gang fails fast
    with the resources it wanted and what is free, instead of starting short-handed."""
    from kfray.config import EvalConfig
    from kfray.errors import KfrayError
    from kfray.eval.evaluator import make_evaluators, release_gangs
    from ray.util.placement_group import placement_group_table

    ray = ray_local
    cfg = EvalConfig(placement="spread", num_cpus=1, placement_timeout_s=5, tune_budget=0)
    evs = make_evaluators("cpu", cfg, 2, "gangtest")
    try:
        infos = ray.get([e.info.remote() for e in evs], timeout=120)
        assert [i["name"] for i in infos] == ["cpu-0", "cpu-1"]
        groups = [g for g in placement_group_table().values() if g["name"] == "gangtest-evaluators-cpu"]
        assert groups and groups[0]["state"] == "CREATED" and len(groups[0]["bundles"]) == 2
    finally:
        for e in evs:
            ray.kill(e)
        release_gangs("gangtest")
    assert all(g["state"] == "REMOVED" for g in placement_group_table().values() if g["name"].startswith("gangtest"))
    # more than the whole cluster has: said at once, whatever the placement
    for placement in ("pack", "none"):
        too_many = EvalConfig(placement=placement, num_cpus=1, placement_timeout_s=3, tune_budget=0)
        with pytest.raises(KfrayError, match=r"64 evaluators .* cannot all start: CPU 64 \(the cluster has 4\)"):
            make_evaluators("cpu", too_many, 64, "gangtest2")
    # enough in the cluster but not free now (a group holds 3 of its 4 CPUs): the gang waits, then says so
    from ray.util.placement_group import placement_group, remove_placement_group
    hold = placement_group([{"CPU": 3.0}])
    ray.get(hold.ready(), timeout=60)
    try:
        busy = EvalConfig(placement="pack", num_cpus=1, placement_timeout_s=3, tune_budget=0)
        with pytest.raises(KfrayError, match=r"cannot place 2 evaluators of \{'CPU': 1.0\}.*free now"):
            make_evaluators("cpu", busy, 2, "gangtest3")
    finally:
        remove_placement_group(hold)
