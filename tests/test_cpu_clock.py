"""The outside clock's view of a candidate's processes: /proc files kept open must still give
fresh figures on every read, and none for a process that has gone."""
import subprocess
import sys
import time

from kfray.eval.cpu_clock import cpu_snapshot

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\ntime.sleep(30)"


def test_a_snapshot_sees_the_cpu_a_process_used_since_the_last_one():
    p = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.6)])
    try:
        time.sleep(0.1)
        first = cpu_snapshot(p.pid)
        time.sleep(0.4)                      # the child spins all along
        second = cpu_snapshot(p.pid)
        assert second[1] - first[1] > 0.2, (first, second)    # its request thread's CPU time
        assert second[3] - first[3] > 0.2, (first, second)    # its processes' CPU time
    finally:
        p.kill()
        p.wait()


def test_a_process_that_has_gone_reads_as_nothing_not_as_its_last_figures():
    p = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.3)])
    time.sleep(0.4)
    alive = cpu_snapshot(p.pid)
    assert alive[1] > 0.1
    p.kill()
    p.wait()
    gone = cpu_snapshot(p.pid)
    assert gone[1:] == (0.0, 0.0, 0.0), gone
