"""NumPy on tensors inside the compiled function: ``Tensor.numpy()``, ``np.*`` functions and
ufuncs, array methods and operators, dtype / finfo / iinfo, ``torch.from_numpy``; arrays come
back as arrays (and 0-d results as NumPy scalars), as in eager."""
import numpy as np
import pytest
import torch

import tests.corpus.harness as corpus_harness

from .harness import Cases, run, t

cases = Cases("numpy")
_assert_same = corpus_harness.assert_same


def _assert_same_numpy(expected, actual, path="out", *, atol=None, rtol=None):
    if isinstance(expected, (np.ndarray, np.generic)):
        assert type(actual) is type(expected), f"{path}: type {type(actual).__name__} != eager {type(expected).__name__}"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != eager {expected.dtype}"
        assert np.shape(actual) == np.shape(expected), f"{path}: shape {np.shape(actual)} != {np.shape(expected)}"
        np.testing.assert_allclose(actual, expected, rtol=rtol or 1.3e-6, atol=atol or 1e-5, err_msg=path)
        return
    if isinstance(expected, np.dtype):
        assert actual == expected, f"{path}: {actual} != eager {expected}"
        return
    _assert_same(expected, actual, path, atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _numpy_aware_compare(monkeypatch):
    monkeypatch.setattr(corpus_harness, "assert_same", _assert_same_numpy)


def x23():
    return (t(2, 3),)


@cases.case(x23)
def ufuncs_round_trip(x):
    a = x.numpy()
    return torch.from_numpy(np.sin(a) + np.exp(a) * 2), np.sqrt(np.abs(a)), np.maximum(a, 0.1)


@cases.case(x23)
def array_operators(x):
    a = x.numpy()
    b = a > 0
    n = 2.0
    n *= a  # a Python number times an array: rebinds n
    return a * 2 - a ** 2 / 3, -a, abs(a), b, b & (a < 1), ~b, a @ a.T, 1.5 - a, a // 0.5, a % 0.7, n


@cases.case(x23)
def reductions_and_methods(x):
    a = x.numpy()
    return (a.sum(), np.sum(a), a.mean(axis=0), np.max(a, axis=1), a.std(), a.T, a.reshape(-1), a[1:, ::2],
            a.argmax(), np.cumsum(a, axis=1), a.astype(np.float64))


@cases.case(x23)
def metadata(x):
    a = x.numpy()
    return x * a.shape[0], a.shape, a.ndim, a.size, a.dtype, a.itemsize, len(a)


@cases.case(x23)
def array_construction(x):
    a = x.numpy()
    return (np.concatenate([a, a]), np.stack([a, a], axis=1), np.where(a > 0, a, 0.0), np.clip(a, -0.5, 0.5),
            np.ones(3, dtype=np.float32), np.arange(4) * 1.5, np.zeros_like(a), np.linspace(0, 1, 5))


@cases.case(x23)
def dtypes_finfo_iinfo(x):
    a = x.numpy()
    eps = np.finfo(np.float32).eps
    big = np.iinfo(np.int32).max
    return x * eps + big, a.dtype == np.float32, np.dtype("float64"), np.float32(2.0) * a, eps


@cases.case(lambda: (torch.arange(6).reshape(2, 3),))
def integer_promotion(x):
    a = x.numpy()
    return a / 2, a // 2, a * 1.5, np.mean(a), (a + 1).dtype


@cases.case(lambda: (t(4, grad=True),))
def detached_numpy_then_back(x):
    a = x.detach().numpy()
    scale = torch.from_numpy(np.tanh(a))  # no gradient through numpy: a constant factor
    return x * scale


@cases.case(x23)
def numpy_force(x):
    return np.square(x.numpy(force=True)), np.pi * x


@cases.case(lambda: (np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3), t(3)))
def array_inputs(a, x):
    # an array argument is a graph input viewing the same memory; returned, it is the same object
    return np.sin(a) * 2, a, x + torch.from_numpy(a).sum(0), a.shape


@pytest.mark.parametrize("c", cases, ids=cases.ids())
def test_case(c):
    run(c)


def test_default_backend_traces_through_numpy():
    import ember

    def f(x):
        a = x.numpy()
        return torch.from_numpy(np.tanh(a) * 2 + a.mean())

    x = torch.randn(3, 4)
    torch.testing.assert_close(ember.compile(f, fullgraph=True)(x), f(x))


def test_numpy_of_a_tensor_requiring_grad_breaks_like_eager_raises():
    import ember

    def f(x):
        return np.sin(x.numpy())

    with pytest.raises(ember.CompileError, match="requires grad"):
        ember.compile(f, fullgraph=True)(torch.randn(2, requires_grad=True))


def test_array_values_into_python_still_break():
    import ember

    def f(x):
        return x * float(x.numpy().sum())

    with pytest.raises(ember.CompileError):
        ember.compile(f, fullgraph=True)(torch.randn(2))

