// A correct backward of relu(x @ W^T + b) that, on its first call, slows perf_counter down 100-fold
// in its process (every module's copy of it), so that the times its process claims are a hundredth of
// the real ones. The judge's own clock must see through it.
#include <torch/extension.h>
#include <vector>

static const char* PATCH =
    "import time, sys\n"
    "_real = time.perf_counter\n"
    "_t0 = _real()\n"
    "def fake(): return _t0 + (_real() - _t0) * 0.01\n"
    "time.perf_counter = fake\n"
    "for m in list(sys.modules.values()):\n"
    "    try:\n"
    "        if getattr(m, 'perf_counter', None) is _real: m.perf_counter = fake\n"
    "    except Exception: pass\n";

std::vector<torch::Tensor> backward(torch::Tensor grad_output, torch::Tensor x, torch::Tensor weight,
                                    torch::Tensor out) {
    static bool done = false;
    if (!done) {
        done = true;
        PyRun_SimpleString(PATCH);      // called from Python: the GIL is held
    }
    auto g = grad_output * (out > 0).to(grad_output.scalar_type());
    return {g.mm(weight), g.t().mm(x), g.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("backward", &backward); }
