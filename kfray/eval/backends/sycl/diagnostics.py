"""Compiler output as the prompt should see it: file kernel.cpp, the source's own line numbers.

The kernel compiler names its input rtc_<n>.cpp and its headers by a build-tree path; a model does
better with one stable file name and with line numbers that match the source it wrote.
"""
from __future__ import annotations

import re

MAX_DIAGNOSTIC_CHARS = 4000

_RTC_FILE = re.compile(r"\brtc_\d+\.cpp\b")
_JIT_INCLUDE = re.compile(r"/sycl-jit-toolchain/+bin/compiler/\.\./\.\./include/")
_LOC = re.compile(r"\bkernel\.cpp:(\d+)")
_SNIPPET = re.compile(r"^(\s*)(\d+)( \|)", re.M)

# Constructs known to crash this kernel compiler, with what to use instead (they reach the prompt).
CRASH_HINTS = [("group_local_memory", "group_local_memory_for_overwrite is known to crash it: declare work-group "
                "local memory as `static syclexp::work_group_static<float[N]> tile;` instead")]


def clean_diagnostics(text: str, shift: tuple[int, int] = (0, 0)) -> str:
    """Compiler output as the prompt should see it: file kernel.cpp, the source's own line numbers."""
    text = _RTC_FILE.sub("kernel.cpp", text)
    text = _JIT_INCLUDE.sub("<sycl>/", text)
    text = text.replace("Device compilation failed\nDetailed information:\n\t", "")
    first, count = shift
    if count:
        def back(n: int) -> int:
            return n - count if n >= first + count else n
        text = _LOC.sub(lambda m: f"kernel.cpp:{back(int(m.group(1)))}", text)
        text = _SNIPPET.sub(lambda m: f"{m.group(1)}{back(int(m.group(2)))}{m.group(3)}", text)
    text = text.strip()
    if len(text) > MAX_DIAGNOSTIC_CHARS:   # the first errors matter most
        text = text[:MAX_DIAGNOSTIC_CHARS] + "\n[... diagnostics truncated ...]"
    return text


def signal_name(sig: int) -> str:
    """SIGSEGV and the like, for the message of a compiler that crashed."""
    import signal
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
