"""Turns a ProposalContext into OpenAI chat messages [system, user].

Compact by design: long sources are truncated and the whole user message is capped, so a prompt
stays cheap and well inside any model's context window.
"""
from __future__ import annotations

import random

from kfray.descriptors import change_directive
from kfray.eval.profile_facts import profile_text
from kfray.prompts.budget import Section, estimate_tokens, fit
from kfray.prompts.contracts import kernel_contract
from kfray.proposal import Elite, ProposalContext
from kfray.source import uncommented

DIMENSIONS = ("memory", "compute", "parallelism")
MAX_SOURCE_LINES = 200          # parent / seed source
MAX_INSPIRATION_LINES = 60
MAX_PROMPT_CHARS = 24000
REPEATED = ("Your last answer repeated a kernel that was already tried (the parent unchanged, or one the "
            "archive holds): this time change the code itself.")

_FENCE = {"cpp": "cpp", "cuda": "cuda", "sycl": "cpp", "opencl": "c", "suite": "cuda"}
COMMENTED = ("cpp", "cuda", "sycl", "opencl", "sycl_jit")     # languages with // and /* */ comments
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


def _shown(source: str, language: str, comments: bool = True) -> str:
    """A source as the model reads it: without its comments where they are off (C-family only)."""
    return source if comments or language not in COMMENTED else uncommented(source)


def _comments(ctx: ProposalContext) -> bool:
    """Whether sources are shown with their comments: where the context says so, and always in a
    repair, whose compiler messages give line numbers of the source as it was."""
    return ctx.comments or ctx.repair


def _code(source: str, language: str, max_lines: int, comments: bool = True) -> str:
    return f"```{fence_tag(language)}\n{_truncate(_shown(source, language, comments), max_lines)}\n```"


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


def system_message(mode: str = "rewrite") -> str:
    """The same for every request of a mode: a server that keeps the work of the prompts it has read
    (llama.cpp's prompt cache) reads only what follows the longest beginning a new prompt shares with
    one it has seen, so what changes least comes first (here, then the task's sections, then the
    parent) and the meta-prompt's sections, philosophy included, come after the parent."""
    return ("You are an expert GPU and CPU kernel engineer. You write correct, fast kernels, "
            "reason about memory traffic, parallelism and the hardware, and answer with "
            + ("SEARCH/REPLACE edits of the kernel you are given." if mode == "diff"
               else "exactly one complete source file."))


DIFF_EXAMPLE = """<<<<<<< SEARCH
    for (int64_t i = 0; i < n; ++i) {
=======
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
>>>>>>> REPLACE"""
MAX_DIAGNOSTIC_CHARS = 2000


def edit_base(ctx: ProposalContext) -> str | None:
    """The source a diff edits, as the prompt shows it: the parent's, else the baseline seed's
    (None: nothing to edit)."""
    if ctx.parent is not None:
        return _shown(ctx.parent.candidate.source, ctx.language, _comments(ctx))
    seed = ctx.task.baseline_seed(ctx.language)
    return _shown(seed.source, ctx.language, _comments(ctx)) if seed is not None else None


def _output_format(lang: str, mode: str, comments: bool = True) -> str:
    bare = "" if comments or lang not in COMMENTED else " Write no comments; keep the @kf lines."
    return _format(lang, mode) + bare


def _format(lang: str, mode: str) -> str:
    if mode == "diff":
        return ("Change the kernel above with SEARCH/REPLACE blocks, one block per change, like this:\n"
                f"{DIFF_EXAMPLE}\n"
                "The SEARCH lines must be copied exactly from the kernel above (a few lines, enough to be "
                "unique); the REPLACE lines take their place. Give only the blocks and one sentence saying "
                "why; never repeat the whole file. Keep the `kf_forward` entry point and any @kf.param lines.")
    return (f"Think briefly, then give exactly one fenced code block (```{fence_tag(lang)}) holding the "
            f"complete source file, including the `kf_forward` entry point and any @kf.param lines.")


def _contract(task, lang: str) -> str:
    if lang in ("sycl_jit", "opencl"):    # run-time compiled kernels: no host code, launches declared
        return kernel_contract(task, lang)
    if lang == "suite":                   # the suite's own form: its contract, not kf_forward's
        from kfray.tasks.suite_form import contract as suite_contract
        return suite_contract(task)
    return (f"Language: {_LANG_NAME.get(lang, lang)}. Export exactly this entry point and return 0 on success:\n"
            f"```{fence_tag(lang)}\n#include <cstdint>\n{task.signature(lang)}\n```\n"
            + ("Host code may launch any number of kernels. " if lang in ("cuda", "sycl") else "")
            + "Tunables may be declared as "
            "`// @kf.param NAME in [v1, v2, ...]` with constraints `// @kf.require expr`; each setting is "
            "compiled with `-DNAME=value`, so use the macro names in the code rather than hard-coded values.")


