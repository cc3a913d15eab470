"""A loop that breaks runs as Python, but what it calls is still compiled on its own (torch.compile's
frame hook gets this for free; ember rewrites the loads of called objects in the native region)."""
import io
import contextlib

import torch

import ember
from ember.testing import CompileCounter


class _Printing(torch.nn.Module):
    def forward(self, x):
        print("printing layer", tuple(x.shape))
        return x * 1.5


def _helper(v):
    return torch.tanh(v) + 1


def test_layers_called_by_a_breaking_loop_are_compiled():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), _Printing(), torch.nn.Linear(4, 2))
    cnt = CompileCounter()
    compiled = ember.compile(model, backend=cnt)
    for n in (2, 2, 5):
        x = torch.randn(n, 3)
        out_e, out_c = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_e):
            expected = model(x)
        with contextlib.redirect_stdout(out_c):
            actual = compiled(x)
        torch.testing.assert_close(actual, expected)
        assert out_c.getvalue() == out_e.getvalue()
    assert cnt.frame_count >= 3  # the two Linear layers and ReLU, each its own graph


def test_functions_and_methods_called_in_a_breaking_loop_are_compiled():
    class Acc:
        def __init__(self):
            self.total = 0.0

        def add(self, t):
            self.total += float(t.sum())  # .item()-like: breaks inside the method too
            return t * 2

    def f(xs):
        acc = Acc()
        outs = []
        for x in xs:
            y = _helper(x)
            if y.sum() > 0:  # a data-dependent branch: the loop runs as Python
                outs.append(acc.add(y))
        return outs, acc.total

    xs = [torch.randn(3) for _ in range(4)]
    cnt = CompileCounter()
    got = ember.compile(f, backend=cnt)(xs)
    want = f(xs)
    assert got[1] == want[1]
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    assert cnt.frame_count >= 2  # _helper and Acc.add compiled on their own
