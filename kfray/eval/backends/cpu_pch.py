"""A precompiled <cmath> for the CPU backend's builds.

Parsing <cmath> is most of what g++ spends on a small kernel (0.15 of 0.2 s here), and nearly
every kernel includes it. A source that includes <cmath> is built with `-include` of a header that
holds only that line, precompiled once per compiler and flag set into the compile cache: the
kernel's own `#include <cmath>` then costs nothing. Sources without <cmath> are built as written,
and where the precompiled header cannot be made (another compiler, a failed build) g++ reads the
plain header, so a kernel compiles to the same thing either way.
"""
from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

from kfray.eval.native_build import build_once

HEADER = "#include <cmath>\n"
_INCLUDES_CMATH = re.compile(r"^\s*#\s*include\s*<cmath>", re.M)
_lock = threading.Lock()
_made: dict[str, Path | None] = {}


def pch_flags(source: str, cxx: str, version: str, flags: list[str], root: Path) -> list[str]:
    """["-include", header] for a source that includes <cmath> (g++ only), else []."""
    if not _INCLUDES_CMATH.search(source) or "g++" not in Path(cxx).name and "GCC" not in version:
        return []
    base = [f for f in flags if not f.startswith("-D")]     # macros of the kernel's own parameters
    key = hashlib.sha256("\0".join([version, *base, HEADER]).encode()).hexdigest()[:16]
    with _lock:
        if key not in _made:
            _made[key] = _build(cxx, base, Path(root) / "native" / f"pch-{key}")
    header = _made[key]
    return ["-include", str(header)] if header else []


def _build(cxx: str, flags: list[str], folder: Path) -> Path | None:
    header = folder / "kf_cmath.h"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not header.exists():
            header.write_text(HEADER)
    except OSError:
        return None
    command = [cxx, *[f for f in flags if f != "-shared"], "-x", "c++-header", str(header)]
    return header if build_once(command, folder / "kf_cmath.h.gch") else None
