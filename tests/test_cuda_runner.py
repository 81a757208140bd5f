"""The CUDA runner's pieces that need no GPU: its hold kernel is valid PTX for the GPUs kfray
targets, and a runner without a CUDA context refuses device buffers with a clear error."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from kfray.eval.runner_cuda import HOLD_PTX


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="no ptxas on PATH")
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_the_hold_kernel_assembles(tmp_path, arch):
    src = tmp_path / "hold.ptx"
    src.write_text(HOLD_PTX)
    out = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(tmp_path / "hold.cubin")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "hold.cubin").stat().st_size > 0


def test_device_buffers_before_a_context_are_refused():
    import socket

    from kfray.eval import wire
    from kfray.eval.runner import Runner

    a, b = socket.socketpair()
    r = Runner(b)
    wire.send(a, {"op": "cuda_map", "ids": [1], "handles": ["00" * 64], "sizes": [4], "seq": 7})
    wire.send(a, {"op": "exit", "seq": 8})
    r.serve()
    ans = wire.recv(a, timeout=5)
    assert ans["seq"] == 7 and "error" in ans, ans
