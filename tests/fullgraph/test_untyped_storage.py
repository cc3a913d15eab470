"""``Tensor.untyped_storage()``: its size is answered while tracing (under a guard on the inputs'
storage sizes); reading its data stays a break."""
import pytest
import torch

from .harness import Cases, run, t

cases = Cases("untyped_storage")


@cases.case(lambda: (t(4, 3),))
def input_storage_size(x):
    s = x.untyped_storage()
    return x * s.nbytes(), s.size(), len(s), s.device, s.element_size()


@cases.case(lambda: (t(4, 3),))
def intermediate_storage_size(x):
    y = torch.cat([x, x])  # a fresh tensor
    v = y[1:3]  # a view: its storage is y's
    return v * y.untyped_storage().nbytes() + v.untyped_storage().nbytes()


@cases.case(lambda: (t(6, 4)[1:3],))
def view_input_storage_size(x):
    # a view of a larger tensor: the storage is the base's, not x.numel() * itemsize
    return x + x.untyped_storage().nbytes() / (x.numel() * x.element_size())


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_storage_size_is_guarded():
    import ember
    from ember.testing import CompileCounter

    def f(x):
        return x * x.untyped_storage().nbytes()

    cnt = CompileCounter()
    cf = ember.compile(f, backend=cnt, fullgraph=True)
    small = torch.randn(2, 3)
    view = torch.randn(5, 3)[1:3]  # same shape and strides, bigger storage
    torch.testing.assert_close(cf(small), f(small))
    torch.testing.assert_close(cf(view), f(view))
    assert cnt.frame_count == 2


def test_storage_data_ptr_still_breaks():
    import ember

    def f(x):
        return x + x.untyped_storage().data_ptr() % 2

    with pytest.raises(ember.CompileError, match="UntypedStorage.data_ptr"):
        ember.compile(f, fullgraph=True)(torch.randn(2))
