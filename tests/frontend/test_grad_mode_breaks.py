"""Grad mode (and autocast) after a compiled call that switches it and breaks: the same as eager.

The graph's ``_set_grad_enabled`` nodes switch the mode for the ops inside it only: ember's autograd
layer (the default backend, and aot_eager) runs a graph as a whole and hands the caller's mode back.
A mode the traced code leaves switched (``torch.set_grad_enabled(False)`` as a plain call, a
with-block entered before a break whose exit runs in the resumed graph) must be set by the entry
after its graph: torch.optim's ``_use_grad_for_differentiable`` (switch, ``torch._dynamo.graph_break()``,
restore in a ``finally``) left grad mode off after ``ember.compile(opt.step)()``.

Each case compares against eager, starting under grad mode on and off: the mode and CPU autocast
after the call, the outputs (values, dtype, ``requires_grad``) and mutated inputs.
"""
import functools

import pytest
import torch
import torch._dynamo  # (the program's import: torch._dynamo.graph_break is a graph break in ember)

import ember

gb = torch._dynamo.graph_break


@ember.disable
def opaque(t):
    return t + 1


def use_grad(func):
    """torch.optim.optimizer._use_grad_for_differentiable, as torch writes it."""
    def _use_grad(*args, **kwargs):
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(False)
            gb()
            ret = func(*args, **kwargs)
        finally:
            gb()
            torch.set_grad_enabled(prev)
        return ret
    functools.update_wrapper(_use_grad, func)
    return _use_grad


@use_grad
def optim_style(x):
    return x * 2


@torch.no_grad()
def no_grad_decorated(x):
    y = x * 2
    print(end="")
    return y + x


def set_grad_call_then_break(x):
    torch.set_grad_enabled(False)
    gb()
    return x * 2


def set_grad_call_no_break(x):
    torch.set_grad_enabled(False)
    return x * 2


def c_set_grad_call(x):
    torch._C._set_grad_enabled(False)
    gb()
    return x * 2


def no_grad_entered_by_hand(x):
    torch.no_grad().__enter__()
    gb()
    return x * 2


def autocast_and_no_grad(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            y = x @ x.T
            gb()
            z = y @ y
    return y, z, x * 3


def autocast_entered_by_hand(x):
    torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    return x @ x.T


def enable_grad_in_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
            opaque(y)
            z = y * 3
        w = x * 4
    return y, z, w


def break_after_the_block(x):
    with torch.no_grad():
        gb()
        y = x * 2
    gb()
    return y, x * 3


def mutation_under_no_grad(x, buf):
    with torch.no_grad():
        buf.add_(x)
        gb()
        buf.mul_(2)
    return buf * x


CASES = [optim_style, no_grad_decorated, set_grad_call_then_break, set_grad_call_no_break,
         c_set_grad_call, no_grad_entered_by_hand, autocast_and_no_grad, autocast_entered_by_hand,
         enable_grad_in_no_grad, break_after_the_block, mutation_under_no_grad]
NO_BREAK = (set_grad_call_no_break, autocast_entered_by_hand)  # a mode left switched at a plain return


def _run(fn, start: bool, compiled: bool):
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    args = (x, torch.zeros(4, 4)) if fn is mutation_under_no_grad else (x,)
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(start)
    breaks = None
    try:
        if compiled:
            report = ember.explain(fn, backend="aot_eager")(*args)
            out, breaks = report.out, report.graph_break_count
        else:
            out = fn(*args)
        state = (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"))
    finally:
        torch.set_autocast_enabled("cpu", False)
        torch.set_grad_enabled(prev)
    return out, state, args, breaks


def _check_same(a, b, what):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), what
        assert (b.requires_grad, b.dtype) == (a.requires_grad, a.dtype), what
        assert torch.equal(b.detach(), a.detach()), what
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(b) == len(a), what
        for i, (p, q) in enumerate(zip(a, b)):
            _check_same(p, q, f"{what}[{i}]")
    else:
        assert a == b, what


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_modes_after_a_break_match_eager(fn):
    for start in (True, False):
        out, state, args, _ = _run(fn, start, compiled=False)
        c_out, c_state, c_args, breaks = _run(fn, start, compiled=True)
        where = f"{fn.__name__}, called under grad mode {start}"
        assert c_state == state, f"{where}: (grad mode, cpu autocast) after the call: eager {state}, compiled {c_state}"
        _check_same(out, c_out, f"{where}: output")
        _check_same(args, c_args, f"{where}: inputs after the call")
        assert fn in NO_BREAK or breaks >= 1, f"{where}: no graph break"


def test_dynamo_graph_break_is_a_break():
    # an empty function: traced, it vanished, and the graph of torch.optim's step ran in one piece
    def f(x):
        y = x + 1
        gb()
        return y * 2

    report = ember.explain(f)(torch.randn(3))
    assert report.graph_count == 2 and report.graph_break_count == 1
    assert "torch._dynamo.graph_break()" in str(report.break_reasons[0])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_optimizer_step_leaves_grad_mode_on():
    # the reported case, with the default backend: SGD.step's _use_grad sets grad mode off, breaks,
    # and restores it in a finally whose graph the autograd layer ran without its mode switch
    m = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, foreach=False)
    m(torch.randn(5, 8)).sum().backward()
    step = ember.compile(opt.step)
    step()
    assert torch.is_grad_enabled()
    m(torch.randn(5, 8)).sum().backward()  # failed: "element 0 of tensors does not require grad"
    step()
    assert torch.is_grad_enabled()
