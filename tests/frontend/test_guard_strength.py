"""Each guard, checked by what goes wrong without it: a cache entry reused for inputs its graph was
not traced for gives a result different from eager. Every test calls the compiled function with
inputs that differ in exactly one guarded property and compares every call with eager (values,
dtypes, requires_grad, mutated inputs). These are the tests that kill the guard mutants of
tools/mutation.py."""
import pytest
import torch
import torch.nn as nn

import ember
from ember.testing import CompileCounter, cache_of


def _same(actual, expected):
    if isinstance(expected, dict):
        assert list(actual) == list(expected), (list(actual), list(expected))
        return _same(list(actual.values()), list(expected.values()))
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), (actual, expected)
        for a, e in zip(actual, expected):
            _same(a, e)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), actual
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        assert actual.requires_grad == expected.requires_grad, "requires_grad differs from eager"
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        return
    assert type(actual) is type(expected) and actual == expected, (actual, expected)


def _twin(t):
    """A copy with t's exact layout (sizes, strides, storage offset): ``clone`` would make strided
    and overlapping views contiguous, which is the very difference these tests are about."""
    storage = t.detach().untyped_storage().clone()
    twin = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())
    return twin.requires_grad_(t.requires_grad)


def _clone(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(_twin(a))
        elif isinstance(a, list):
            out.append(_clone(a))
        elif isinstance(a, dict):
            out.append(dict(zip(a, _clone(list(a.values())))))
        else:
            out.append(a)
    return out


def _run_all(fn, calls, backend=None, **kw):
    """Compile fn once; each call's result (and each input afterwards) must equal eager's."""
    counter = CompileCounter() if backend is None else None
    compiled = ember.compile(fn, backend=backend or counter, **kw)
    for args in calls:
        eager_args, comp_args = _clone(args), _clone(args)
        assert [a.stride() for a in comp_args if isinstance(a, torch.Tensor)] == \
            [a.stride() for a in args if isinstance(a, torch.Tensor)]
        expected = fn(*eager_args)
        actual = compiled(*comp_args)
        _same(actual, expected)
        _same(comp_args, eager_args)
    return compiled


# ---- tensor guard: stride ------------------------------------------------------------------------
def _contiguity_branch(x):
    if x.is_contiguous():
        return x * 2
    return x * 3


def _stride_value(x):
    return x * x.stride(0) + x.stride(1)


@pytest.mark.parametrize("fn", [_contiguity_branch, _stride_value], ids=["is_contiguous", "stride"])
def test_same_shape_other_strides_are_not_reused(fn):
    """A contiguous copy of a transposed tensor and the transposed view itself: same shape, other
    strides. A graph specialised on the first layout is wrong for the second."""
    base = torch.randn(5, 5)
    view = base.t()
    compiled = _run_all(fn, [(view.contiguous(),), (view,), (base[:, ::2][:3].contiguous(),), (base[::2, ::2],)])
    assert cache_of(compiled).compile_count >= 3, cache_of(compiled).recompile_reasons


def test_strided_view_through_the_default_backend():
    """The default (native) backend generates code for the input's strides: a view with the same
    shape must not run a kernel compiled for the contiguous layout."""
    def fn(x):
        return x.sin() * 2 + x.sum(0)
    base = torch.randn(6, 6)
    _run_all(fn, [(base.t().contiguous(),), (base.t(),), (torch.randn(6, 12)[:, ::2],)], backend="ember")


def test_dynamic_shapes_keep_static_strides():
    """With dynamic shapes the sizes are symbols and the SHAPE guard relates the strides to them
    (stride(0) == size(1)); the static unit stride is checked by the tensor guard. Overlapping
    views with stride(0) == size(1) but stride(1) == 2 pass the first and must fail the second;
    a column slice (stride(0) == 6 != size(1)) must fail the first."""
    calls = [(torch.randn(4, 3),), (torch.randn(5, 3),), (torch.randn(20).as_strided((5, 3), (3, 2)),),
             (torch.randn(30).as_strided((6, 3), (3, 2)),), (torch.randn(5, 6)[:, :3],)]
    _run_all(_contiguity_branch, calls, dynamic=True)


# ---- tensor guard: dtype and requires_grad ----------------------------------------------------------
def test_dtype_baked_into_the_graph():
    def fn(x):
        return torch.ones(3, dtype=x.dtype) * x.sum()
    _run_all(fn, [(torch.randn(4),), (torch.randn(4, dtype=torch.float64),), (torch.randn(4, dtype=torch.float16),)])


def _grad_branch(x, w):
    if w.requires_grad:
        return (x * w).sum(0)
    return x.sum(0)


@pytest.mark.parametrize("fn,backend", [(_grad_branch, None), (lambda x, w: (x * w).sum(0), "aot_eager")],
                         ids=["python-branch", "aot_eager"])
def test_requires_grad_change(fn, backend):
    """A graph traced for an input needing no gradient (a Python branch on requires_grad, an
    inference-only compiled graph) must not serve one that needs it, and the other way round."""
    x = torch.randn(3, 4)
    calls = [(x, torch.randn(4)), (x, torch.randn(4).requires_grad_()), (x, torch.randn(4))]
    compiled = _run_all(fn, calls, backend=backend)
    w = torch.randn(4, requires_grad=True)
    compiled(x, w).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0))


