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


def test_an_ipc_handle_reaches_the_cuda_driver_whole():
    """A CUDA IPC handle is 64 opaque bytes, zeros among them; all of them reach the driver (a
    c_char array stops at the first zero, and the runner then could not open the judge's buffers)."""
    from kfray.eval.runner_cuda import ipc_handle

    raw = bytes([7, 0, 0, 3] + [0] * 40 + list(range(1, 21)))
    assert bytes(ipc_handle(raw.hex())) == raw
    with pytest.raises(ValueError, match="63 bytes"):
        ipc_handle(raw[:63].hex())



def test_only_a_large_tensor_under_the_judges_allocator_setting_goes_to_a_runner_uncopied(monkeypatch):
    """An IPC handle maps a tensor's whole allocation. The judge's allocator never splits a block
    over ALONE_BYTES, so only such a tensor is known to be alone there; any other is copied first."""
    torch = pytest.importorskip("torch")
    from kfray.eval.sandbox import JUDGE_ALLOC_CONF
    from kfray.eval.tensor_wire import ALONE_BYTES, _alone

    big, small = torch.empty(ALONE_BYTES // 4 + 1), torch.empty(16)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", JUDGE_ALLOC_CONF)
    assert _alone(big) and not _alone(small)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", JUDGE_ALLOC_CONF + ",expandable_segments:True")
    assert not _alone(big)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert not _alone(big)
