"""@kf.param values as `#define`s placed right after a source's last `#include`.

Not `-D` flags: names such as N, M, K or WG would otherwise rewrite the SYCL headers themselves.
`line_shift` says where the inserted lines went, so diagnostics can be put back on the source's
own line numbers (kfray.eval.backends.sycl.diagnostics).
"""
from __future__ import annotations

import re
from typing import Any

from kfray.source import define_flags


def _define_block(source: str, params: dict[str, Any]) -> tuple[int, str]:
    """Where the #defines go (index of the line they follow, -1 for the top) and the block itself."""
    define_flags(params)   # validates names and values
    lines = source.splitlines()
    last = max((i for i, ln in enumerate(lines) if re.match(r"\s*#\s*include\b", ln)), default=-1)
    # The declaration ends clang's preamble before the #defines, so the preamble (the includes) is
    # the same for every setting and the kernel compiler's persistent auto-PCH serves them all.
    block = "using kf_tunables_follow = int;\n" + "".join(f"#define {k} {v}\n" for k, v in sorted(params.items()))
    return last, block


def inject_defines(source: str, params: dict[str, Any]) -> str:
    """`#define NAME VALUE` for each param right after the source's last #include."""
    if not params:
        return source
    last, block = _define_block(source, params)
    lines = source.splitlines(keepends=True)
    if last >= 0 and not lines[last].endswith("\n"):
        lines[last] += "\n"
    return "".join(lines[:last + 1]) + block + "".join(lines[last + 1:])


def line_shift(source: str, params: dict[str, Any]) -> tuple[int, int]:
    """(first line moved, lines inserted) by inject_defines, to put diagnostics back on the source's lines."""
    if not params:
        return 0, 0
    last, block = _define_block(source, params)
    return last + 2, block.count("\n")
