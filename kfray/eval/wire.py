"""The wire between kfray and the processes that may hold generated code: data only.

Frames are a 4-byte big-endian length and a UTF-8 JSON object, at most `max_bytes` long, with
file descriptors (shared buffers) passed beside them as SCM_RIGHTS. Nothing read from the wire is
ever unpickled or executed: it is parsed as JSON and then checked field by field (`fields`), and a
frame that breaks the format, the size cap or the schema is a `WireError`, never a result.

(A kernel runs in a process that holds one end of such a socket, so whatever it writes there is
hostile input: an answer in `multiprocessing.connection`'s pickle format ran in the evaluator.)
"""
from __future__ import annotations

import array
import json
import math
import socket
import struct
import time
from typing import Any

MAX_FRAME = 4 << 20            # bytes of JSON in one frame
MAX_FDS = 64


class WireError(Exception):
    """A frame that is not well-formed, too large, or not what the schema allows."""


def _plain(o: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists (json.dumps' `default`)."""
    if hasattr(o, "item") and getattr(o, "ndim", 1) == 0:
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"{type(o).__name__} cannot go on the wire")


def encode(obj: dict) -> bytes:
    data = json.dumps(obj, default=_plain, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes is over the {MAX_FRAME}-byte cap")
    return struct.pack(">I", len(data)) + data


def send(sock: socket.socket, obj: dict, fds: list[int] | tuple = ()) -> None:
    frame = encode(obj)
    if fds:
        sock.sendmsg([frame[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        sock.sendall(frame[4:])
    else:
        sock.sendall(frame)


def _read_exact(sock: socket.socket, n: int, fds: list[int], deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete frame in time")
            sock.settimeout(left)
        data, anc, _flags, _ = sock.recvmsg(n - len(buf), socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[:len(payload) - len(payload) % 4])
                fds.extend(got)
        if not data:
            raise EOFError("the peer closed the wire")
        buf += data
    return bytes(buf)


def recv(sock: socket.socket, timeout: float | None = None, max_bytes: int = MAX_FRAME,
         want_fds: bool = False) -> Any:
    """One frame as a dict (and the descriptors that came with it when `want_fds`). Descriptors a
    caller did not ask for are closed at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fds: list[int] = []
    try:
        head = _read_exact(sock, 4, fds, deadline)
        (n,) = struct.unpack(">I", head)
        if n > max_bytes:
            raise WireError(f"a frame of {n} bytes was announced; the cap is {max_bytes}")
        body = _read_exact(sock, n, fds, deadline)
    finally:
        sock.settimeout(None)
        if not want_fds or len(fds) > MAX_FDS:
            _close(fds)
    if want_fds and len(fds) > MAX_FDS:
        raise WireError(f"{len(fds)} descriptors came with one frame; the cap is {MAX_FDS}")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        _close(fds)
        raise WireError(f"not a JSON frame ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(obj, dict):
        _close(fds)
        raise WireError(f"a frame must be a JSON object, not {type(obj).__name__}")
    return (obj, fds) if want_fds else obj


def _close(fds: list[int]) -> None:
    import os

    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# --- checking what came in ----------------------------------------------------------------------
def number(v: Any, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise WireError(f"{what} must be a number in [{lo:g}, {hi:g}], got {str(v)[:60]!r}")
    return float(v)


def integer(v: Any, what: str, lo: int = -(1 << 62), hi: int = 1 << 62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise WireError(f"{what} must be an integer in [{lo}, {hi}], got {str(v)[:60]!r}")
    return v


def text(v: Any, what: str, limit: int = 8000) -> str:
    if not isinstance(v, str):
        raise WireError(f"{what} must be a string, got {type(v).__name__}")
    return v[:limit]


def fields(obj: dict, allowed: dict[str, type | tuple], what: str) -> dict:
    """The object's keys must be among `allowed`, each of the type named there."""
    for k, v in obj.items():
        if k not in allowed:
            raise WireError(f"{what}: unexpected field {k[:40]!r}")
        if not isinstance(v, allowed[k]) or (isinstance(v, bool) and allowed[k] in (int, float, (int, float))):
            raise WireError(f"{what}: field {k!r} must be {allowed[k]}, got {type(v).__name__}")
    return obj
