"""Typed run configuration: dataclasses filled from YAML plus `--set a.b=c` overrides.

Unknown keys and values of the wrong type are errors that name the key and the file.
"""
from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kfray.errors import ConfigError


@dataclass
class SearchConfig:
    islands: int = 4                 # islands per task
    max_island_actors: int = 32      # sweeps: islands of all tasks together (each is a process that
                                     # loads its task); more tasks than this get fewer islands each
    budget: int = 48                 # evaluations per task, seeds included
    batch: int = 2                   # candidates an island proposes per generation
    migrate_every: int = 2           # generations between migrations
    checkpoint_every: int = 5        # generations between island checkpoints (results since are replayed)
    share_budget: bool = True        # a task that can use no more of its budget (it ran out of new
                                     # kernels) gives the rest to the others, in a plain run as in a sweep
    migrants: int = 2                # top elites each island sends per migration
    topology: str = "ring"           # ring | full | custom
    adjacency: list = field(default_factory=list)  # for custom: adjacency[i] = islands i sends to
    explore: float = 0.2             # parent selection: under-visited cells
    exploit: float = 0.7             # parent selection: fitness-weighted elites
    random: float = 0.1              # parent selection: uniform over elites
    inspirations: int = 2            # elites of other cells shown with the parent
    min_gain: float = 0.02           # relative gain an elite replacement must exceed, beyond the noise
    time_limit_s: float = 0.0        # 0: none; otherwise stop proposing after this many seconds
    seed: int = 0
    qd_weight: float = 0.3           # share of the QD gradient in parent sampling (0: off)
    qd_weights: list = field(default_factory=lambda: [0.4, 0.4, 0.2])  # fitness, improvement rate, exploration
    qd_window: int = 256             # transitions the QD gradient remembers
    qd_directives: bool = True       # QD-gradient and target-cell directives in the prompt
    target_strategy: str = "mutate"  # correct parent: mutate | intensify | specialize | balance
    near_duplicate: float = 0.98     # reject a child this similar to an elite (same cell, params); 0: off
    parents: str = "archive"         # archive (MAP-Elites) | seeds (random search: children of seeds only)
    archive: str = "map_elites"      # map_elites (4x4x4 grid) | single (one cell: a plain elitist GA)
    retime_top: int = 2              # at the end, the top kernels of each task timed again (0: off)...
    retime_rounds: int = 2           # ...this many times each (the baseline seed too), round-robin, each
                                     # with its reference timed afresh beside it


