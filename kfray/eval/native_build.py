"""Building kfray's own native helpers into the cache: once per machine, atomically.

The harness's check helper (kfray/eval/fastcheck.py) and the CPU backend's precompiled <cmath>
(kfray/eval/backends/cpu_pch.py) are each built by one compiler call into the cache folder; racing
evaluators (or nodes sharing the folder) write a temporary file and rename it into place, so a
half-written file never sits under the real name. Standard library only, below everything else.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """KFRAY_CACHE, or ~/.cache/kfray (the compile cache, and these helpers)."""
    return Path(os.environ.get("KFRAY_CACHE") or Path.home() / ".cache" / "kfray")


def build_once(command: list[str], out: Path) -> bool:
    """`out` exists, or is built by `command + ["-o", tmp]` and renamed into place; False when the
    build fails or the compiler cannot run (callers then go on without the helper)."""
    if out.exists():
        return True
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=out.parent)
        os.close(fd)
        r = subprocess.run([*command, "-o", tmp], capture_output=True, timeout=120)
        if r.returncode != 0:
            os.unlink(tmp)
            return False
        os.replace(tmp, out)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
