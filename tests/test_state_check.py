"""The in-judge path's state check (kfray/eval/state_check.py): what a candidate that ran in the
judge could have changed is seen, and what the harness does by itself is not."""
from __future__ import annotations

import threading
import time
import types

import pytest

from kfray.eval.state_check import changes, fingerprint


def test_an_unchanged_process_shows_no_change():
    assert changes(fingerprint(), fingerprint()) == []


def test_a_patched_clock_a_flag_an_env_var_and_a_thread_are_each_seen(monkeypatch):
    torch = pytest.importorskip("torch")
    before = fingerprint()
    stop = threading.Event()
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setenv("KF_LEFT_BEHIND", "1")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not tf32
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        seen = " | ".join(changes(before, fingerprint()))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        stop.set()
        t.join()
    for what in ("time.perf_counter replaced", "matmul.allow_tf32 changed", "environment changed", "thread"):
        assert what in seen, seen


def test_a_module_imported_for_the_first_time_is_no_change_but_a_replaced_one_is(monkeypatch):
    import sys

    before = fingerprint()
    monkeypatch.setitem(sys.modules, "kfray_test_new_module", types.ModuleType("kfray_test_new_module"))
    assert changes(before, fingerprint()) == []
    monkeypatch.setitem(sys.modules, "json", types.ModuleType("json"))
    assert any("json" in c for c in changes(before, fingerprint()))


def test_a_patched_clock_voids_the_verdict_but_a_thread_or_env_var_only_recycles(monkeypatch):
    from kfray.eval.state_check import tampered

    before = fingerprint()
    monkeypatch.setenv("KF_LEFT_BEHIND", "1")
    assert changes(before, fingerprint()) and tampered(changes(before, fingerprint())) == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert tampered(changes(before, fingerprint())) == ["time.perf_counter replaced"]
