"""``p.grad`` of a leaf the compiled function receives: one more graph input (guarded: None, or its
metadata), read afresh at each call, where it was a graph break (torch.optim reads it for every
parameter). Writes to it, ``backward()`` and autograd.grad stay breaks, so a later read in the same
function sees the new gradient; a non-leaf's (eager warns) or an intermediate's ``.grad`` is a break.
"""
import pytest
import torch

import ember


def _leaf():
    return torch.randn(3, requires_grad=True)


def _leaf_with_grad():
    p = torch.randn(3, requires_grad=True)
    p.grad = torch.ones(3)
    return p


def read(p):
    g = p.grad
    return None if g is None else g * 2


def mutate(p):
    p.grad.mul_(2)
    return p.grad + 1


def write_then_read(p):
    a = p.grad * 1 if p.grad is not None else None
    p.grad = None
    return a, p.grad


def read_backward_read(p):
    a = p.grad.clone()
    (p * 3).sum().backward()
    return a, p.grad * 1


def replace(p):
    g = p.grad
    p.grad = g * 3
    return p.grad + g


def manual_sgd(p):
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
    return p * 1


def non_leaf(p):
    return (p * 2).grad


# (function, its argument, the graph breaks of a call, what the break is about): each read is no break
CASES = [(read, _leaf, 0, None), (read, _leaf_with_grad, 0, None), (mutate, _leaf_with_grad, 0, None),
         (write_then_read, _leaf_with_grad, 1, "setting attribute 'grad'"),
         (read_backward_read, _leaf_with_grad, 1, "backward"), (replace, _leaf_with_grad, 1, "setting attribute 'grad'"),
         (manual_sgd, _leaf_with_grad, 0, None), (non_leaf, _leaf, 1, "not a leaf")]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.detach(), b.detach()) and a.requires_grad == b.requires_grad
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fn,make,breaks,reason", CASES, ids=[f"{c[0].__name__}-{c[1].__name__.strip('_')}" for c in CASES])
def test_grad_reads_match_eager(fn, make, breaks, reason):
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        p = make()
        f = ember.compile(fn, backend="aot_eager") if compiled else fn
        runs.append([(f(p), None if p.grad is None else p.grad.clone(), p.detach().clone()) for _ in range(3)])
    for i, (e, c) in enumerate(zip(*runs)):
        assert _same(e, c), f"call {i}: eager {e}, compiled {c}"
    torch.manual_seed(0)
    report = ember.explain(fn, backend="aot_eager")(make())
    assert report.graph_break_count == breaks, report.break_reasons
    assert all(reason in str(b) for b in report.break_reasons), report.break_reasons
