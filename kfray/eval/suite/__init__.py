"""A kernel judged and timed the way its suite does, with kfray's defences on top. Runs in the
sandbox worker for tasks that carry a SuiteSpec (kfray/tasks/suite_spec.py).

The suite's verdict comes first and is never replaced: its trials (seeds drawn after
`manual_seed(42)`), its order, its fresh models, `torch.allclose` over every element at its
tolerance.
- robust-kbench (robust_kbench/sandbox/correct_*_fn.py): per configuration and trial, a fresh
  `Model(**init)` for each side; forward: the kernel through `Model.forward(*inputs, fn=kernel)`,
  then the reference, then the kernel again, both kernel outputs compared; backward: the kernel
  installed as `AutogradFunction.backward_fn`, `out.backward(grad)` on both sides, every `.grad`
  of the parameters and inputs compared. The kernel's side of it runs in the candidate's runner
  like a forward call (`backward_side`): the runner builds the task's Model after the judge's
  seed, takes the judge's parameters as its state, installs the kernel in its own copy of the
  task, and hands back the gradients in shared memory; the inputs, the parameters, the upstream
  `grad` and every comparison are the judge's, and the extension is never loaded in the judge.
- KernelBench (src/kernelbench/eval.py): one `Model` and one candidate model built after
  `set_seed(42)`; per trial, inputs from `get_inputs()` after `set_seed(seed)`, the reference
  first, then the candidate, `allclose(atol=rtol=tol(precision))`.

kfray's defences come after, each with its own reason: outputs that are views of an input or
parameter, inputs or parameters changed by the kernel, outputs still changing after the call
returned (work left on another stream or thread), and extra trials on fresh seeds where the kernel
runs before the reference exists, both before and after the timing (cached or copied results).
On CUDA the stream contract is probed once (stream_probe.py).

Figures: the suite's (the mean of CUDA-event samples; KernelBench with an L2 flush before each,
robust-kbench config-averaged), and kfray's beside them (medians, geometric mean of per-config
ratios), against eager PyTorch timed alongside, and torch.compile when asked.

Modules: `common` (seeds, the failed-check exception, tensor helpers), `runners` (each suite's way of
building and calling), `judge` (the trials and kfray's checks), `timing` (the figures),
`remote_case` and `backward_side` (the candidate's side in its runner, forward and backward),
`stream_probe`, and `job` (one evaluation, what the sandbox calls).
"""
from kfray.eval.suite.common import suite_seeds
from kfray.eval.suite.job import run_suite_job

__all__ = ["run_suite_job", "suite_seeds"]