def _diagnostics(e: Elite) -> str:
    """A failed kernel's compiler or checker output, its first lines first (where the cause is)."""
    reason = (e.result.reason or "").strip() or "no message"
    if len(reason) > MAX_DIAGNOSTIC_CHARS:
        reason = reason[:MAX_DIAGNOSTIC_CHARS] + "\n[... more output cut ...]"
    from kfray.candidate import TIER_NAMES
    return f"{TIER_NAMES.get(e.result.tier, e.result.tier)}:\n```\n{reason}\n```"


def prompt_sections(ctx: ProposalContext, mode: str = "rewrite") -> list[Section]:
    """The user message's sections, in display order, each with its priority for the budget."""
    task, lang = ctx.task, ctx.language
    full = mode == "diff" or ctx.repair       # an edited source must be shown whole
    keep = _comments(ctx)
    src_lines = 10_000 if full else MAX_SOURCE_LINES
    out = []
    body = f"**{task.name}**: {task.description}"
    if task.instructions:
        body += "\n\n" + task.instructions.strip()
    out.append(Section(_section("Task", body)))
    out.append(Section(_section("Kernel contract", _contract(task, lang))))
    shapes = "\n".join(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in cfg.items())
                       for name, cfg in task.shapes.items())
    out.append(Section(_section("Shape configs (all must be correct and fast)", shapes)))
    if ctx.device_facts:
        out.append(Section(_section("Device", "\n".join(f"- {k}: {v}" for k, v in ctx.device_facts.items())), 3))
    if ctx.repair and ctx.parent is not None:
        p = ctx.parent
        out.append(Section(_section("Your kernel (it failed; fix it)", _code(p.candidate.source, lang, src_lines))))
        out.append(Section(_section("Diagnostics", _diagnostics(p))))
    elif ctx.parent is not None:
        p = ctx.parent
        out.append(Section(_section("Parent kernel (improve this)",
                                    f"{_elite_header(p)}\n{_code(p.candidate.source, lang, src_lines, keep)}\n"
                                    f"Evaluation feedback: {p.result.feedback()}")))
        tuning = _tuning(p)
        if tuning:
            out.append(Section(_section("Parameter settings measured for the parent (best first)", tuning), 4))
        profile = _profile(p)
        if profile:
            out.append(Section(_section("Profiler (Nsight Compute) on the parent", profile), 3))
    else:
        seed = task.baseline_seed(lang)
        if seed is not None:
            out.append(Section(_section("Starting point (baseline seed; no correct kernel yet)",
                                        _code(seed.source, lang, src_lines, keep))))
    if ctx.meta_prompt and not ctx.repair:     # after the parent: see system_message
        for key, title, prio in (("philosophy", "Approach", 2), ("strategies", "Strategies", 2),
                                 ("pitfalls", "Pitfalls to avoid", 3), ("analysis", "How to analyse", 5)):
            if ctx.meta_prompt.sections.get(key):
                out.append(Section(_section(title, ctx.meta_prompt.sections[key]), prio))
    if ctx.inspirations and not ctx.repair:
        for i, e in enumerate(ctx.inspirations, 1):
            out.append(Section(_section(f"Another kernel from the archive (ideas to borrow) {i}",
                                        f"speedup {e.result.speedup:.3f}x; {_elite_header(e)}\n"
                                        + _code(e.candidate.source, lang, MAX_INSPIRATION_LINES, keep)), 6 + i))
    if ctx.target_cell and not ctx.repair:
        cell = ", ".join(_level(d, lvl) for d, lvl in zip(DIMENSIONS, ctx.target_cell))
        out.append(Section(_section("Target style", f"Aim for a kernel with {cell}."), 2))
    directives = list(ctx.directives)
    if ctx.repeats:     # and one concrete change, drawn afresh for each parent, generation and ask
        pick = random.Random(f"{ctx.parent.candidate.id if ctx.parent else ''}:{ctx.generation}:{ctx.repeats}")
        directives[:0] = [REPEATED, *change_directive(lang, pick, directives)]
    if directives and not ctx.repair:
        out.append(Section(_section("Directives", "\n".join(f"- {d}" for d in directives)), 1))
    out.append(Section(_section("Output format", _output_format(lang, mode, keep))))
    return out


def user_message(ctx: ProposalContext, mode: str = "rewrite", prompt_tokens: int = 0) -> str:
    """The user message; with `prompt_tokens` > 0, the sections that fit that budget (with the
    system message), most useful first."""
    sections = prompt_sections(ctx, mode)
    text, _ = fit(sections, prompt_tokens, reserve=estimate_tokens(system_message(mode)))
    if len(text) > MAX_PROMPT_CHARS:  # keep the head (task, contract) and the output format
        tail = sections[-1].text
        text = text[:MAX_PROMPT_CHARS - len(tail) - 40] + "\n[... truncated ...]\n\n" + tail
    return text


def build_messages(ctx: ProposalContext, mode: str = "rewrite", prompt_tokens: int = 0) -> list[dict]:
    """OpenAI chat messages for one proposal: [system, user]. `mode` is how the model answers:
    rewrite (a whole file) or diff (SEARCH/REPLACE blocks against the parent)."""
    return [{"role": "system", "content": system_message(mode)},
            {"role": "user", "content": user_message(ctx, mode, prompt_tokens)}]
