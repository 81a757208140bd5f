"""Evaluator: owns one device (or CPU slot), compiles a candidate and runs it in the sandbox.

`Evaluator` is a plain class so tests can drive it without Ray; `make_evaluators` wraps it as
Ray actors tagged with the resources of the device they own. A GPU evaluator is a threaded
actor: several `evaluate` calls compile at once on the node's CPUs (nvcc is a subprocess, so
threads overlap), and only the sandbox run (load, check, time) holds the device lock. With the
queue keeping more jobs than one in flight per GPU, the GPU never waits on a compiler.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from kfray.candidate import (TIER_COMPILE_ERROR, TIER_NO_CODE, TIER_RUNTIME_ERROR, Candidate,
                             EvalResult)
from kfray.config import EvalConfig, kernel_threads
from kfray.eval.backends.base import CompileError, get_backend
from kfray.eval.sandbox import Sandbox
from kfray.eval.fits import fit_message
from kfray.tasks import load_task
from kfray.tasks.suite_spec import suite_task_data


class Evaluator:
    def __init__(self, backend_name: str, cfg: EvalConfig, name: str = "evaluator"):
        self.cfg = cfg
        self.name = name
        self.backend = get_backend(backend_name, cfg)
        threads = str(kernel_threads(cfg))     # the kernel's and the reference's (numpy, OpenBLAS) alike
        env = {"OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "OMP_PROC_BIND": "false"}
        self.sandbox = Sandbox(backend_name, cfg, env)
        self._compiled: set[str] = set()     # tasks whose torch.compile baseline this sandbox has timed
        self.device_lock = threading.Lock()
        self.evaluated = 0
        self.device_busy_s = 0.0

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "hardware": self.backend.hardware_class(),
                "facts": self.backend.device_facts(), "pid": os.getpid(), "node": _node_id()}

    def evaluate(self, cand: dict | Candidate, task_ref: str | None = None, tune: bool = True,
                 retime: bool = False) -> dict:
        """Compile, check and time one candidate; every failure is a result, never an exception.
        With `eval.tune_budget`, a candidate with @kf.param tunables is tuned (kfray.eval.tuner).
        `retime`: a kernel judged correct before, timed again with its reference timed afresh in
        the same job (the timed runs' checks and the recheck still apply; kfray.driver.retime)."""
        c = cand if isinstance(cand, Candidate) else Candidate.from_dict(cand)
        if tune and not retime and self.cfg.tune_budget > 0 and c.source.strip():
            from kfray.eval.tuner import tune_candidate
            tuned = tune_candidate(self, c, task_ref)   # None: nothing to tune
            if tuned is not None:
                return tuned
        res = EvalResult(candidate_id=c.id, tier=TIER_NO_CODE, hardware=self.backend.hardware_class(),
                         evaluator=self.name)
        self.evaluated += 1
        if not c.source.strip():
            res.reason = c.no_code_reason or "no source"
            return res.to_dict()
        task = load_task(task_ref or c.task)
        too_big = fit_message(task, self.backend.name, self.cfg, self.backend.device_facts())
        if too_big:      # the task's fault, not the kernel's: nothing runs, nothing is charged
            res.tier, res.reason = TIER_RUNTIME_ERROR, f"task {task.name}: {too_big}; nothing was run"
            res.facts["not_charged"] = True
            return res.to_dict()
        t0 = time.perf_counter()
        try:
            build = self.backend.compile(c.source, c.params, task)
        except CompileError as e:
            res.tier, res.reason = TIER_COMPILE_ERROR, str(e)
            res.stage_seconds["compile"] = time.perf_counter() - t0
            return res.to_dict()
        res.stage_seconds["compile"] = build.seconds
        res.facts.update(build.facts)
        res.facts["compile_cached"] = build.cached
        job = {"task_ref": task.ref or task_ref or c.task, "artifact": build.artifact,
               "trials": self.cfg.trials, "warmup": self.cfg.warmup, "repeats": self.cfg.repeats,
               "max_repeats": self.cfg.max_repeats, "min_time": self.cfg.min_time_s,
               "cache_bytes": int(self.backend.device_facts().get("cache_bytes", 32 << 20)),
               "torch_compile": bool(self.cfg.torch_compile and hasattr(task, "param_args")),
               "suite_perf_trials": self.cfg.suite_perf_trials, "suite_time_budget_s": self.cfg.suite_time_budget_s,
               "suite_ref_pace": self.cfg.suite_ref_pace, "suite_rounds": self.cfg.suite_rounds,
               "suite_pin_cpu": self.cfg.suite_pin_cpu,
               "slow_factor": self.cfg.slow_factor, "max_timeout_s": self.cfg.max_timeout_s,
               "input_seed": self.cfg.input_seed, "fresh_reference": retime}
        if retime:
            job["trials"] = 0
        if getattr(task, "suite", None) is not None and self.backend.name.startswith("torch_ext"):
            job["suite_task"] = suite_task_data(task)    # the judge needs no second load (a model's trace)
        with self.device_lock:
            t_dev = time.perf_counter()
            try:
                out = self.sandbox.run(job, self._timeout(job, task))
            except RuntimeError as e:
                out = {"tier": TIER_RUNTIME_ERROR, "reason": f"sandbox failure: {e}"}
            held = time.perf_counter() - t_dev
            self.device_busy_s += held
        res.tier = out["tier"]
        res.reason = out.get("reason", "")
        res.times = out.get("times", {})
        res.ref_times = out.get("ref_times", {})
        res.noise = out.get("noise", 0.0)
        res.stage_seconds.update(out.get("stage_seconds", {}))
        res.stage_seconds["device_held"] = held      # the whole job in the sandbox, its stages and the wire
        res.facts.update(out.get("facts", {}))
        if out.get("recycled"):
            res.facts["sandbox_recycled"] = True
        _add_peak_fractions(res.facts, self.backend.device_facts())
        _add_published_baseline(res.facts, task, self.cfg)
        return res.to_dict()

    def _timeout(self, job: dict, task) -> float:
        """eval.timeout_s (per configuration on a suite's task: the suite judges and times each one
        on its own, robust-kbench 1000 samples a side), plus compile time per shape config the first
        time a fresh sandbox compiles a task's reference with torch.compile (then cached there)."""
        base = self.cfg.timeout_s * (max(1, len(task.shapes)) if getattr(task, "suite", None) else 1)
        proc = getattr(self.sandbox, "proc", None)
        if proc is None or proc.poll() is not None:      # a fresh sandbox remembers nothing
            self._compiled.clear()
        if not job["torch_compile"] or job["task_ref"] in self._compiled:
            return base
        self._compiled.add(job["task_ref"])
        return base + self.cfg.compile_timeout_s * len(task.shapes)

    def profile(self, cand: dict | Candidate, task_ref: str, shape: str | None = None) -> dict:
        """Nsight Compute facts of an elite (eval.ncu), on its task's largest shape unless named:
        the build comes from the compile cache, ncu runs while this evaluator holds its device."""
        if self.backend.name != "cuda":
            return {"error": f"profiling needs the cuda backend, not {self.backend.name}"}
        from kfray.eval.backends.cuda.profile import profile_artifact
        c = cand if isinstance(cand, Candidate) else Candidate.from_dict(cand)
        task = load_task(task_ref)
        try:
            build = self.backend.compile(c.source, c.params, task)
        except CompileError as e:
            return {"error": f"does not build: {str(e)[:200]}"}
        shape = shape or max(task.shapes, key=lambda s: task.cost(s)[0])
        with self.device_lock:
            return profile_artifact(build.artifact, task_ref, shape, timeout_s=self.cfg.ncu_timeout_s)

    def stats(self) -> dict:
        return {"name": self.name, "evaluated": self.evaluated, "sandbox_restarts": self.sandbox.restarts,
                "device_busy_s": self.device_busy_s,
                "compile_cache": self.backend.cache.stats() if hasattr(self.backend, "cache") else {}}

    def shutdown(self) -> None:
        self.sandbox.close()


def _node_id() -> str:
    """The Ray node this process runs on ('' outside Ray), so a run can show where work landed."""
    try:
        import ray
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:
        return ""


def _add_peak_fractions(facts: dict, device: dict) -> None:
    """Achieved GB/s and GFLOP/s as fractions of the device's measured copy bandwidth and fp32 rate."""
    bw = device.get("copy_bandwidth_gbps") or 0.0
    rate = (device.get("fp32_matmul_tflops") or 0.0) * 1e3
    for shape in facts.get("per_shape", {}).values():
        if bw and "gbps" in shape:
            shape["fraction_of_copy_bw"] = shape["gbps"] / bw
        if rate and "gflops" in shape:
            shape["fraction_of_fp32_peak"] = shape["gflops"] / rate


def _add_published_baseline(facts: dict, task, cfg: EvalConfig) -> None:
    """With eval.suite_baseline, a KernelBench result's speedup against KernelBench's published time."""
    suite, figures = getattr(task, "suite", None), facts.get("suite")
    if not cfg.suite_baseline or suite is None or suite.kind != "kernelbench" or not isinstance(figures, dict) \
            or not figures.get("avg_mean_ms"):
        return
    from kfray.tasks.kb_baseline import published_baseline

    base = published_baseline(cfg.suite_baseline, suite.path)
    if base:
        figures["published"] = {**base, "speedup": base["mean_ms"] / figures["avg_mean_ms"]}


def evaluator_options(backend_name: str, cfg: EvalConfig) -> dict[str, Any]:
    """Ray options of one evaluator: the CPUs, GPU and custom resources of what it owns."""
    import ray

    opts: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": cfg.num_cpus}
    resources: dict[str, float] = {}
    if backend_name in ("cuda", "torch_ext_cuda"):     # one GPU each; builds ahead in threads
        opts["max_concurrency"] = cfg.compile_workers + 1
        if cfg.accelerator_type:   # e.g. H200: Ray advertises accelerator_type:H200 on such nodes
            resources[f"accelerator_type:{cfg.accelerator_type}"] = 0.001
    elif backend_name == "cpu":    # the next candidate builds (niced) while this one is judged
        opts["max_concurrency"] = 2
    elif backend_name == "sycl":   # one device: compile ahead in threads, the sandbox run holds the lock
        from kfray.eval.backends.sycl.runtime import evaluator_resources
        opts["max_concurrency"] = cfg.compile_workers + 1
        resources.update(evaluator_resources(cfg, ray.cluster_resources()) or {})  # sycl_gpu / sycl_cpu
    num_gpus = cfg.num_gpus if cfg.num_gpus >= 0 else (1 if backend_name in ("cuda", "torch_ext_cuda") else 0)
    if num_gpus:
        opts["num_gpus"] = num_gpus
    resources.update(cfg.resources)
    if resources:
        opts["resources"] = resources
    return opts


def make_evaluators(backend_name: str, cfg: EvalConfig, count: int, run_name: str = "kfray",
                    label: str = "") -> list:
    """Evaluator actors on Ray, each reserving the resources of what it owns; restarted on death.

    With `eval.placement` spread or pack they are placed as a gang: one placement group holds a
    bundle per evaluator, and the run starts only once every bundle is reserved (a search sized
    for 8 GPUs does not creep along on the 3 a busy cluster has free)."""
    import ray

    from kfray.eval.isolation import active
    active(cfg.isolation)     # once at start: strict stops here, namespaces without them says so (each
                              # evaluator checks its own node again)
    actor_cls = ray.remote(Evaluator)
    opts = evaluator_options(backend_name, cfg)
    short = cluster_shortfall(opts, count, ray.cluster_resources())
    if short:
        from kfray.errors import KfrayError
        raise KfrayError(f"{count} evaluators for backend {backend_name} cannot all start: {short}; "
                         f"set eval.evaluators lower (0: one per GPU) or add nodes")
    tag = label or backend_name
    groups = _gang(opts, cfg, count, f"{run_name}-evaluators-{tag}") if cfg.placement != "none" else None
    actors = []
    for i in range(count):
        o = dict(opts)
        if groups is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            o["scheduling_strategy"] = PlacementGroupSchedulingStrategy(groups, placement_group_bundle_index=i)
        actors.append(actor_cls.options(name=f"{run_name}-evaluator-{tag}-{i}", **o).remote(backend_name, cfg, f"{tag}-{i}"))
    return actors


def cluster_shortfall(opts: dict, count: int, cluster: dict[str, float]) -> str:
    """What `count` evaluators with these actor options need beyond the whole cluster's resources
    ("" when it has enough): a request no node set can ever meet fails at once, not after a wait."""
    need = {"CPU": float(opts.get("num_cpus") or 0), "GPU": float(opts.get("num_gpus") or 0),
            **{k: float(v) for k, v in opts.get("resources", {}).items()}}
    short = [f"{k} {v * count:g} (the cluster has {cluster.get(k, 0):g})"
             for k, v in need.items() if v > 0 and v * count > cluster.get(k, 0) + 1e-9]
    return ", ".join(short)


def _gang(opts: dict, cfg: EvalConfig, count: int, name: str):
    """A ready placement group with one bundle per evaluator, or a KfrayError naming what is missing."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from kfray.errors import KfrayError

    if cfg.placement not in ("spread", "pack"):
        raise KfrayError(f"eval.placement is {cfg.placement!r}; expected none, spread or pack")
    bundle = {"CPU": float(opts.get("num_cpus") or 0), "GPU": float(opts.get("num_gpus") or 0),
              **{k: float(v) for k, v in opts.get("resources", {}).items()}}
    bundle = {k: v for k, v in bundle.items() if v > 0}
    if not bundle:
        return None                   # nothing to reserve: every node can take them
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=cfg.placement.upper(), name=name)
    ready, _ = ray.wait([pg.ready()], timeout=cfg.placement_timeout_s)
    if not ready:
        remove_placement_group(pg)
        free = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
        raise KfrayError(f"the cluster cannot place {count} evaluators of {bundle} each together "
                         f"({cfg.placement}, waited {cfg.placement_timeout_s:.0f} s); free now: {free}. "
                         f"Lower eval.evaluators, add nodes, or set eval.placement: none")
    return pg


def release_gangs(run_name: str) -> None:
    """Remove the run's evaluator placement groups (killing actors does not free their bundles)."""
    try:
        from ray.util.placement_group import placement_group_table, remove_placement_group, get_placement_group

        for g in placement_group_table().values():
            if g.get("name", "").startswith(f"{run_name}-evaluators-") and g.get("state") != "REMOVED":
                remove_placement_group(get_placement_group(g["name"]))
    except Exception:
        pass
