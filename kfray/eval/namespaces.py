"""Enter Linux namespaces and exec a command inside them: the mechanism under kfray.eval.isolation.

Run as a script (`python -I -S namespaces.py PLAN_JSON -- CMD...`), before anything of kfray is
imported: unshare(2) of a user namespace needs a single-threaded process, and numpy's thread pools
would spoil that. Standard library only, so it starts in a few milliseconds. No root is needed:
an unprivileged user namespace grants the mount rights, and every capability is dropped before
the command runs, so generated code cannot undo the mounts.

What the command sees: no network (a new network namespace: an unconfigured loopback only), an
empty writable tmpfs over each `hide` path (/tmp, the home folders...), every other file read-only
except the `writable` paths and /dev's device nodes, the `keep` paths (the Python environment, the
compile cache) visible again where they lie under a hidden folder. With `pid`, it is the init of a
new PID namespace: when it exits, every process it left behind is killed by the kernel.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD, SYS_MOUNT_SETATTR = 1, 0x8000, -100, 442
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SETUP_FAILED = 125          # exit code when the namespaces cannot be set up (the reason is on stderr)

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _mount(src: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _set_readonly(path: str, readonly: bool, recursive: bool = True) -> None:
    """Make the mount at `path` (and those under it) read-only, or writable again."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr {path}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def setup(plan: dict) -> None:
    """Enter the namespaces and build the file view the plan describes (this process only; the
    PID namespace, if asked for, applies to the next child)."""
    uid, gid = os.getuid(), os.getgid()
    hide = [p for p in plan.get("hide", []) if p != "/" and os.path.lexists(p)]
    writable = [p for p in plan.get("writable", []) if os.path.exists(p)]
    keep = [p for p in plan.get("keep", []) if os.path.exists(p) and p not in writable]
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | (CLONE_NEWPID if plan.get("pid") else 0)
    _check(_libc.unshare(flags), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)       # nothing we mount reaches the host
    # Handles on what stays visible, taken in the new mount namespace before anything is covered.
    fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in keep + writable if _under(p, hide)}
    covered = []
    for p in sorted(hide, key=len):
        if _under(p, covered):
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            _mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={plan.get('tmpfs_mb', 1024)}m")
            covered.append(p)
        elif os.path.isfile(p):
            _mount("/dev/null", p, None, MS_BIND)           # a hidden file reads as empty
    bound: list[str] = []
    for p in sorted(fds, key=len):
        if p not in writable and _under(p, bound):   # visible already, through a folder bound above it
            os.close(fds[p])
            continue
        if os.path.isdir(f"/proc/self/fd/{fds[p]}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if not os.path.exists(p):   # never opened for writing: it may be a running program
                open(p, "a").close()
        _mount(f"/proc/self/fd/{fds[p]}", p, None, MS_BIND | MS_REC)
        os.close(fds[p])
        bound.append(p)
    _set_readonly("/", True)
    for p in covered:
        _set_readonly(p, False, recursive=False)           # the keep paths bound inside stay read-only
    for p in writable:
        _set_readonly(p, False)
    os.chdir(plan.get("cwd") or "/tmp")


def drop_privileges() -> None:
    """No capability left, none to gain by exec: the mounts above cannot be undone."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            break                                           # past the last capability this kernel has
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)           # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                          # effective, permitted, inheritable: empty
    _check(_libc.capset(header, data), "capset")


def _forward_exit(status: int) -> None:
    """Leave as the child left: same exit code, or killed by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status))


def _watch_parent(ppid: int) -> None:
    """Exit when the caller dies (the child follows through its parent-death signal). A timer
    signal, not a thread: a process that unshared its PID namespace cannot start threads."""
    def check(_sig, _frame):
        if os.getppid() != ppid:
            os._exit(1)

    signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)


def run(plan: dict, cmd: list[str]) -> None:
    """Set up, then exec `cmd` (as the init of a new PID namespace when plan['pid'])."""
    ppid = os.getppid()
    try:
        setup(plan)
    except OSError as e:
        sys.stderr.write(f"kfray isolation: cannot isolate ({e})\n")
        os._exit(SETUP_FAILED)
    if plan.get("pid"):
        child = os.fork()
        if child:                                           # the waiter outside the new PID namespace
            os.closerange(3, 1 << 16)
            _watch_parent(ppid)
            _forward_exit(os.waitpid(child, 0)[1])
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:        # this PID namespace's own /proc: the old one would show the host's processes
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
        except OSError as e:
            sys.stderr.write(f"kfray isolation: cannot isolate ({e}: the container masks /proc)\n")
            os._exit(SETUP_FAILED)
    try:
        drop_privileges()
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"kfray isolation: cannot run {cmd[0]} ({e})\n")
        os._exit(127)


if __name__ == "__main__":
    _sep = sys.argv.index("--")
    run(json.loads(sys.argv[1]), sys.argv[_sep + 1:])