@dataclass
class EvalConfig:
    backend: str = "cpu"             # cpu | cuda | sycl
    evaluators: int = 2              # evaluator actors (cuda: 0 means one per GPU); CPU: 2, each kernel and
                                     # its reference on its share of the cores (1 evaluator: all of them,
                                     # one candidate at a time, about twice the wall time)
    num_cpus: float = 1.0            # CPUs each evaluator reserves
    threads: int = 0                 # OpenMP / BLAS threads of the kernel and of the reference alike (cpu
                                     # backend); 0: the machine's cores shared among its evaluators
    timeout_s: float = 30.0          # one candidate's correctness + timing, in the sandbox
    compile_timeout_s: float = 60.0
    trials: int = 2                  # fresh random inputs per shape config for correctness
    input_seed: int = 0              # 0: inputs drawn unpredictably (recorded in facts.input_seed); else replay that draw
    warmup: int = 1
    repeats: int = 5                 # at least this many timed runs per shape config
    max_repeats: int = 50
    min_time_s: float = 0.02         # keep repeating until this much time was measured
    memory_limit_mb: int = 4096      # address-space limit of the sandbox (cpu backend)
    cache_dir: str = ""              # compile cache; default ~/.cache/kfray
    flags: list = field(default_factory=list)  # extra compiler flags
    compile_workers: int = 4         # GPU backends: candidates compiling ahead while one is timed
    accelerator_type: str = ""       # cuda: only GPUs Ray tags accelerator_type:<this> (e.g. H200)
    simulate_s: float = 0.2          # sim backend: seconds each evaluation takes (engine benchmarks)
    resources: dict = field(default_factory=dict)   # extra Ray resources each evaluator needs
    num_gpus: float = -1.0           # GPUs each evaluator reserves; -1: 1 for cuda, else 0
    label: str = ""                  # hardware class name; default: what the backend reports
    share_cache: bool = True         # share builds across the cluster's nodes through a Ray actor
    cache_server: str = ""           # set by the coordinator: the name of that actor
    sycl_device: str = ""            # sycl: dpctl filter string (opencl:cpu, level_zero:gpu:0); "" = default
    sycl_form: str = "jit"           # sycl: jit (kernels compiled at run time) | aot (icpx) | opencl (OpenCL C)
    torch_compile: bool = False      # PyTorch tasks: also time torch.compile of the reference (a second
                                     # baseline; one compile per task, shape and sandbox; sweeps turn it on)
    tune_budget: int = 3             # @kf.param settings the inner tuner measures per candidate (0: off)
    ncu: bool = False                # cuda: profile each task's best with Nsight Compute at the end of
                                     # the run (when ncu is on PATH): occupancy, DRAM/SM share, stalls
    ncu_timeout_s: float = 120.0
    placement: str = "none"          # none | spread | pack: a class's evaluators start all together, in
                                     # one Ray placement group, or the run stops with what is missing
    placement_timeout_s: float = 120.0   # how long the whole group may wait for its resources
    suite_perf_trials: int = 0       # suite tasks: timed trials per side and config (0: the suite's own,
                                     # KernelBench 100, robust-kbench 1000)
    suite_time_budget_s: float = 0.0 # suite tasks: stop a side's timing after this long (at least 5
                                     # samples; 0: no limit), for problems of many milliseconds
    suite_ref_pace: bool = True      # suite tasks: the reference's calls start at the candidate's measured
                                     # cadence (each of its calls waits on the wire); false: the
                                     # wire's empty round trip apart, which left the smallest tasks' reference
                                     # idle less between calls than its kernel
    suite_pin_cpu: bool = True       # suite tasks: the kernel's and the reference's runners on one CPU
                                     # (not the judge's core) while timed
    suite_rounds: int = 10           # suite tasks: each side's timed calls in up to this many blocks (10 calls
                                     # a block at least), the two sides' alternating (inputs up to 1 GiB); 1: one
                                     # block a side
    suite_ref_timing: str = "auto"   # suite tasks: where the reference is timed: runner (its own, as the candidate
                                     # is timed in its own), judge, or auto (runner on the GPU for forward tasks)
    slow_factor: float = 20.0        # suite tasks: a call slower than the reference's by this factor is a
                                     # timeout (the limits follow the reference's own measured time)
    max_timeout_s: float = 1800.0    # suite tasks: the most a job's limit grows to for a slow reference
    suite_baseline: str = ""         # KernelBench tasks: its published baseline_time_torch*.json, for a
                                     # speedup against KernelBench's own eager time as well
    suite_flags: bool = True         # suite tasks: build with the suite's own flags (robust-kbench:
                                     # nvcc --use_fast_math)
    max_roofline_fraction: float = 1.5   # flag (and never trust) a speedup above this x the device's
                                     # measured copy bandwidth / fp32 rate; 0: no check
    isolation: str = "namespaces"    # strict | namespaces | none: the sandbox worker and the compilers
                                     # run in their own user, mount, network and PID namespaces (no
                                     # network, home and /tmp hidden, read-only files); namespaces: where
                                     # the kernel allows, else warn once; strict: refuse to run without


@dataclass
class ProposerConfig:
    kind: str = "offline"            # offline | llm
    base_url: str = ""               # default: $OPENAI_BASE_URL
    model: str = ""                  # default: $KFRAY_MODEL
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    models: list = field(default_factory=list)  # [{model, weight, cost_per_1k_input, cost_per_1k_output, base_url?}]
    bandit: bool = False             # choose the model per call by UCB over its children's improvement
    bandit_c: float = 0.5            # UCB exploration constant
    bandit_cost: float = 0.1         # UCB penalty per unit of relative price
    max_cost: float = 0.0            # stop proposing once this much was spent (0: no limit)
    token_budget: int = 0            # stop proposing once this many tokens were used (0: no limit)
    max_concurrent: int = 0          # requests in flight per endpoint, all islands and tasks together;
                                     # 0: 1 for a server on this machine (127.0.0.1, localhost), else 16
    stream: bool = True              # stream answers: timeout_s is then the idle time between tokens
    edit_mode: str = "auto"          # diff (SEARCH/REPLACE against the parent) | rewrite (whole file) |
                                     # auto (a bandit between the two)
    repair: bool = True              # a child that fails to compile or check goes back once, with its
                                     # diagnostics, for a fix (the budget counts the pair once)
    repeat_asks: int = 1             # an answer that repeats a kernel tried is asked again this often,
                                     # then edited by kfray (origin llm+edit); 0 on a one-slot local endpoint
    repair_asks: bool = True         # a failure no fix-up mends is sent to the model (else only the
                                     # fix-ups run: off by default on a one-slot local endpoint)
    comments: bool = True            # sources in prompts with their comments, and answers asked with them;
                                     # false: neither (a fifth fewer tokens; on a one-slot local endpoint)
    prompt_tokens: int = 3000        # prompt budget: contract, parent, feedback first; the rest while
                                     # room remains (0: no budget); 3000 leaves a 4k context room to answer


