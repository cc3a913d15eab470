"""``torch._C._group_tensors_by_device_and_dtype`` (torch's foreach grouping: clip_grad_norm_,
clip_grad_value_, optimizers' foreach paths) is traced through its Python equivalent
(``ember/frontend/polyfills/foreach.py``); the C binding cannot run on fake tensors and was a break
in every call of ``torch.utils._foreach_utils._group_tensors_by_device_and_dtype``."""
import pytest
import torch

import ember
from ember.frontend.polyfills.foreach import group_tensors_by_device_and_dtype as polyfill


def _inputs():
    torch.manual_seed(0)
    p32 = [torch.randn(3), torch.randn(2, 2)]
    p64 = [torch.randn(4, dtype=torch.float64)]
    params = [p32[0], p64[0], p32[1]]
    grads = [torch.randn_like(p) for p in params]
    steps = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]  # float32 steps, float64 params too
    return [
        ([params, grads], False),
        ([params, grads, steps], True),
        ([params, [], [grads[0], None, grads[2]]], True),  # an empty list, a missing tensor
    ]


def _canon(grouped):
    """The grouping as comparable data, tensors by identity; groups in key order (the C binding's
    dict comes in its hash map's order)."""
    return sorted(((str(k), [[None if t is None else id(t) for t in lst] for lst in lists], list(idx))
                   for k, (lists, idx) in grouped.items()), key=lambda g: g[0])


@pytest.mark.parametrize("case", range(3))
def test_polyfill_groups_as_the_c_binding(case):
    lists, with_indices = _inputs()[case]
    assert _canon(polyfill(lists, with_indices)) == _canon(torch._C._group_tensors_by_device_and_dtype(lists, with_indices))


def test_polyfill_refuses_what_the_c_binding_refuses():
    a, b = torch.randn(2), torch.zeros(2, dtype=torch.int64)
    for lists in ([[a], [b]], [[None]], [[]]):
        with pytest.raises(RuntimeError):
            torch._C._group_tensors_by_device_and_dtype(lists, False)
        with pytest.raises(RuntimeError):
            polyfill(lists, False)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for_loop"])
def test_clip_grad_norm_stays_in_the_graph(foreach):
    def clip(params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)

    def world():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3).double())
        m[1](m[0](torch.randn(4, 6)).double()).sum().backward()
        return list(m.parameters())

    ps_e, ps_c = world(), world()
    expected = clip(ps_e, 0.5)
    report = ember.explain(clip, backend="aot_eager")(ps_c, 0.5)
    assert torch.equal(report.out, expected)
    for p, q in zip(ps_e, ps_c):
        assert torch.equal(p.grad, q.grad)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons
