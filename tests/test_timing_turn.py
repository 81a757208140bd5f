"""KFRAY_TIMING_LOCK: judges in different processes take turns to time, and the wait for a turn is
not charged to the kernel (kfray/eval/timing_turn.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

JUDGE = r"""
import json, sys, time
from kfray.eval.timing_turn import timing_turn
asked = []
job = {"started": time.perf_counter(), "call_deadline_s": 5.0, "extend": asked.append}
with timing_turn(job):
    t0 = time.time()
    with timing_turn(job):          # a job inside a job takes no second turn (it would wait on itself)
        time.sleep(float(sys.argv[1]))
    t1 = time.time()
print(json.dumps({"span": [t0, t1], "extend": asked}))
"""


def _judges(n: int, env: dict, hold: float = 0.4) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-c", JUDGE, str(hold)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    return [json.loads(p.communicate(timeout=60)[0]) for p in procs]


def test_judges_with_the_lock_never_time_side_by_side_and_the_wait_moves_the_deadline(tmp_path):
    env = {**os.environ, "KFRAY_TIMING_LOCK": str(tmp_path / "timing.lock")}
    out = sorted(_judges(3, env), key=lambda r: r["span"][0])
    for a, b in zip(out, out[1:]):
        assert a["span"][1] <= b["span"][0], f"two judges timed at once: {a['span']} and {b['span']}"
    waited = [r for r in out if r["extend"]]
    assert len(waited) >= 2, "judges that waited for their turn did not have their deadline moved"
    assert all(r["extend"][0] > 5.0 for r in waited), [r["extend"] for r in waited]


def test_without_the_lock_judges_time_at_once():
    env = {k: v for k, v in os.environ.items() if k != "KFRAY_TIMING_LOCK"}
    a, b = _judges(2, env, hold=1.5)
    assert a["span"][0] < b["span"][1] and b["span"][0] < a["span"][1], "judges waited on a lock nobody set"
    assert not a["extend"] and not b["extend"]