@dataclass
class PromptConfig:
    population: int = 6              # meta-prompts kept alive
    evolve_every: int = 6            # reports between new meta-prompts
    explore: float = 0.2             # chance to sample a meta-prompt uniformly


@dataclass
class RunConfig:
    tasks: list = field(default_factory=lambda: ["axpb", "softmax", "matmul"])
    search: SearchConfig = field(default_factory=SearchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    proposer: ProposerConfig = field(default_factory=ProposerConfig)
    prompts: PromptConfig = field(default_factory=PromptConfig)
    run_dir: str = ""
    address: str = ""                # Ray address; empty starts a local instance
    hardware: list = field(default_factory=list)    # hardware classes: eval overrides, one mapping each

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_CHOICES = {
    ("search", "topology"): ("ring", "full", "custom"),
    ("eval", "backend"): ("cpu", "cuda", "sycl", "sim", "torch_ext_cpu", "torch_ext_cuda"),
    ("eval", "sycl_form"): ("jit", "aot", "opencl"),
    ("eval", "isolation"): ("strict", "namespaces", "none"),
    ("eval", "suite_ref_timing"): ("auto", "runner", "judge"),
    ("proposer", "kind"): ("offline", "llm"),
    ("proposer", "edit_mode"): ("diff", "rewrite", "auto"),
    ("search", "target_strategy"): ("mutate", "intensify", "specialize", "balance"),
    ("search", "parents"): ("archive", "seeds"),
    ("search", "archive"): ("map_elites", "single"),
}

_HINTS = {
    ("eval", "isolation"): (" (strict: refuse to run without namespace isolation; namespaces: isolate where "
                            "the kernel allows, else warn once; none: no isolation, a fault boundary only)"),
}


def _coerce(value: Any, typ: Any, key: str, where: str) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    ok = {int: isinstance(value, int) and not isinstance(value, bool),
          float: isinstance(value, float), str: isinstance(value, str),
          bool: isinstance(value, bool), list: isinstance(value, list), dict: isinstance(value, dict)}.get(typ)
    if ok is None or ok:
        return value
    raise ConfigError(f"{where}: key '{key}' must be {typ.__name__}, got {type(value).__name__} {value!r}")


def _fill(obj: Any, data: Any, prefix: str, where: str, explicit: set | None = None) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: '{prefix or 'top level'}' must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            shown = repr(key) if not str(key).isprintable() else f"'{key}'"     # one line, always
            raise ConfigError(f"{where}: unknown key {shown} (known here: {', '.join(sorted(names))})")
        typ = hints[k]
        if dataclasses.is_dataclass(typ):
            _fill(getattr(obj, k), v, key + ".", where, explicit)
            continue
        origin = typing.get_origin(typ) or typ
        v = _coerce(v, origin, key, where)
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where}: key '{key}' must be a finite number, got {v}")
        choices = _CHOICES.get(tuple(key.split(".")))
        if choices and v not in choices:
            hint = _HINTS.get(tuple(key.split(".")), "")
            raise ConfigError(f"{where}: key '{key}' must be one of {', '.join(choices)}, got {v!r}{hint}")
        setattr(obj, k, v)
        if explicit is not None:
            explicit.add(key)


