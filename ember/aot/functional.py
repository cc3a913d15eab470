"""Functionalization helpers: run a function on functional wrappers of its inputs, then read back what
it did to them.

Inside ``functionalize()`` every in-place op and view becomes an out-of-place op on a
``FunctionalTensor``; the wrapper of each input remembers whether (and how) the input was mutated, and
unwrapping it yields the latest value. When this runs under ``make_fx`` the unwrapped values are proxies,
so the traced ATen graph is functional and ends with the new values of mutated inputs as outputs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.utils._python_dispatch import _detect_infra_mode

_FUNCTIONALIZE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


class _Functionalizer(FunctionalTensorMode):
    """FunctionalTensorMode, except that in-place random ops keep eager's random stream.

    An in-place random op (``bernoulli_`` inside CPU dropout, ``uniform_``, ...) fills its tensor in
    memory order. Functionalization would turn it into the out-of-place op, which draws into a new
    *contiguous* tensor: for a non-contiguous target (dropout of a transposed activation) the same
    numbers land in other places, and the traced strides no longer match the real ones. So the draw is
    done in place on a contiguous tensor laid out in the target's memory order, then permuted back.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _IN_PLACE_RANDOM and not args[0].is_contiguous():
            with self:
                return _draw_in_memory_order(func, args, kwargs or {})
        if func in _CHECK_ONLY:
            # torch registers _linalg_check_errors as effectful, so functionalization would thread an
            # effect token through it: a token the graph then takes as an extra input that no
            # caller passes (linalg.inv, solve, cholesky... failed at their first call). It only
            # reads its input and returns nothing: recorded as a plain call on the unwrapped value
            # (fx keeps it, as an effectful op), it still raises on a singular matrix, as eager does.
            return func(*[from_fun(a) for a in args], **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


# ops that only check their inputs (no result, no mutation) though torch marks them effectful
_CHECK_ONLY = {torch.ops.aten._linalg_check_errors.default}


def _draw_in_memory_order(func, args, kwargs):
    target = args[0]
    perm = sorted(range(target.dim()), key=lambda d: -target.stride(d))  # outermost dim first
    inverse = sorted(range(len(perm)), key=perm.__getitem__)
    fresh = torch.empty([target.shape[d] for d in perm], dtype=target.dtype, device=target.device)
    rest = [a.expand(target.shape).permute(perm) if isinstance(a, torch.Tensor) else a for a in args[1:]]
    func(fresh, *rest, **kwargs)
    target.copy_(fresh.permute(inverse))
    return target


def _in_place_random_ops() -> set:
    ops = set()
    for name in ("bernoulli_", "uniform_", "normal_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                 "random_"):
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.nondeterministic_seeded in op.tags:
                ops.add(op)
    return ops


_IN_PLACE_RANDOM = _in_place_random_ops()


@contextlib.contextmanager
def functionalize():
    """Python-level functionalization. The C++ Functionalize key is excluded above the Python mode so
    that ops are functionalized exactly once, by the Python mode."""
    with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE_KEYS), _Functionalizer(_allow_token_discovery=True):
        yield


def to_fun(value):
    return FunctionalTensor.to_functional(value) if isinstance(value, torch.Tensor) else value


def to_fun_leaf(value):
    """A functional wrapper that is an autograd *leaf* (``to_fun`` gives a non-leaf one). Joint
    tracing takes gradients with respect to these, and autocast only caches casts of leaves: with a
    leaf, a weight cast to bf16 once and used twice has one cast node, as in eager, so both uses'
    gradients are summed in bf16 before the cast back, as eager sums them."""
    if not isinstance(value, torch.Tensor):
        return value
    inner = torch._to_functional_tensor(value)
    mode = _detect_infra_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)
    with mode:  # (metadata queries must reach the functional mode, not the proxy mode below it)
        out = FunctionalTensor(inner, mode)
    return out.requires_grad_(value.requires_grad)


def from_fun(value):
    """The plain tensor holding the latest value of a functional tensor (other values pass through)."""
    if not isinstance(value, FunctionalTensor):
        return value
    torch._sync(value)
    return torch._from_functional_tensor(value.elem)


@dataclass(frozen=True)
class Mutation:
    data: bool = False          # the values changed (add_, copy_, batch_norm running stats)
    metadata: bool = False      # sizes/strides/storage changed (t_, resize_, set_): not supported
    under_no_grad: bool = False  # every data mutation ran with grad mode off


def mutation_of(f_arg, arg) -> Mutation:
    """What the function did to the input ``arg``, read from its functional wrapper ``f_arg``."""
    if not isinstance(f_arg, FunctionalTensor):
        return Mutation()
    torch._sync(f_arg)
    inner = f_arg.elem
    data = bool(torch._functionalize_has_data_mutation(inner))
    latest = torch._from_functional_tensor(inner)
    metadata = (bool(torch._functionalize_was_storage_changed(inner))
                or latest.size() != arg.size() or latest.stride() != arg.stride()
                or latest.storage_offset() != arg.storage_offset())
    under_no_grad = data and bool(torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(inner))
    return Mutation(data, metadata, under_no_grad)
