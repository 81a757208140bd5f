"""Shapes and dtypes of one configuration of a PyTorch problem, learnt without running it for real
where possible (meta device, fake tensors), so listing a task stays cheap whatever its sizes.

Split from kfray/tasks/torch_ref.py; `build_torch_task` traces every configuration with `trace`.
"""
from __future__ import annotations

from kfray.errors import TaskError
from kfray.tasks.torch_problem import Problem, missing_package, outputs_of, torch_dtype_name

REAL_TRACE_LIMIT = 64 << 20     # bytes of inputs + parameters below which a trace may run for real
REAL_BUILD_LIMIT = 4 << 30      # bytes a model may allocate when it must be constructed for real


def build_real(torch, make, limit: int, where: str):
    """Construct a model for real on the CPU, for one whose __init__ meta and fake tensors cannot run
    (it calls `.item()`, say), stopping as soon as its new tensors pass `limit` bytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Guard(TorchDispatchMode):
        used = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info for r in func._schema.returns):   # a new tensor: no view, no in-place
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor):
                        Guard.used += t.numel() * t.element_size()
                if Guard.used > limit:
                    raise TaskError(f"{where}: meta and fake tensors cannot construct the model, and "
                                    f"constructing it for real takes more than {limit / 2**30:.3g} GiB of "
                                    f"tensors (kfray's limit for learning its shapes on the host)")
            return out

    torch.manual_seed(0)
    with torch.device("cpu"), torch.no_grad(), Guard():
        return make()


class _SlowOnMeta(Exception):
    """A model whose meta-device forward takes seconds (an LSTM of 512 steps: 13 s) where
    FakeTensorMode takes milliseconds: the trace goes straight to fake tensors."""


def trace(torch, problem: Problem, settings: dict, cname: str) -> dict:
    """Shapes and dtypes of inputs, parameters and outputs of one configuration.

    Listing a task must stay cheap whatever its sizes (KernelBench's reach 32768 x 32768), so the
    forward runs on the meta device, then under FakeTensorMode (ops without a meta kernel, `.cpu()`,
    CUDA-only inputs); a model that neither can construct (`.item()` in __init__) is constructed for
    real on the CPU, its forward still fake; only a problem whose tensors are small is ever run for
    real, on the CPU."""
    where = f"{problem.where} (configuration {cname})"
    sized: list[int] = []                  # bytes of inputs + parameters, as the fake attempt saw them

    def build(ctx, model=None):
        with ctx, torch.no_grad():
            if model is None:
                model = problem.make_model(settings)
            if isinstance(ctx, torch.device) and ctx.type == "meta" and \
                    any(isinstance(m, torch.nn.RNNBase) for m in model.modules()):
                raise _SlowOnMeta("RNN layers run step by step on the meta device: fake tensors instead")
            inputs = problem.make_inputs(settings)
            if not isinstance(inputs, (list, tuple)):
                raise TaskError(f"{where}: get_inputs must return a list, got {type(inputs).__name__}")
            tensors = [t for t in list(inputs) + list(model.parameters()) + list(model.buffers())
                       if isinstance(t, torch.Tensor)]
            sized[:] = [sum(t.numel() * t.element_size() for t in tensors)]
            res = model(*inputs) if problem.forward is None else problem.forward(
                model, {**dict(model.named_parameters()), **dict(model.named_buffers())}, list(inputs))
        return model, list(inputs), res

    def fake():
        from torch._subclasses.fake_tensor import FakeTensorMode
        return FakeTensorMode(allow_non_fake_inputs=True)

    def why(e: Exception) -> str:
        return missing_package(e) or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    errors = []
    real = None                            # a model constructed for real, when meta and fake cannot
    for ctx in (lambda: torch.device("meta"), fake):
        try:
            model, inputs, res = build(ctx())
            errors.clear()
            break
        except TaskError:
            raise
        except Exception as e:
            errors.append(e)
    else:
        if not sized:                      # the model could not even be constructed: build it for real
            try:
                real = build_real(torch, lambda: problem.make_model(settings), REAL_BUILD_LIMIT, where)
            except TaskError:
                raise
            except Exception as e:
                raise TaskError(f"{where}: building the model failed: {why(e)} (on the meta device: "
                                f"{why(errors[0])})") from None
            try:
                model, inputs, res = build(fake(), real)
                errors.clear()
            except TaskError:
                raise
            except Exception as e:
                errors.append(e)
    if errors:
        if not sized:
            raise TaskError(f"{where}: building the model or its inputs failed: {why(errors[-1])}") from None
        if sized[0] > REAL_TRACE_LIMIT:
            raise TaskError(f"{where}: its forward runs neither on the meta device nor with fake tensors "
                            f"({why(errors[-1])}), and a real run with {sized[0] / 2**20:.0f} MiB of tensors is "
                            f"too costly just to learn the output shapes") from None
        try:                               # small enough: one real run is cheap
            torch.manual_seed(0)
            model, inputs, res = build(torch.device("cpu"), real)
        except TaskError:
            raise
        except Exception as e:
            raise TaskError(f"{where}: building the model or running its forward failed: {why(e)}") from None
    fixed, tin = {}, []
    names = problem.input_names
    for i, x in enumerate(inputs):
        nm = names[i] if i < len(names) else f"input{i}"
        if isinstance(x, torch.Tensor):
            tin.append((nm, tuple(x.shape), torch_dtype_name(x, where, f"input {nm}")))
        elif isinstance(x, (int, float, bool)) or x is None:
            fixed[i] = x
        else:
            raise TaskError(f"{where}: input {nm} is a {type(x).__name__}; only tensors and numbers are supported")
    params, is_param = [], []
    pnames = set()
    for pname, p in list(model.named_parameters()) + list(model.named_buffers()):
        if pname in pnames:
            continue
        pnames.add(pname)
        params.append((pname, tuple(p.shape), torch_dtype_name(p, where, f"parameter {pname}")))
        is_param.append(isinstance(p, torch.nn.Parameter))
    outs = [(f"out{i}", tuple(o.shape), torch_dtype_name(o, where, "the output"))
            for i, o in enumerate(outputs_of(res, where))]
    return {"inputs": tin, "params": params, "is_param": is_param, "outputs": outs, "fixed_pos": fixed}
