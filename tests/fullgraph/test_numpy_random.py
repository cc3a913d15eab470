"""``np.random`` inside ``ember.compile(fullgraph=True)``: traced on torch's random stream, as torch.compile.

The oracle is not NumPy itself: by default (``use_numpy_random_stream=False``) compiled code draws
from torch's generator (``np.random.seed(n)`` is ``torch.manual_seed(n)``), as torch.compile does,
because NumPy's own generator (a Mersenne Twister with its own sampling algorithms) cannot be replayed
by torch ops inside a graph. So the values are checked against eager running the same code with
``np.random`` replaced by ``torch._numpy.random`` (PyTorch's NumPy-on-torch module, the one
torch.compile traces) under the same ``torch.manual_seed``: equal exactly, and so is the generator's
state afterwards. What NumPy fixes independently of the stream is checked against plain NumPy:
the returned values are NumPy arrays (or scalars) of the same types, dtypes and shapes.
With ``use_numpy_random_stream=True`` the calls are graph breaks running NumPy: equal to plain
NumPy exactly.
"""
import types

import numpy as np
import pytest
import torch
import torch._dynamo.config  # noqa: F401  (torch._numpy.random reads it at each call: imported before np.random is swapped)
import torch._numpy as tnp

import ember
from ember.testing import CompileCounter

SEED = 1234

# ---- the oracle: np.random replaced by torch._numpy.random --------------------------------------


def _to_tnp(v):
    if isinstance(v, np.ndarray):
        return tnp.ndarray(torch.from_numpy(v))  # the same memory: shuffle changes the caller's array
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tnp(i) for i in v)
    return v


def _to_np(v):
    return v.tensor.numpy() if isinstance(v, tnp.ndarray) else v


def _torch_stream_function(name):
    def call(*args, **kwargs):
        return _to_np(getattr(tnp.random, name)(*_to_tnp(args), **{k: _to_tnp(w) for k, w in kwargs.items()}))
    return call


_TORCH_STREAM = types.ModuleType("torch_stream_random")
_TORCH_STREAM.__dict__.update({n: _torch_stream_function(n) for n in (
    "seed", "rand", "randn", "random", "random_sample", "sample", "uniform", "normal", "randint", "choice",
    "shuffle")})


def oracle(fn, *args):
    """``fn(*args)`` eagerly, its np.random calls on torch's stream (torch._numpy.random)."""
    saved = np.random
    np.random = _TORCH_STREAM
    try:
        return fn(*args)
    finally:
        np.random = saved


# ---- comparisons ------------------------------------------------------------------------------


def assert_equal(expected, actual, path="out"):
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{path}: {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)}"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=path)
    elif isinstance(expected, np.ndarray):
        assert type(actual) is np.ndarray, f"{path}: {type(actual).__name__}, eager gives an array"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, f"{path}: {actual!r}"
        np.testing.assert_array_equal(actual, expected, err_msg=path)
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_like_numpy(numpy_result, actual, path="out"):
    """Types, dtypes and shapes as plain NumPy gives them (its values are its own stream's)."""
    if isinstance(numpy_result, (tuple, list)):
        for i, (e, a) in enumerate(zip(numpy_result, actual)):
            assert_like_numpy(e, a, f"{path}[{i}]")
    elif isinstance(numpy_result, np.ndarray):
        assert type(actual) is np.ndarray, f"{path}: {type(actual).__name__}, NumPy gives an array"
        assert (actual.dtype, actual.shape) == (numpy_result.dtype, numpy_result.shape), path
    elif isinstance(numpy_result, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and (actual.dtype, actual.shape) == (numpy_result.dtype,
                                                                                    numpy_result.shape), path


def _fresh(make):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in make()]


def check(fn, make_inputs=lambda: (torch.zeros(3, dtype=torch.float64),), backend="eager"):
    """fullgraph=True, one graph; equal to the torch-stream oracle (values, mutated inputs, the
    generator's state after), on two calls (the second a cache hit); like NumPy in types/shapes."""
    cnt = CompileCounter()
    compiled = ember.compile(fn, backend=cnt if backend == "eager" else backend, fullgraph=True)
    for call in range(2):
        torch.manual_seed(SEED + call)
        inputs_e = _fresh(make_inputs)
        expected = oracle(fn, *inputs_e)
        after_e = torch.rand(4)
        torch.manual_seed(SEED + call)
        inputs_c = _fresh(make_inputs)
        actual = compiled(*inputs_c)
        after_c = torch.rand(4)
        assert_equal(expected, actual)
        assert_equal(inputs_e, inputs_c, "inputs after the call")
        torch.testing.assert_close(after_c, after_e, rtol=0, atol=0, msg="the generator's state after the call")
    if backend == "eager":
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs, expected one"
    np.random.seed(0)
    assert_like_numpy(fn(*_fresh(make_inputs)), actual)
    return actual


# ---- the cases ------------------------------------------------------------------------------


def seed_then_rand(x):
    np.random.seed(0)
    a = np.random.rand(3)
    return x + torch.from_numpy(a)


def every_draw(x):
    np.random.seed(7)
    return (np.random.rand(2, 3), np.random.randn(4), np.random.random((2,)), np.random.random_sample(size=3),
            np.random.sample(2), np.random.uniform(-1.0, 2.0, size=(2, 2)), np.random.normal(1.0, 0.5, 3),
            np.random.randint(10, size=5), np.random.randint(-3, 3, size=(2, 2)), np.random.choice(6, 4),
            np.random.choice(np.arange(5.0) * 2, (2, 2), replace=False))


