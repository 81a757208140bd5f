"""The sandbox worker: no secrets in its environment, and no orphan when its evaluator dies."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kfray.candidate import Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.eval.evaluator import Evaluator
from kfray.eval.sandbox import scrubbed_env
from kfray.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
SIG = load_task("axpb").signature("cpp")
AXPB = "{ for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b; return 0; }"


def test_secrets_are_not_in_the_environment_a_kernel_sees(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-token")
    assert "OPENAI_API_KEY" not in scrubbed_env(os.environ) and "PATH" in scrubbed_env(os.environ)
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path / "cache"), timeout_s=60, tune_budget=0))
    try:
        # the kernel fails (returns 7) when it can read either secret, else it is correct
        src = ("#include <cstdint>\n#include <cstdlib>\n" + SIG +
               '{ if (getenv("OPENAI_API_KEY") || getenv("RAY_AUTH_TOKEN")) return 7;\n'
               "  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b; return 0; }")
        r = EvalResult.from_dict(ev.evaluate(Candidate(task="axpb", language="cpp", source=src, params={})))
        assert r.tier == 5, r.reason
    finally:
        ev.shutdown()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _maps(pid: int, folder: Path) -> bool:
    """Whether the process has a library from `folder` (the compile cache) loaded."""
    try:
        return str(folder) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """The process's children, their children, and so on (the judge's zygote and runners)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _runner_of(worker: int, cache: Path) -> int | None:
    """The process under the sandbox worker that loaded a library from the compile cache."""
    return next((p for p in _descendants(worker) if _maps(p, cache)), None)


def test_a_hung_kernel_dies_with_its_evaluator(tmp_path):
    cache = tmp_path / "cache"
    script = tmp_path / "evaluator.py"
    script.write_text(
        "import sys\nfrom kfray.candidate import Candidate\nfrom kfray.config import EvalConfig\n"
        "from kfray.eval.evaluator import Evaluator\n"
        f"ev = Evaluator('cpu', EvalConfig(cache_dir={str(cache)!r}, timeout_s=300, tune_budget=0))\n"
        "ev.sandbox._start()\nprint(ev.sandbox.worker_pid, flush=True)\n"
        f"src = '#include <cstdint>\\n' + {SIG!r} + '{{ volatile int s = 1; while (s) {{}} return 0; }}'\n"
        "r = ev.evaluate(Candidate(task='axpb', language='cpp', source=src, params={}))\n"
        "print('returned', r['tier'], r['reason'], flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        worker = int(proc.stdout.readline())
        # The kernel really hangs in the sandbox: its runner (under the judge, never the judge
        # itself) loaded the built library from the cache...
        deadline = time.time() + 60
        while _runner_of(worker, cache) is None and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        runner = _runner_of(worker, cache)
        assert runner is not None, f"the sandbox never loaded the kernel (evaluator exit code {proc.poll()})"
        assert not _maps(worker, cache), "the judge loaded the candidate's library itself"
        # ...and spins in it, burning CPU, while the evaluation does not come back (not even the timeout).
        cpu0, t0 = _cpu_seconds(runner), time.time()
        time.sleep(3)
        spun, waited = _cpu_seconds(runner) - cpu0, time.time() - t0
        assert spun > 0.1 * waited, f"the runner used {spun:.2f} s of CPU in {waited:.1f} s: it is not spinning"
        assert proc.poll() is None and _alive(runner), "the evaluation ended: the kernel did not hang"
        family = [worker] + _descendants(worker)
        proc.kill()                           # the evaluator dies without a word to its worker
        proc.wait(10)
        assert "returned" not in proc.stdout.read(), "the evaluation came back: the kernel did not hang"
        deadline = time.time() + 15
        while any(_alive(p) for p in family) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in family), "the sandbox's judge or the kernel's runner outlived its evaluator"
    finally:
        proc.kill()


_ALLOCATING_REFERENCE = """
import resource, numpy as np
x = np.ones(1 << 20, np.float32)
def reference(x):          # as the axpb task's: a result and a temporary of 4 MiB on every call
    return {"y": 1.5 * x + 0.5}
for _ in range(3):
    reference(x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    reference(x)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(env_extra: dict) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _ALLOCATING_REFERENCE], env={**env, **env_extra},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_judges_heap_is_kept_so_an_allocating_reference_pays_no_page_faults_per_call():
    """The judge times references that allocate their results (numpy's a * x + b). Under glibc's
    defaults each call's 4 MiB blocks were mapped afresh and returned, about 1,000 page faults a
    call, timed as the reference's; the judge's allocator settings keep the heap."""
    from kfray.eval.sandbox import ALLOCATOR_ENV

    steady = _page_faults(ALLOCATOR_ENV)
    assert steady < 100, f"{steady} page faults in 20 calls with the judge's allocator settings"
    churning = _page_faults({})                       # the control: glibc's defaults
    assert churning > 5000, f"only {churning} page faults in 20 calls without them: the control shows nothing"
