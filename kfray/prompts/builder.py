"""Turns a ProposalContext into OpenAI chat messages [system, user].

Compact by design: long sources are truncated and the whole user message is capped, so a prompt
stays cheap and well inside any model's context window.
"""
from __future__ import annotations

from kfray.eval.profile_facts import profile_text
from kfray.prompts.contracts import kernel_contract
from kfray.proposal import Elite, ProposalContext

DIMENSIONS = ("memory", "compute", "parallelism")
MAX_SOURCE_LINES = 200          # parent / seed source
MAX_INSPIRATION_LINES = 60
MAX_PROMPT_CHARS = 24000

_FENCE = {"cpp": "cpp", "cuda": "cuda", "sycl": "cpp", "opencl": "c", "suite": "cuda"}
_LANG_NAME = {"cpp": "C++ (CPU, OpenMP allowed)", "cuda": "CUDA C++", "sycl": "SYCL C++",
              "opencl": "OpenCL C"}


def fence_tag(language: str) -> str:
    return _FENCE.get(language, language)


def _truncate(source: str, max_lines: int) -> str:
    """At most max_lines lines and about 60 characters a line on average, marked where cut."""
    lines = source.rstrip().splitlines()
    kept, size = [], 0
    for line in lines[:max_lines]:
        if size + len(line) > max_lines * 60:
            break
        kept.append(line)
        size += len(line) + 1
    if len(kept) == len(lines):
        return "\n".join(lines)
    return "\n".join(kept) + f"\n// ... [{len(lines) - len(kept)} more lines truncated]"


def _level(dim: str, level: int) -> str:
    """Name a descriptor level; falls back to plain numbers while descriptors is unavailable."""
    try:
        from kfray.descriptors import level_name
        return f"{dim} level {level} ({level_name(dim, level)})"
    except Exception:  # ImportError, or an unknown level
        return f"{dim} level {level}"


def _section(title: str, body: str) -> str:
    return f"## {title}\n{body.strip()}\n"


def _code(source: str, language: str, max_lines: int) -> str:
    return f"```{fence_tag(language)}\n{_truncate(source, max_lines)}\n```"


def _elite_header(e: Elite) -> str:
    params = ", ".join(f"{k}={v}" for k, v in e.candidate.params.items()) or "none"
    return f"params: {params}; fitness {e.result.fitness:.3f} (tier {e.result.tier})"


def _profile(e: Elite) -> str:
    """Nsight Compute facts of an elite (eval.ncu), when it has been profiled."""
    return profile_text((e.result.facts or {}).get("profile"))


def _tuning(e: Elite, limit: int = 6) -> str:
    """The inner tuner's measurements of an elite's @kf.param settings, one short line each."""
    rows = (e.result.facts or {}).get("tuning") or []
    lines = []
    for t in rows[:limit]:
        setting = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items()) or "default"
        how = f"{t.get('speedup', 0.0):.3f}x" if t.get("tier") == 5 else f"failed (tier {t.get('tier')})"
        lines.append(f"- {setting}: {how}")
    if len(rows) > limit:
        lines.append(f"- ... {len(rows) - limit} more settings measured")
    return "\n".join(lines)


def system_message(ctx: ProposalContext) -> str:
    text = ("You are an expert GPU and CPU kernel engineer. You write correct, fast kernels, "
            "reason about memory traffic, parallelism and the hardware, and answer with exactly "
            "one complete source file.")
    if ctx.meta_prompt and ctx.meta_prompt.sections.get("philosophy"):
        text += "\n\n" + ctx.meta_prompt.sections["philosophy"].strip()
    return text


