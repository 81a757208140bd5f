"""A search on a multi-node Ray cluster made on this machine (ray.cluster_utils.Cluster).

Nodes: a CPU-only head; node "gpuA-1" and "gpuA-2" advertising one GPU each of accelerator type
A (Ray can advertise GPUs that are not physically there); node "sycl" advertising sycl_gpu.
Evaluators run the `sim` backend (each evaluation a fixed time, no compiler) but ask for those
resources, so placement and the engine's handling of the lost node are what is tested.
Mid-search, node gpuA-2 is removed. Prints one JSON line with what the test checks.
"""
import json
import sqlite3
import sys
import threading
import time

import ray
from ray.cluster_utils import Cluster

from kfray.config import load_config
from kfray.driver import run_search

run_dir = sys.argv[1]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head": 1}})
gpu1 = cluster.add_node(num_cpus=2, num_gpus=1, resources={"accelerator_type:A": 1, "gpuA-1": 1})
gpu2 = cluster.add_node(num_cpus=2, num_gpus=1, resources={"accelerator_type:A": 1, "gpuA-2": 1})
sycl = cluster.add_node(num_cpus=1, resources={"sycl_gpu": 1, "sycl-node": 1})
cluster.wait_for_nodes()
ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
node_names = {gpu1.node_id: "gpuA-1", gpu2.node_id: "gpuA-2", sycl.node_id: "sycl",
              cluster.head_node.node_id: "head"}

budget = 36
cfg = load_config(None, [
    "tasks=[matmul@tiny]", "search.islands=2", f"search.budget={budget}", "search.batch=2", "search.migrate_every=2",
    "eval.backend=sim", "eval.simulate_s=0.5", "eval.tune_budget=0", "search.retime_top=0",
    "hardware=[{label: gpuA, evaluators: 2, num_gpus: 1, num_cpus: 1, resources: {'accelerator_type:A': 0.001}},"
    " {label: syclgpu, evaluators: 1, num_cpus: 1, resources: {sycl_gpu: 1}}]",
])
result = {}


def search():
    result["summary"] = run_search(cfg, run_dir, progress=False)


t = threading.Thread(target=search)
t.start()
deadline = time.time() + 180
while time.time() < deadline:                                   # remove a GPU node mid-search
    try:
        n = sqlite3.connect(f"{run_dir}/kfray.db").execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    except sqlite3.OperationalError:
        n = 0
    if n >= 12:
        break
    time.sleep(0.3)
cluster.remove_node(gpu2)
removed_at = n
t.join(timeout=300)
s = result.get("summary", {})
db = sqlite3.connect(f"{run_dir}/kfray.db")
meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
where = {k: node_names.get(v, v) for k, v in json.loads(meta.get("placement", "{}")).items()}
placement = {k: v for k, v in where.items() if not k.startswith("island")}
islands_on = sorted({v for k, v in where.items() if k.startswith("island")})
rows = db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM candidates").fetchone()
print(json.dumps({"placement": placement, "islands_on": islands_on, "removed_at": removed_at,
                  "evaluated": s.get("evaluated"), "budget": budget, "rows": rows[0], "distinct": rows[1],
                  "requeued": s.get("requeued"), "classes": s.get("hardware_classes"),
                  "finished": bool(s)}))
ray.shutdown()
cluster.shutdown()
