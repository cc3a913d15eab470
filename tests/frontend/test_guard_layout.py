"""A tensor guard checks the layout: sparse (COO, CSR) inputs never reach an entry compiled for
dense ones (a COO tensor answers stride() with zeros, as an expanded dense tensor does; CSR's raises)."""
import torch

import ember


def _eager_equal(got, want):
    got = got.to_dense() if got.layout != torch.strided else got
    want = want.to_dense() if want.layout != torch.strided else want
    return torch.equal(got, want)


def test_sparse_coo_after_expanded_dense():
    fn = lambda x: x * 2  # noqa: E731
    f = ember.compile(fn)
    d = torch.ones(1).expand(2, 2)  # strides (0, 0)
    assert torch.equal(f(d), fn(d))
    s = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([3.0, 4.0]), (2, 2))
    assert s.stride() == d.stride()  # (what made the guard take it)
    assert _eager_equal(f(s), fn(s))


def test_sparse_csr_after_dense():
    fn = lambda x: x * 2  # noqa: E731
    f = ember.compile(fn)
    x = torch.randn(2, 3)
    assert torch.equal(f(x), fn(x))
    c = torch.randn(2, 3).to_sparse_csr()
    assert _eager_equal(f(c), fn(c))


def test_guard_failure_names_the_layout():
    from ember.frontend.guards import TensorMeta
    m = TensorMeta.of(torch.ones(1).expand(2, 2))
    assert m.layout is torch.strided
    s = torch.ones(2, 2).to_sparse()
    assert TensorMeta.of(s).layout is torch.sparse_coo
