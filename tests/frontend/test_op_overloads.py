"""Operators called directly (``torch.ops.<namespace>.<op>[.<overload>]``) are graph operations."""
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

import ember

_LIB = torch.library.Library("embertest_ops", "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")


@torch.library.register_fake("embertest_ops::twice")
def _twice_fake(x):
    return torch.empty_like(x)


def _in_one_graph(fn, *args):
    report = ember.explain(fn)(*args)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons
    return report.out


def test_aten_overloads_and_packets():
    def f(x, y):
        a = torch.ops.aten.add.Tensor(x, y)
        b = torch.ops.aten.mul(a, 2)
        return torch.ops.aten.sum.default(b)

    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(_in_one_graph(f, x, y), f(x, y))
    torch.testing.assert_close(ember.compile(f)(x, y), f(x, y))  # through the default backend too


def test_quantized_decomposed_and_custom_ops():
    def f(x):
        q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        d = torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.1, 0, -128, 127, torch.int8)
        return torch.ops.embertest_ops.twice(d) + 1

    x = torch.randn(8)
    torch.testing.assert_close(_in_one_graph(f, x), f(x))


def test_mutating_overload_is_kept():
    def f(x):
        torch.ops.aten.add_.Tensor(x, 1)
        return x * 2

    x = torch.zeros(2)
    out = _in_one_graph(f, x)
    assert torch.equal(x, torch.ones(2)) and torch.equal(out, torch.full((2,), 2.0))
