"""CUDA kf_forward kernels that attack their judge, on a real GPU: each runs in its own runner
(kfray/eval/runner_cuda.py) and is refused or flagged with the rule's name. The forms are those
of the CPU tests (tests/test_judge_apart.py): a forged answer on the wire, the runner's own timer
patched through the Python C API, a marker left for the next candidate."""
from __future__ import annotations

import pytest

from test_cuda_gpu import _SKIP, AXPB_KERNEL, HEAD, SIG, _eval, evaluator  # noqa: F401  (the fixture)
from test_judge_apart import c_bytes, json_frame

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]

PY_API = ('extern "C" { int PyGILState_Ensure(void); void PyGILState_Release(int); '
          'int PyRun_SimpleStringFlags(const char*, void*); }\n')
LAUNCH = "    k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, a, b, n);\n"
# The runner's timer claims a hundredth of what the call took.
TIMER_PATCH = ("import kfray.eval.runner_cuda as r\\n_call = r.CudaSide.call\\n"
               "def call(self, fn, args):\\n    d = _call(self, fn, args)\\n    d['s'] *= 0.01\\n    return d\\n"
               "r.CudaSide.call = call\\n")


def kernel(extra: str = "", before: str = "") -> str:
    return HEAD + "#include <cstdlib>\n#include <sys/stat.h>\n#include <unistd.h>\n" + PY_API + before + \
        AXPB_KERNEL + SIG + " {\n" + LAUNCH + extra + "    return (int)cudaGetLastError();\n}\n"


def test_a_forged_answer_from_a_cuda_kernel_is_refused_as_out_of_turn(evaluator):
    frame = json_frame({"rc": 0, "err": 0, "s": 1e-9})
    r = _eval(evaluator, kernel(before=f"static const unsigned char F[] = {c_bytes(frame)};\n", extra="""
    for (int fd = 3; fd < 1024; ++fd) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) { ssize_t w = write(fd, F, sizeof F); (void)w; }
    }
"""))
    assert r.tier == 2 and "out of turn" in r.reason and "data-only wire" in r.reason, r.reason


def test_a_cuda_kernel_that_patches_its_runners_timer_is_not_believed(evaluator):
    honest = _eval(evaluator, kernel())
    assert honest.tier == 5 and not honest.facts.get("untrusted"), honest.reason
    r = _eval(evaluator, kernel(extra=f"""
    static bool done = false;
    if (!done) {{
        done = true;
        int g = PyGILState_Ensure();
        PyRun_SimpleStringFlags("{TIMER_PATCH}", nullptr);
        PyGILState_Release(g);
    }}
"""))
    assert r.tier == 5, r.reason                     # correct values, but its times are its own fiction
    why = r.facts.get("untrusted", "")
    assert "outside clock" in why or "roofline" in why or "hardware" in why, \
        f"faked times believed: {r.times} against honest {honest.times}"
    # the control: the patch did shrink what the runner reported
    print("honest", honest.times, "patched", r.times, why)


def test_a_cuda_kernels_leftovers_do_not_reach_the_next_candidate(evaluator):
    assert _eval(evaluator, kernel(extra='    setenv("KF_LEFT_BEHIND", "1", 1);\n')).tier == 5
    r = _eval(evaluator, kernel(extra='    if (getenv("KF_LEFT_BEHIND")) return 7;\n'))
    assert r.tier == 5, f"the next candidate saw what the last one left: {r.reason}"


def test_the_judges_context_survives_a_kernels_illegal_address(evaluator):
    # the null pointer comes as an argument: a literal one lets the compiler drop the store
    bad = HEAD + AXPB_KERNEL.replace("float* y,", "float* y, float* bad,").replace("y[i] =", "bad[i] =") + \
        SIG + " {\n" + LAUNCH.replace("(x, y,", "(x, y, nullptr,") + "    return (int)cudaGetLastError();\n}\n"
    before = evaluator.stats()["sandbox_restarts"]
    r = _eval(evaluator, bad)
    assert r.tier == 2 and "illegal" in r.reason.lower(), r.reason
    ok = _eval(evaluator, kernel())
    assert ok.tier == 5, ok.reason
    assert evaluator.stats()["sandbox_restarts"] == before, "the sticky error ended the judge, not the runner"
