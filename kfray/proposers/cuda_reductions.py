"""Reduction edits on CUDA kernels, for the offline proposer.

- `warp_reduce`: a shared-memory tree reduction (`red[t] = v; for (s = BLOCK / 2; ...)`, one
  barrier per level) becomes warp shuffles inside each warp, one shared slot per warp and a last
  shuffle round in the first warp: two barriers instead of log2(BLOCK).
- `online_softmax`: a max pass followed by a sum-of-exponentials pass over the same values
  becomes one pass that keeps a running max and rescales the running sum when the max grows
  (Milakov and Gimelshein, 2018): one read of the row less.
Pure functions `source -> source | None`; kf_forward's signature is never touched.
"""
from __future__ import annotations

import re

_TREE = re.compile(
    r"(?P<ind>[ \t]*)(?P<red>\w+)\[(?P<t>\w+)\]\s*=\s*(?P<val>[^;]+);\s*\n\s*__syncthreads\(\);\s*\n"
    r"\s*for\s*\(\s*int\s+(?P<s>\w+)\s*=\s*(?P<size>\w+)\s*/\s*2\s*;\s*(?P=s)\s*>\s*0\s*;\s*(?P=s)\s*>>=\s*1\s*\)\s*\{\s*"
    r"if\s*\(\s*(?P=t)\s*<\s*(?P=s)\s*\)\s*(?P=red)\[(?P=t)\]\s*(?P<op>\+=\s*(?P=red)\[(?P=t)\s*\+\s*(?P=s)\]|"
    r"=\s*fmaxf\(\s*(?P=red)\[(?P=t)\]\s*,\s*(?P=red)\[(?P=t)\s*\+\s*(?P=s)\]\s*\))\s*;\s*"
    r"__syncthreads\(\);\s*\}")

_TWO_PASS = re.compile(
    r"(?P<ind>[ \t]*)float\s+(?P<m>\w+)\s*=\s*-INFINITY\s*;\s*\n"
    r"\s*(?P<loop>for\s*\([^;]*;[^;]*;[^)]*\))\s*(?P=m)\s*=\s*fmaxf\(\s*(?P=m)\s*,\s*(?P<x>[^;]+?)\)\s*;\s*\n"
    r"\s*float\s+(?P<s>\w+)\s*=\s*0(?:\.0?)?f?\s*;\s*\n"
    r"\s*(?P=loop)\s*(?P=s)\s*\+=\s*(?P<exp>expf|__expf)\(\s*(?P=x)\s*-\s*(?P=m)\s*\)\s*;")


def warp_reduce(src: str, rng=None) -> str | None:
    """Every shared-memory tree reduction over a block becomes shuffles within warps plus one
    shared step across warps (needs a block of 32..1024 threads, which the tree loop implies)."""
    def shuffle(m: re.Match) -> str:
        ind, red, t, val, size = m["ind"], m["red"], m["t"], m["val"], m["size"]
        add = m["op"].startswith("+")
        op = (lambda a, b: f"{a} + {b}") if add else (lambda a, b: f"fmaxf({a}, {b})")
        ident = "0.f" if add else "-INFINITY"
        step = (f"{ind}    for (int kf_o = 16; kf_o > 0; kf_o >>= 1) "
                f"kf_v = {op('kf_v', '__shfl_xor_sync(0xffffffffu, kf_v, kf_o)')};\n")
        return (f"{ind}{{   // warp shuffles, then one shared slot per warp\n"
                f"{ind}    float kf_v = {val};\n{step}"
                f"{ind}    if (({t} & 31) == 0) {red}[{t} >> 5] = kf_v;\n"
                f"{ind}    __syncthreads();\n"
                f"{ind}    if ({t} < 32) {{\n"
                f"{ind}        kf_v = {t} < ({size}) / 32 ? {red}[{t}] : {ident};\n"
                f"    {step}"
                f"{ind}        if ({t} == 0) {red}[0] = kf_v;\n"
                f"{ind}    }}\n"
                f"{ind}    __syncthreads();\n"
                f"{ind}}}")
    new = _TREE.sub(shuffle, src)
    return new if new != src else None


def online_softmax(src: str, rng=None) -> str | None:
    """A max loop then a sum-of-exp loop with the same header: one online pass instead."""
    def fuse(m: re.Match) -> str:
        ind, mv, s, x, e = m["ind"], m["m"], m["s"], m["x"], m["exp"]
        return (f"{ind}float {mv} = -INFINITY, {s} = 0.f;   // online: the sum is rescaled when the max grows\n"
                f"{ind}{m['loop']} {{\n"
                f"{ind}    const float kf_x = {x};\n"
                f"{ind}    if (kf_x > {mv}) {{ {s} = {s} * {e}({mv} - kf_x) + 1.f; {mv} = kf_x; }}\n"
                f"{ind}    else {s} += {e}(kf_x - {mv});\n"
                f"{ind}}}")
    new = _TWO_PASS.sub(fuse, src, count=1)
    return new if new != src else None


EDITS = {"warp_reduce": warp_reduce, "online_softmax": online_softmax}
