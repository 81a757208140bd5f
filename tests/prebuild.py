"""The suites' torch extensions that the tests build, built ahead into the session's shared
compile cache (`suite_cache` in conftest.py) by a background process at autogroup nice 19 and the
idle scheduling class: it gets a core only while the tests leave one free (a serial run keeps about
1.2 of 2 cores busy). Each build is 17-23 s of g++ on 2 idle cores, 209 s in all with the
precompiled header, which the tests otherwise wait for one at a time. The order is the order of
first use; a kernel a test no longer uses, or one it reaches first, is only idle time spent. Tests
that check building itself build sources of their own and are not here.

Run: python tests/prebuild.py <compile cache folder>"""
from __future__ import annotations

import sys
from pathlib import Path

DATA = Path(__file__).parent / "data"
RKB = DATA / "rkb_form" / "linear_relu"
SUITE = DATA / "rkb_suite"


def kernels() -> list[tuple[str, str]]:
    """(task, source) pairs, in the order the test files first build them."""
    from kfray.tasks import load_task

    def seed(ref: str) -> str:
        return next(s.source for s in load_task(ref).seeds if s.name == "reference_function")

    out = [(f"rkb:{RKB}#backward", (DATA / "rkb_form" / k).read_text())                   # test_judge_apart
           for k in ("backward_hostile.cpp", "backward_clock.cpp")]
    out += [(f"rkb:{RKB}@multi", (RKB / "forward.cpp").read_text())]    # test_suite_harness, test_sweep
    out += [(f"rkb:{RKB}#backward", (RKB / k).read_text()) for k in ("backward.cpp", "backward_wrong.cpp")]  # and test_sweep
    out += [(f"rkb:{SUITE / 'optional_arg'}", seed(f"rkb:{SUITE / 'optional_arg'}")),
            (f"rkb:{SUITE / 'batchnorm_train'}", seed(f"rkb:{SUITE / 'batchnorm_train'}"))]
    out += [(f"rkb:{RKB}", seed(f"rkb:{RKB}"))]   # test_sweep: a search evaluates every seed of its task
    return out


def main(cache: str) -> None:
    from kfray.config import EvalConfig
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend
    from kfray.source import parse_params
    from kfray.tasks import load_task

    backend = TorchExtCpuBackend(EvalConfig(cache_dir=cache))
    done = set()
    for ref, source in kernels():
        if source in done:
            continue
        done.add(source)
        try:
            build = backend.compile(source, parse_params(source).default(), load_task(ref))
            print(f"{'hit' if build.cached else 'built'} {build.seconds:6.1f} s  {ref}", flush=True)
        except Exception as e:          # the test that uses it says what is wrong
            print(f"failed {ref}: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
