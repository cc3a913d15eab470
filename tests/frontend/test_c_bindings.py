"""``torch._C`` bindings that act on a tensor's raw data outside the dispatcher (trace_rules.
bypasses_dispatcher) are graph breaks: on the fake tensors of a trace they would read placeholders
or launch device code on null pointers. Each case is checked against eager, and the graph count
shows the break happened where it must (and not for the metadata-only binding the foreach
optimizers use)."""
import pytest
import torch

import ember
from ember.diagnostics import counters


def _graphs() -> int:
    return counters.compiled_snapshot()["graphs_compiled"]


def test_data_address_is_the_real_tensors():
    def f(x):
        return x + 1, torch._C._data_address(x)

    g = ember.compile(f)
    for _ in range(2):
        x = torch.randn(4)
        out, addr = g(x)
        # the fake tensor's address is 0: before the break, every call answered 0
        assert addr == x.data_ptr() != 0
        torch.testing.assert_close(out, x + 1)


def test_increment_version_reaches_the_real_tensor():
    def f(x):
        torch._C._increment_version(x)
        return x * 2, x._version

    x = torch.randn(3)
    y = x.clone()
    got = ember.compile(f)(x)
    want = f(y)
    assert got[1] == want[1] and x._version == y._version  # the traced call bumped only a fake's version
    torch.testing.assert_close(got[0], want[0])


def test_grouping_binding_returns_the_callers_tensors():
    # torch.optim's foreach grouping: traced, it handed a FakeTensor back to the caller
    def f(a, b):
        groups = torch._C._group_tensors_by_device_and_dtype([[a, b]], False)
        _, (lists, _) = next(iter(groups.items()))
        ta, tb = lists[0]
        return ta * 2 + tb

    a, b = torch.randn(3), torch.randn(3)
    got = ember.compile(f)(a, b)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, a * 2 + b)


def test_tensor_free_c_bindings_stay_in_the_graph():
    def f(x):
        if torch._C._get_cudnn_enabled():
            return x.sin() + 1
        return x.cos()

    x = torch.randn(5)
    before = _graphs()
    torch.testing.assert_close(ember.compile(f)(x), f(x))
    assert _graphs() - before == 1


def test_has_torch_function_stays_in_the_graph():
    # torch.overrides.has_torch_function* are torch._C bindings too, but read only types
    def f(x, y):
        z = x * 2  # (work on both sides of the call: a break there would make two graphs)
        if torch.overrides.has_torch_function((x, y)) or torch.overrides.has_torch_function_unary(x) \
                or torch.overrides.has_torch_function_variadic(x, y):
            return z - y
        return z + y

    x, y = torch.randn(3), torch.randn(3)
    before = _graphs()
    torch.testing.assert_close(ember.compile(f)(x, y), x * 2 + y)
    assert _graphs() - before == 1


@pytest.mark.gpu
def test_jiterator_runs_eagerly_on_cuda():
    # session 40's CUDA OpInfo sweep: every jiterator_* op crashed the process with an illegal memory
    # access (the jitted kernel was launched on the fake tensors' null pointers while tracing)
    fn = torch.cuda.jiterator._create_jit_fn("template <typename T> T my_op(T x, T y, T a) { return -x * y + x - y + a; }",
                                             a=1.5)

    def f(x, y):
        return fn(x.sin(), y, a=2.0) * 3

    x, y = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    got = ember.compile(f)(x, y)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, f(x, y))
