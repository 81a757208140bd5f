"""Which tasks a sweep runs: found in a suite or folder, selected by name, and those skipped with
the reason (cannot load, no seed for the offline proposer, flagged by the suite itself)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from kfray.errors import KfrayError

def select(refs: list[str], wanted: str | None) -> list[str]:
    """Keep refs whose last path component (or name) starts with or equals one of the comma list."""
    if not wanted:
        return refs
    keys = [w.strip() for w in wanted.split(",") if w.strip()]

    def base(ref: str) -> str:
        tail = ref.split(":", 1)[-1].rstrip("/")
        return Path(tail.split("#")[0]).stem if "/" in tail or "." in tail else tail

    out = [r for r in refs if any(base(r) == k or base(r).startswith(k) or r == k for k in keys)]
    if not out:
        raise KfrayError(f"--tasks {wanted}: matches none of the {len(refs)} tasks "
                         f"(e.g. {', '.join(base(r) for r in refs[:5])})")
    return out


def plan_iter(spec: str | None, level: int | None, wanted: str | None, language: str, offline: bool,
              rkb_mode: str = "") -> Iterator[tuple[str, str | None]]:
    """(ref, None) for each task a sweep can run and (ref, why) for each it skips, one at a time as
    each loads: a level of full-size models takes a minute to load, and a caller can start on the
    first meanwhile."""
    from kfray.tasks import resolve, try_load

    for ref in select(resolve(spec, level, rkb_mode), wanted):
        t, why = try_load(ref)
        suite = getattr(t, "suite", None)
        if why:
            yield ref, why
        elif language != "suite" and suite is not None and suite.functional_error:
            yield ref, (f"kf_forward kernels cannot take it: {suite.functional_error} (the suite's own form "
                        "can: eval.backend=torch_ext_cpu or torch_ext_cuda)")
        elif offline and not t.seeds_for(language):
            yield ref, f"no {language} seed kernel, and the offline proposer needs one (use proposer.kind=llm)"
        else:
            yield ref, None


def plan(spec: str | None, level: int | None, wanted: str | None, language: str, offline: bool,
         rkb_mode: str = ""):
    """(runnable refs, {ref: why skipped}) for a sweep."""
    runnable, skipped = [], {}
    for ref, why in plan_iter(spec, level, wanted, language, offline, rkb_mode):
        if why:
            skipped[ref] = why
        else:
            runnable.append(ref)
    return runnable, skipped


def flags_of(ref: str) -> tuple[str, ...]:
    """The suite's own filter flags that are true for a loaded task (robust-kbench's filter_results.json)."""
    from kfray.tasks import load_task

    suite = getattr(load_task(ref), "suite", None)
    return tuple(getattr(suite, "flagged", ()) or ())


def split_flagged(refs: list[str]) -> tuple[list[str], dict[str, str]]:
    """(refs to run, {ref: why left out}) without the tasks the suite itself flags as degenerate
    (constant outputs, inputs without effect...): they are not part of its benchmark, so a sweep
    leaves them out of its table rather than counting them as failures."""
    kept, flagged = [], {}
    for ref in refs:
        flags = flags_of(ref)
        if flags:
            flagged[ref] = f"flagged by the suite's {', '.join(flags)}"
        else:
            kept.append(ref)
    return kept, flagged


def islands_per_task(wanted: int, tasks: int, max_actors: int) -> int:
    """Islands per task in a sweep: each island is a Ray actor process that loads its task (for a
    PyTorch task, torch itself), so a suite of hundreds of tasks gets fewer islands per task rather
    than hundreds of processes; never fewer than one."""
    return max(1, min(wanted, max_actors // max(1, tasks)))


