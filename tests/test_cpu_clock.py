"""The outside clock's view of a candidate's processes: /proc files kept open must still give
fresh figures on every read, and none for a process that has gone."""
import subprocess
import sys
import time

from kfray.eval.cpu_clock import cpu_snapshot

# spins for {s} seconds of its own CPU (not of wall time: on a busy host it may get a CPU for only
# part of the time), then sleeps
BUSY = "import time\nwhile time.process_time() < {s}: pass\ntime.sleep(30)"


def _until(pid: int, first: tuple, index: int, more_than: float, limit: float = 20.0) -> tuple:
    """Snapshots until figure `index` has grown by `more_than` seconds since `first`, or `limit`
    seconds of wall time have passed; the last snapshot."""
    end = time.monotonic() + limit
    while True:
        time.sleep(0.05)
        now = cpu_snapshot(pid)
        if now[index] - first[index] > more_than or time.monotonic() > end:
            return now


def test_a_snapshot_sees_the_cpu_a_process_used_since_the_last_one():
    p = subprocess.Popen([sys.executable, "-c", BUSY.format(s=1.5)])
    try:
        time.sleep(0.1)
        first = cpu_snapshot(p.pid)
        second = _until(p.pid, first, 1, 0.3)
        assert second[1] - first[1] > 0.3, (first, second)    # its request thread's CPU time
        assert second[3] - first[3] > 0.3, (first, second)    # its processes' CPU time
        # one thread spinning: the process's CPU time is that thread's, read the same way
        assert abs((second[3] - first[3]) - (second[1] - first[1])) < 0.1, (first, second)
    finally:
        p.kill()
        p.wait()


def test_a_process_that_has_gone_reads_as_nothing_not_as_its_last_figures():
    p = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.3)])
    alive = _until(p.pid, (0.0, 0.0, 0.0, 0.0), 1, 0.2)
    assert alive[1] > 0.2, alive
    p.kill()
    p.wait()
    gone = cpu_snapshot(p.pid)
    assert gone[1:] == (0.0, 0.0, 0.0), gone