def _check(cfg: RunConfig, where: str) -> None:
    s, e = cfg.search, cfg.eval
    for key, val, lo in [("search.islands", s.islands, 1), ("search.max_island_actors", s.max_island_actors, 1),
                         ("search.budget", s.budget, 1),
                         ("search.batch", s.batch, 1), ("search.migrate_every", s.migrate_every, 1),
                         ("search.checkpoint_every", s.checkpoint_every, 1),
                         ("search.migrants", s.migrants, 0), ("eval.evaluators", e.evaluators, 0),
                         ("eval.trials", e.trials, 1), ("eval.repeats", e.repeats, 1),
                         ("eval.threads", e.threads, 0),
                         ("proposer.max_concurrent", cfg.proposer.max_concurrent, 0),
                         ("proposer.prompt_tokens", cfg.proposer.prompt_tokens, 0),
                         ("proposer.max_tokens", cfg.proposer.max_tokens, 1)]:
        if val < lo:
            raise ConfigError(f"{where}: key '{key}' must be >= {lo}, got {val}")
    if min(s.explore, s.exploit, s.random) < 0 or s.explore + s.exploit + s.random <= 0:
        raise ConfigError(f"{where}: search.explore/exploit/random must be >= 0 and not all 0")
    if cfg.proposer.timeout_s <= 0:
        raise ConfigError(f"{where}: key 'proposer.timeout_s' must be > 0 (seconds a request in flight may "
                          f"stay silent), got {cfg.proposer.timeout_s}")
    if e.timeout_s <= 0:
        raise ConfigError(f"{where}: key 'eval.timeout_s' must be > 0, got {e.timeout_s}")
    if e.placement not in ("none", "spread", "pack"):
        raise ConfigError(f"{where}: key 'eval.placement' must be none, spread or pack, got {e.placement!r}")
    if not cfg.tasks or not all(isinstance(t, str) for t in cfg.tasks):
        raise ConfigError(f"{where}: key 'tasks' must be a non-empty list of task names")
    for i, entry in enumerate(cfg.hardware):
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: hardware[{i}] must be a mapping of eval keys, got {type(entry).__name__}")
        _fill(dataclasses.replace(cfg.eval), entry, f"hardware[{i}].", where)   # validates keys and types
    if s.topology == "custom" and len(s.adjacency) != s.islands * max(1, len(cfg.hardware)):
        raise ConfigError(f"{where}: search.topology custom needs search.adjacency with one list per island "
                          f"({s.islands * max(1, len(cfg.hardware))}), got {len(s.adjacency)}")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset, a test
    worker given its own cores), not every core of the machine; threads beyond them only take
    turns on the same cores, and a timed kernel's threads waiting on each other is noise."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def kernel_threads(e: "EvalConfig") -> int:
    """The threads a CPU kernel and its reference get: eval.threads, or with 0 the usable cores
    divided among the evaluators (one each for the default 2 on 2 cores)."""
    if e.threads > 0:
        return e.threads
    return max(1, usable_cores() // max(1, e.evaluators))


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (['a', 'b'], c), with c read as YAML (numbers, lists, booleans)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set search.islands=2")
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def hardware_classes(cfg: RunConfig) -> list[EvalConfig]:
    """One EvalConfig per hardware class: `eval` with each `hardware` entry's overrides, or `eval` alone."""
    out = []
    for entry in cfg.hardware or [{}]:
        e = dataclasses.replace(cfg.eval, flags=list(cfg.eval.flags), resources=dict(cfg.eval.resources))
        _fill(e, entry, "hardware.", "configuration")
        out.append(e)
    return out


def config_from_dict(data: dict, where: str = "configuration") -> RunConfig:
    """A RunConfig from a dict such as RunConfig.to_dict() wrote (a run database's copy)."""
    cfg = RunConfig()
    _fill(cfg, data, "", where)
    _check(cfg, where)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Defaults, then the YAML file (if any), then each `--set key=value` in order."""
    cfg = RunConfig()
    explicit: set[str] = set()       # keys the file or a --set gave (defaults a run may still fit to its setting)
    if path is not None:
        where = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {where} does not exist")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (UnicodeDecodeError, OSError) as e:
            raise ConfigError(f"{where}: cannot be read as a UTF-8 text file ({type(e).__name__}: {e})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            loc = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{where}:{loc} is not valid YAML: {getattr(e, 'problem', e)}") from None
        _fill(cfg, data, "", where, explicit)
    for ov in overrides:
        keys, value = parse_override(ov)
        nested: Any = value
        for k in reversed(keys):
            nested = {k: nested}
        _fill(cfg, nested, "", f"--set {ov}" if ov.isprintable() else f"--set {ov!r}", explicit)
    _check(cfg, str(path) if path else "configuration")
    cfg.explicit = frozenset(explicit)
    return cfg
