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