def draws_without_seed(x):
    # no seed: the draws continue the stream the caller left (torch.manual_seed before each call)
    return x * torch.from_numpy(np.random.rand(3)), np.random.randint(0, 100, size=(3,))


def shuffle_an_input(x):
    a = x.numpy()
    np.random.shuffle(a)  # in place: x changes too (they share memory, in eager as in the graph)
    return torch.from_numpy(a) * 2, x.sum()


def unused_draw_still_advances(x):
    np.random.rand(5)  # unused, but the next draw's numbers depend on it
    return x + torch.from_numpy(np.random.rand(3))


def seed_from_argument(x, s):
    np.random.seed(s)
    return np.random.normal(size=(2,)) + x.numpy()


def two_seeds_before_draws(x):
    np.random.seed(1)
    np.random.seed(2)  # the last one counts
    return np.random.rand(2)


CASES = [seed_then_rand, every_draw, draws_without_seed, unused_draw_still_advances, two_seeds_before_draws]


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_case(fn):
    check(fn)


def test_shuffle_mutates_the_input():
    check(shuffle_an_input, lambda: (torch.arange(6, dtype=torch.float64),))


def test_seed_from_an_argument_is_guarded():
    check(seed_from_argument, lambda: (torch.zeros(2, dtype=torch.float64), 3))
    check(seed_from_argument, lambda: (torch.zeros(2, dtype=torch.float64), 4))


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_backends_keep_the_stream(backend):
    # the backends trace the draws into ATen random ops and keep their order (native scheduler);
    # the seed still runs on the second call (a seed traced into the graph would be dropped by them)
    check(every_draw, backend=backend)
    check(shuffle_an_input, lambda: (torch.arange(6, dtype=torch.float64),), backend=backend)


def test_issue_example_equals_torch_manual_seed_stream():
    # the numbers are torch.manual_seed(0)'s (float64), not NumPy's seed(0) numbers
    out = ember.compile(seed_then_rand, fullgraph=True, backend="eager")(torch.zeros(3, dtype=torch.float64))
    torch.manual_seed(0)
    torch.testing.assert_close(out, torch.empty(3, dtype=torch.float64).uniform_(), rtol=0, atol=0)
    np.random.seed(0)
    assert not np.allclose(out.numpy(), np.random.rand(3))


def test_seed_is_no_graph_break():
    report = ember.explain(seed_then_rand)(torch.zeros(3, dtype=torch.float64))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


# ---- what breaks, and what a break runs ---------------------------------------------------------


def scalar_draw(x):
    return x + np.random.rand()


def seed_after_draw(x):
    np.random.seed(0)
    a = np.random.rand(2)
    np.random.seed(0)
    return a, np.random.rand(2)


def choice_with_p(x):
    return x + torch.from_numpy(np.random.choice(np.arange(3.0), 3, p=[0.5, 0.25, 0.25]))


@pytest.mark.parametrize("fn, match", [(scalar_draw, "without a size"), (seed_after_draw, "after a random draw"),
                                       (choice_with_p, "probabilities")], ids=lambda v: getattr(v, "__name__", v))
def test_breaks_run_the_draw_on_torch_stream(fn, match):
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ember.CompileError, match=match):
        ember.compile(fn, backend="eager", fullgraph=True)(x)
    compiled = ember.compile(fn, backend="eager")
    for _ in range(2):
        torch.manual_seed(SEED)
        expected = oracle(fn, x.clone())
        torch.manual_seed(SEED)
        assert_equal(expected, compiled(x.clone()))


def test_numpy_stream_setting_breaks_and_equals_numpy(monkeypatch):
    monkeypatch.setattr(ember.config, "use_numpy_random_stream", True)
    x = torch.zeros(3, dtype=torch.float64)
    for fn in (seed_then_rand, every_draw):
        compiled = ember.compile(fn, backend="eager")
        np.random.seed(5)
        expected = fn(x.clone())
        np.random.seed(5)
        assert_equal(expected, compiled(x.clone()))
        with pytest.raises(ember.CompileError):
            ember.compile(fn, backend="eager", fullgraph=True)(x)
    np.random.seed(5)
    a = np.arange(6.0)
    expected = a.copy()
    np.random.shuffle(expected)
    np.random.seed(5)
    ember.compile(lambda v: np.random.shuffle(v.numpy()), backend="eager")(torch.from_numpy(a))
    np.testing.assert_array_equal(a, expected)


def test_config_setting_is_documented():
    from ember.config import markdown_table

    assert "`use_numpy_random_stream` | `False`" in markdown_table()


def choice_with_p_positional(x):
    return x + torch.from_numpy(np.random.choice(3, 3, True, [0.5, 0.25, 0.25]).astype(np.float64))


def choice_of_a_2d_array(x):
    return np.random.choice(np.ones((2, 2)), 2)


def test_choice_with_p_positional_breaks_and_matches():
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ember.CompileError, match="probabilities"):
        ember.compile(choice_with_p_positional, backend="eager", fullgraph=True)(x)
    torch.manual_seed(SEED)
    expected = oracle(choice_with_p_positional, x)
    torch.manual_seed(SEED)
    assert_equal(expected, ember.compile(choice_with_p_positional, backend="eager")(x))


def test_choice_of_a_2d_array_raises_like_numpy():
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ember.CompileError, match="1-d"):
        ember.compile(choice_of_a_2d_array, backend="eager", fullgraph=True)(x)
    with pytest.raises(ValueError):
        ember.compile(choice_of_a_2d_array, backend="eager")(x)
