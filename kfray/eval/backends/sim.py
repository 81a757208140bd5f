"""Simulated backend: every evaluation takes a fixed time and returns a synthetic timing.

For measuring the engine itself (scheduling, queueing, archive, store) at many evaluators
without compilers or devices: `compile` sleeps `eval.simulate_s`; the "kernel" writes the
reference's outputs, and its time is the reference's scaled by a factor drawn from the source
and parameters, so the search still has a landscape to climb.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from kfray.eval.backends.base import Backend, Build


def _factor(source: str, params: dict) -> float:
    h = hashlib.sha256((source + json.dumps(params, sort_keys=True)).encode()).digest()
    return 0.25 + 1.75 * int.from_bytes(h[:4], "little") / 2 ** 32   # 0.25x .. 2x the reference


class SimBackend(Backend):
    name = "sim"
    language = "cpp"

    def hardware_class(self) -> str:
        return "sim"

    def device_facts(self) -> dict[str, Any]:
        return {"name": "simulated device", "simulate_s": self.cfg.simulate_s, "cache_bytes": 1 << 20}

    def compile(self, source: str, params: dict[str, Any], task) -> Build:
        time.sleep(self.cfg.simulate_s)
        return Build(f"sim:{_factor(source, params)}", self.cfg.simulate_s, False)

    def load(self, artifact: str, task):
        factor = float(artifact.split(":", 1)[1])
        outs = [o.name for o in task.outputs]

        def call(args: dict[str, Any]) -> int:
            t0 = time.perf_counter()
            res = task.run_reference(args)
            for name in outs:
                args[name][...] = res[name]
            call.last = (time.perf_counter() - t0) * factor
            return 0

        call.last = 0.0
        self._kernel = call
        return call

    def time_call(self, fn) -> float:
        fn()
        return getattr(self, "_kernel", fn).last if hasattr(self, "_kernel") else 0.0

    def to_device(self, args):
        import numpy as np
        return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in args.items()}