def user_message(ctx: ProposalContext) -> str:
    task, lang = ctx.task, ctx.language
    parts = []

    body = f"**{task.name}**: {task.description}"
    if task.instructions:
        body += "\n\n" + task.instructions.strip()
    parts.append(_section("Task", body))

    if lang in ("sycl_jit", "opencl"):    # run-time compiled kernels: no host code, launches declared
        parts.append(_section("Kernel contract", kernel_contract(task, lang)))
    if lang == "suite":                   # the suite's own form: its contract, not kf_forward's
        from kfray.tasks.suite_form import contract as suite_contract
        parts.append(_section("Kernel contract", suite_contract(task)))
    contract = None if lang in ("sycl_jit", "opencl", "suite") else (
        f"Language: {_LANG_NAME.get(lang, lang)}. Export exactly this entry point and return 0 on success:\n"
        f"```{fence_tag(lang)}\n{task.signature(lang)}\n```\n"
        + ("Host code may launch any number of kernels. " if lang in ("cuda", "sycl") else "")
        + "Tunables may be declared as "
        "`// @kf.param NAME in [v1, v2, ...]` with constraints `// @kf.require expr`; each setting is "
        "compiled with `-DNAME=value`, so use the macro names in the code rather than hard-coded values.")
    if contract:
        parts.append(_section("Kernel contract", contract))

    shapes = "\n".join(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in cfg.items())
                       for name, cfg in task.shapes.items())
    parts.append(_section("Shape configs (all must be correct and fast)", shapes))

    if ctx.device_facts:
        parts.append(_section("Device", "\n".join(f"- {k}: {v}" for k, v in ctx.device_facts.items())))

    if ctx.parent is not None:
        p = ctx.parent
        parts.append(_section("Parent kernel (improve this)",
                              f"{_elite_header(p)}\n{_code(p.candidate.source, lang, MAX_SOURCE_LINES)}\n"
                              f"Evaluation feedback: {p.result.feedback()}"))
        tuning = _tuning(p)
        if tuning:
            parts.append(_section("Parameter settings measured for the parent (best first)", tuning))
        profile = _profile(p)
        if profile:
            parts.append(_section("Profiler (Nsight Compute) on the parent", profile))
    else:
        seed = task.baseline_seed(lang)
        if seed is not None:
            parts.append(_section("Starting point (baseline seed; no correct kernel yet)",
                                  _code(seed.source, lang, MAX_SOURCE_LINES)))

    if ctx.inspirations:
        insp = []
        for i, e in enumerate(ctx.inspirations, 1):
            insp.append(f"### Inspiration {i}: speedup {e.result.speedup:.3f}x; {_elite_header(e)}\n"
                        + _code(e.candidate.source, lang, MAX_INSPIRATION_LINES))
        parts.append(_section("Other kernels from the archive (ideas to borrow)", "\n".join(insp)))

    if ctx.target_cell:
        cell = ", ".join(_level(d, lvl) for d, lvl in zip(DIMENSIONS, ctx.target_cell))
        parts.append(_section("Target style", f"Aim for a kernel with {cell}."))

    if ctx.directives:
        parts.append(_section("Directives", "\n".join(f"- {d}" for d in ctx.directives)))

    if ctx.meta_prompt:
        for key, title in (("strategies", "Strategies"), ("pitfalls", "Pitfalls to avoid"),
                           ("analysis", "How to analyse")):
            if ctx.meta_prompt.sections.get(key):
                parts.append(_section(title, ctx.meta_prompt.sections[key]))

    parts.append(_section("Output format",
                          f"Think briefly, then give exactly one fenced code block "
                          f"(```{fence_tag(lang)}) holding the complete source file, including the "
                          f"`kf_forward` entry point and any @kf.param lines."))

    text = "\n".join(parts)
    if len(text) > MAX_PROMPT_CHARS:  # keep the head (task, contract) and the output format
        tail = parts[-1]
        text = text[:MAX_PROMPT_CHARS - len(tail) - 40] + "\n[... truncated ...]\n\n" + tail
    return text


def build_messages(ctx: ProposalContext) -> list[dict]:
    """OpenAI chat messages for one proposal: [system, user]."""
    return [{"role": "system", "content": system_message(ctx)},
            {"role": "user", "content": user_message(ctx)}]
