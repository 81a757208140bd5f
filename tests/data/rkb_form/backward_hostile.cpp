// HOSTILE: a WRONG backward of relu(x @ W^T + b) (it forgets the relu mask) whose module init
// rewrites the process it is loaded in so that no comparison there can fail: torch.allclose,
// torch.Tensor.allclose, torch.isclose and torch.equal, and kfray's own comparison helpers in every
// kfray module already imported, all answer "equal". In the judge this would pass; in its runner
// it changes nothing the judge relies on. It marks the process it ran in (an environment variable).
#include <torch/extension.h>
#include <pybind11/eval.h>
#include <vector>

namespace py = pybind11;

std::vector<torch::Tensor> backward(torch::Tensor grad_output, torch::Tensor x, torch::Tensor weight,
                                    torch::Tensor out) {
    auto g = grad_output;  // forgets the relu mask
    return {g.mm(weight), g.t().mm(x), g.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    py::dict scope;
    scope["__builtins__"] = py::module_::import("builtins");
    py::exec(R"(
import os, sys, torch
os.environ["KFRAY_HOSTILE_BACKWARD_RAN_IN"] = str(os.getpid())
torch.allclose = lambda *a, **k: True
torch.Tensor.allclose = lambda *a, **k: True
torch.isclose = lambda a, b, *r, **k: torch.ones_like(a, dtype=torch.bool)
torch.equal = lambda *a, **k: True
fakes = {"all_close": lambda *a, **k: True, "allclose_reason": lambda *a, **k: None,
         "changed": lambda *a, **k: None, "unexplained_change": lambda *a, **k: None,
         "max_diff": lambda *a, **k: 0.0}
for name, mod in list(sys.modules.items()):
    if name.startswith("kfray") and mod is not None:
        for attr, fake in fakes.items():
            if callable(getattr(mod, attr, None)):
                setattr(mod, attr, fake)
)", scope);
    m.def("backward", &backward);
}