# ---- module hooks ----------------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


@pytest.mark.parametrize("kind", ["pre", "post"])
def test_hook_added_after_the_first_compile_runs(kind):
    torch.manual_seed(0)
    net = _Net()
    compiled = ember.compile(net, backend=CompileCounter())
    x = torch.randn(2, 4)
    _same(compiled(x), net(x))
    if kind == "pre":
        handle = net.register_forward_pre_hook(lambda mod, args: (args[0] * 10 - 1,))
    else:
        handle = net.register_forward_hook(lambda mod, args, out: out * 10 - 1)
    _same(compiled(x), net(x))
    handle.remove()  # and the hookless entry serves again, with the hookless result
    _same(compiled(x), net(x))


# ---- Python constants: type and value ----------------------------------------------------------------
def _scale(x, s):
    return x * s, torch.full((2,), s)


@pytest.mark.parametrize("values", [(1, 1.0), (1.0, 1), (2, 2.0, True), (0, False, 0.0), (3, 4)],
                         ids=["int-float", "float-int", "int-float-bool", "zero-false-float", "values"])
def test_constants_of_equal_value_and_other_type(values):
    """1 == 1.0 == True, but an int scalar keeps an int tensor int, a float one makes it float."""
    x = torch.arange(4)
    _run_all(_scale, [(x, v) for v in values])


@pytest.mark.parametrize("backend", [None, "ember"], ids=["counter", "default"])
def test_signed_zero_is_another_constant(backend):
    """-0.0 == 0.0, but 1 / (x * 0 + s) tells them apart (and the native code keeps the sign)."""
    x = torch.tensor([-1.0, 2.0, -3.0])
    _run_all(lambda x, s: 1 / (x * 0 + s), [(x, 0.0), (x, -0.0), (x, 0.0)], backend=backend)


def test_set_constants_of_equal_value_and_other_type():
    """A CONST guard on a whole container (a set; a nested function's defaults:
    test_nested_function_guards.py) compares the items' types too: {1, 2} == {1.0, 2.0}."""
    _run_all(lambda x, s: x * sum(s), [(torch.arange(4), {1, 2}), (torch.arange(4), {1.0, 2.0})])


# ---- containers: length, dict key order ----------------------------------------------------------------
def test_longer_list_is_not_served_by_the_shorter_graph():
    def fn(xs):
        total = xs[0]
        for t in xs[1:]:
            total = total + t
        return total
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    _run_all(fn, [([a, b],), ([a, b, c],), ([a],)])


def test_dict_key_order_is_part_of_the_graph():
    def fn(d):
        return torch.cat([v * (i + 1) for i, v in enumerate(d.values())]), list(d)
    x, y = torch.randn(2), torch.randn(3)
    _run_all(fn, [({"a": x, "b": y},), ({"b": y, "a": x},)])


# ---- aliasing --------------------------------------------------------------------------------------
def test_aliased_inputs_do_not_share_an_entry_with_distinct_ones():
    def fn(x, y):
        x.add_(1)
        return y * 2

    compiled = ember.compile(fn, backend=CompileCounter())
    for same in (True, False, True):
        a, b = torch.zeros(3), torch.zeros(3)
        ea, eb = torch.zeros(3), torch.zeros(3)
        expected = fn(ea, ea if same else eb)
        actual = compiled(a, a if same else b)
        _same(actual, expected)
        _same(a, ea)


# ---- global state ------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", [None, "aot_eager"], ids=["fx", "aot_eager"])
def test_default_dtype_change(backend):
    """``torch.ones(3)`` follows the default dtype; a traced ATen graph has float32 written into it."""
    def fn(x):
        return torch.ones(3) + x.sum()
    compiled = ember.compile(fn, backend=backend or CompileCounter())
    x = torch.randn(3)
    _same(compiled(x), fn(x))
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _same(compiled(x), fn(x))
    finally:
        torch.set_default_dtype(saved)
    _same(compiled(x), fn(x))
