"""Precompiled <cmath> and <immintrin.h> for the CPU backend's builds.

Parsing these two is most of what g++ spends on a small kernel: <cmath> 0.15 of 0.2 s, and
<immintrin.h> 0.5 of a 0.7-0.9 s build of an intrinsics kernel (2-core machine). A source that
includes either is built with `-include` of a header that holds exactly the lines of those it
includes, precompiled once per compiler, flag set and header set into the compile cache: the
kernel's own `#include` then costs nothing. Sources with neither are built as written, and where
the precompiled header cannot be made (another compiler, a failed build) g++ reads the plain
headers, so a kernel compiles to the same thing either way.
"""
from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

from kfray.eval.native_build import build_once

HEADERS = ("cmath", "immintrin.h")         # the expensive ones, in the order the header lists them
_INCLUDES = {h: re.compile(r"^\s*#\s*include\s*<" + re.escape(h) + ">", re.M) for h in HEADERS}
_lock = threading.Lock()
_made: dict[str, Path | None] = {}


def pch_flags(source: str, cxx: str, version: str, flags: list[str], root: Path) -> list[str]:
    """["-include", header] for a source that includes <cmath> or <immintrin.h> (g++ only), else []."""
    text = "".join(f"#include <{h}>\n" for h in HEADERS if _INCLUDES[h].search(source))
    if not text or "g++" not in Path(cxx).name and "GCC" not in version:
        return []
    base = [f for f in flags if not f.startswith("-D")]     # macros of the kernel's own parameters
    key = hashlib.sha256("\0".join([version, *base, text]).encode()).hexdigest()[:16]
    with _lock:
        if key not in _made:
            _made[key] = _build(cxx, base, Path(root) / "native" / f"pch-{key}", text)
    header = _made[key]
    return ["-include", str(header)] if header else []


def _build(cxx: str, flags: list[str], folder: Path, text: str) -> Path | None:
    header = folder / "kf_pch.h"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not header.exists():
            header.write_text(text)
    except OSError:
        return None
    command = [cxx, *[f for f in flags if f != "-shared"], "-x", "c++-header", str(header)]
    return header if build_once(command, folder / "kf_pch.h.gch") else None
