"""When and how generated code is isolated: the `eval.isolation` setting, the one-time probe of
what this machine's kernel allows, and the file view of the sandbox worker and of the compilers.

The mechanism is kfray.eval.namespaces (user, mount, network, IPC and PID namespaces, no root
needed); this module decides whether to use it and what each process may see:
- hidden (an empty tmpfs): /tmp, /var/tmp, /dev/shm, /run, /home, /root, $HOME, the Ray session
  folder, /etc/shadow-like files;
- visible read-only again where they lie under a hidden folder: the Python environment, the
  compile cache, the toolchain, the paths the environment and the command line name;
- writable: the private tmpfs folders, and for a compiler the cache folder its output goes to.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from functools import lru_cache
from pathlib import Path

MODES = ("strict", "namespaces", "none")
EXPLAIN = ("eval.isolation: strict (refuse to run without isolation) | namespaces (the default: "
           "isolate where the kernel allows, else warn once and run without) | none (no isolation: "
           "the sandbox is a fault boundary only)")
HIDE = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/home", "/root", "/mnt", "/media", "/srv",
        "/etc/shadow", "/etc/gshadow", "/etc/ssh")
PATH_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "OCL_ICD_FILENAMES", "OCL_ICD_VENDORS",
            "SYCL_ROOT", "ONEAPI_ROOT", "CMPLR_ROOT", "CONDA_PREFIX", "VIRTUAL_ENV", "KFRAY_CACHE", "KFRAY_TIMING_LOCK")
SIMULATE_ENV = "KFRAY_NO_NAMESPACES"   # set: behave as if the kernel allowed no namespaces (tests, doctor)
_SCRIPT = str(Path(__file__).with_name("namespaces.py"))
_warned: set[str] = set()
_lock = threading.Lock()


def check_mode(mode: str) -> str:
    if mode not in MODES:
        from kfray.errors import ConfigError
        raise ConfigError(f"eval.isolation is {mode!r}; expected one of {', '.join(MODES)} ({EXPLAIN})")
    return mode


@lru_cache(maxsize=None)
def _probe() -> str:
    """'' when this machine can isolate (tried for real, once per process), else why not."""
    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux-only (this is {sys.platform})"
    code = ("import socket,os,sys\ns=socket.socket(); s.settimeout(2)\n"
            "try:\n s.connect(('127.0.0.1', 9)); sys.exit('loopback reachable')\n"
            "except OSError as e:\n sys.exit(0 if e.errno in (101, 99, 113) else f'loopback: {e}')")
    plan = {**sandbox_plan(), "pid": True}
    try:
        proc = subprocess.run(wrap([sys.executable, "-I", "-S", "-c", code], plan), capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"the isolation probe failed to run ({type(e).__name__}: {e})"
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        return (why[-1] if why else f"exit {proc.returncode}").removeprefix("kfray isolation: ")
    return ""


def unavailable_reason() -> str:
    """'' when namespaces work here, else a short reason (the probe's answer is cached)."""
    if os.environ.get(SIMULATE_ENV, "") not in ("", "0"):
        return f"{SIMULATE_ENV} is set"
    with _lock:
        return _probe()


def active(mode: str) -> bool:
    """Whether to isolate under `mode`: strict without namespaces is a KfrayError; namespaces
    without them says so once per process (naming the setting) and runs unisolated."""
    if check_mode(mode) == "none":
        return False
    why = unavailable_reason()
    if not why:
        return True
    from kfray.errors import KfrayError
    if mode == "strict":
        raise KfrayError(f"eval.isolation is strict, and this machine cannot isolate generated code ({why}); "
                         f"allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                         f"user.max_user_namespaces > 0), or choose another setting: {EXPLAIN}")
    if why not in _warned:
        _warned.add(why)
        print(f"kfray: warning: generated code runs WITHOUT isolation here ({why}): it can read what this user "
              f"can and reach the network. {EXPLAIN}", file=sys.stderr)
    return False


def wrap(cmd: list[str], plan: dict) -> list[str]:
    """`cmd` run inside the namespaces `plan` describes (a short-lived stdlib Python sets them up and execs)."""
    return [sys.executable, "-I", "-S", _SCRIPT, json.dumps(plan), "--", *cmd]


def _hidden() -> list[str]:
    home = os.environ.get("HOME", "")
    extra = [home] if home not in ("", "/") else []
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if os.environ.get(var, "") not in ("", "/"):
            extra.append(os.environ[var])
    return list(dict.fromkeys(os.path.realpath(p) for p in (*HIDE, *extra)))


def _existing(paths) -> list[str]:
    out = []
    for p in paths:
        if p and os.path.isabs(p) and os.path.exists(p):
            rp = os.path.realpath(p)
            if rp != "/" and rp not in out:
                out.append(rp)
    return out


@lru_cache(maxsize=None)
def _python_paths() -> tuple[str, ...]:
    """The interpreter, its standard library and site-packages, and every import path."""
    exe = os.path.realpath(sys.executable)
    return tuple(_existing([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                            os.path.dirname(os.path.dirname(exe)), *sys.path,
                            str(Path(__file__).resolve().parents[2])]))       # kfray's own source


def _env_paths() -> list[str]:
    return _existing(p for var in PATH_ENV for p in os.environ.get(var, "").split(os.pathsep))


def _arg_paths(cmd: list[str]) -> list[str]:
    """Absolute paths named in a command line (-I/x, -Wl,-rpath,/y, /z/file.h), and a tool's prefix."""
    found = []
    for arg in cmd:
        for m in re.finditer(r"(?:^|[,=:]|^-[IL]|^-isystem)(/[^,=:\s]+)", arg):
            found.append(m.group(1))
    if cmd and os.path.isabs(cmd[0]):
        found.append(os.path.dirname(os.path.dirname(os.path.realpath(cmd[0]))))   # the toolchain's prefix
    return _existing(found)


def sandbox_plan(cache_root: str | Path | None = None, keep: list[str] = ()) -> dict:
    """What a sandbox worker sees: the hidden folders, its environment read-only, no writable path.
    A path to keep that is a hidden folder or holds one (a script started from $HOME puts $HOME on
    sys.path) is left out: it would show the whole home folder again."""
    hide = _hidden()
    from_cache = [str(cache_root)] if cache_root else []
    wanted = _existing([*_python_paths(), *_env_paths(), *from_cache, *keep])
    return {"hide": hide, "keep": [p for p in wanted if not _holds_hidden(p, hide)], "writable": [], "pid": True}


def folder_to_keep(path: str) -> str | None:
    """The folder an isolated worker must be shown for a task at `path`, or None when no hidden
    folder covers it (the rest of the file system is visible, read-only). It is the folder holding
    the task's folder, so that a sweep's sibling tasks need no new worker, unless that folder is
    hidden itself or holds a hidden folder: then the task's own folder."""
    hide = _hidden()
    path = os.path.realpath(path)
    if not under(path, hide):
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    parent = os.path.dirname(folder)
    return folder if _holds_hidden(parent, hide) else parent


def under(path: str, roots) -> bool:
    """Whether `path` is one of `roots` or inside one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _holds_hidden(path: str, hide: list[str]) -> bool:
    return any(under(h, [path]) for h in hide)


_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def scrubbed_env(env) -> dict[str, str]:
    """The environment minus anything that looks like a secret (API keys, tokens, passwords, the
    SSH agent): generated code, and compilers reading it (#include "/proc/self/environ"), have no
    business with them."""
    return {k: v for k, v in env.items() if not _SECRET.search(k)}


def compile_plan(cmd: list[str], out_dir: str | Path, cache_root: str | Path | None = None,
                 writable: list[str] = ()) -> dict:
    """What a compiler sees: as the sandbox, plus its command line's paths; it writes `out_dir`
    (and the `writable` folders) only."""
    plan = sandbox_plan(cache_root, _arg_paths(cmd))
    plan["writable"] = [p for p in _existing([str(out_dir), *map(str, writable)]) if not _holds_hidden(p, plan["hide"])]
    return plan


def describe(mode: str) -> tuple[str, bool]:
    """(one line for `kfray doctor`, whether that is fine under `mode`)."""
    why = unavailable_reason()
    if mode == "none":
        return "off (eval.isolation none)", True
    if not why:
        return f"on: user, mount, network, IPC and PID namespaces (eval.isolation {mode})", True
    return f"NOT available ({why}); eval.isolation {mode}: " + (
        "runs refuse to start" if mode == "strict" else "runs go on without it"), mode != "strict"
