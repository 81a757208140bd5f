"""kf_forward's return codes, made readable: measure.py only formats rc, so the meaning rides on it."""
from __future__ import annotations


class ReturnCode(int):
    """A nonzero kf_forward result that prints with its meaning (measure.py only formats rc).

    `after_zero`: kf_forward itself returned 0 and the harness found the problem afterwards."""

    def __new__(cls, code: int, text: str, after_zero: bool = False):
        obj = super().__new__(cls, code)
        obj.text = text
        obj.after_zero = after_zero
        return obj

    def __str__(self) -> str:
        if self.after_zero:
            return f"0, but {self.text}"
        return f"{int(self)} ({self.text})" if self.text else str(int(self))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec)


def cuda_error_text(code: int) -> str:
    """CUDA's name and description of an error code, or "" without CuPy."""
    try:
        import cupy

        return str(cupy.cuda.runtime.CUDARuntimeError(int(code)))
    except Exception:
        return ""


def kernel_return_code(rc: int) -> ReturnCode:
    """kf_forward's own nonzero result; codes below 10000 are read as cudaError_t values."""
    return ReturnCode(rc, cuda_error_text(rc) if 0 < rc < 10000 else "")
