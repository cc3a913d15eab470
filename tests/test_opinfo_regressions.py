"""Regressions found by the OpInfo differential sweep (benchmarks/probes/opinfo_sweep.py): each was a
silent wrong result (or a crash) of ``ember.compile`` on CPU where eager PyTorch is right. The
default backend runs the native C++ renderer on CPU tensors."""
import pytest
import torch

import ember


def _check(fn, make):
    """fn compiled against eager on fresh copies of make()'s arguments: its result and every argument
    after the call (out= tensors, mutated inputs)."""
    args_e, args_c = make(), make()
    want = fn(*args_e)
    got = ember.compile(fn)(*args_c)
    torch.testing.assert_close(got, want, equal_nan=True)
    for c, e in zip(args_c, args_e):
        torch.testing.assert_close(c, e, equal_nan=True)


def test_out_list_returning_none_is_kept():
    # split_with_sizes_copy(out=[...]) returns None: its call was dropped as dead code and the out
    # tensors kept their old contents
    def f(x, o0, o1):
        torch.split_with_sizes_copy(x, [2, 3], 1, out=[o0, o1])
    _check(f, lambda: [torch.arange(20.0).view(4, 5), torch.zeros(4, 2), torch.zeros(4, 3)])


def test_out_tuple_result_unused_is_kept():
    # torch.max(x, 1, out=(v, i)) returns its out tensors as a tuple; unused, the call was dead code
    def f(x, v, i):
        torch.max(x, 1, out=(v, i))
        return x + 1
    _check(f, lambda: [torch.arange(20.0).view(4, 5).flip(1), torch.zeros(4), torch.zeros(4, dtype=torch.long)])


def test_out_single_result_unused_is_kept():
    def f(x, o):
        torch.sin(x, out=o)
        return x * 2
    _check(f, lambda: [torch.arange(6.0), torch.zeros(6)])


def test_linalg_check_errors_is_a_plain_call():
    # torch marks aten._linalg_check_errors effectful: functionalization threaded an effect token
    # through it, which became a graph input no caller passed ("forward() missing 1 required
    # positional argument: 'tangents_token'") for linalg.inv, solve, cholesky, lu_factor...
    x = torch.randn(5, 5) + 5 * torch.eye(5)
    b = torch.randn(5, 3)
    for fn in (torch.linalg.inv, lambda a: torch.linalg.solve(a, b) * 2,
               lambda a: torch.linalg.cholesky(a @ a.mT + torch.eye(5))):
        torch.testing.assert_close(ember.compile(fn)(x), fn(x))
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        ember.compile(fn)(xc).sum().backward()
        fn(xe).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)


def test_linalg_check_errors_still_raises():
    # the check is kept: a singular matrix raises, as in eager, instead of returning inf
    import pytest
    f = ember.compile(torch.linalg.inv)
    f(torch.eye(4))
    with pytest.raises(torch.linalg.LinAlgError):
        f(torch.zeros(4, 4))


def test_out_write_lost_in_tracing_runs_eagerly():
    # linalg.matrix_rank(x, out=o)'s composite out= overload traces to the functional op and drops
    # the write into o: compiled, o kept its old value. Such a graph now runs eagerly (aot analysis).
    def f(x, o):
        torch.linalg.matrix_rank(x, out=o)
        return x * 2
    _check(f, lambda: [torch.eye(5)[:, [0, 1, 2, 3, 3]], torch.zeros((), dtype=torch.long)])


def test_sparse_input_is_a_graph_break():
    # a sparse CSR input raised "Sparse CSR tensors do not have strides" while building its guard
    a, b = torch.randn(4, 4).to_sparse_csr(), torch.randn(4, 3)
    f = lambda a, b: torch.sparse.mm(a, b) * 2  # noqa: E731
    torch.testing.assert_close(ember.compile(f)(a, b), f(a, b))


def test_sparse_result_is_a_graph_break():
    # to_sparse inside a graph: its backward raised "unsupported memory format option Contiguous"
    f = lambda x: (x * 2).to_sparse()  # noqa: E731
    xc, xe = torch.randn(5, 5, requires_grad=True), None
    xe = xc.detach().clone().requires_grad_()
    yc, ye = ember.compile(f)(xc), f(xe)
    assert yc.layout == torch.sparse_coo
    torch.testing.assert_close(yc.to_dense(), ye.to_dense())
    yc.to_dense().pow(2).sum().backward()
    ye.to_dense().pow(2).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


def test_batch_norm_with_update_bf16_running_stats():
    # aten._batch_norm_with_update(_functional) stayed whole; its fake result says float32 running
    # statistics where the CPU kernel returns bf16 ones, which the compiled graph then read as float32:
    # running_mean/var became garbage (1e22). Now decomposed, as native_batch_norm is.
    torch.manual_seed(0)
    bf = torch.bfloat16
    make = lambda: [torch.randn(5, 5, 5).to(bf), torch.randn(5).to(bf), torch.randn(5).to(bf),  # noqa: E731
                    torch.randn(5).to(bf), (torch.rand(5) + 0.5).to(bf)]
    f = lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)[0]  # noqa: E731
    a, c = make(), make()
    for t, u in zip(a, c):
        u.copy_(t)
    want, got = f(*a), ember.compile(f)(*c)
    tol = dict(atol=1.6e-2, rtol=1.6e-2)  # one bf16 rounding: the compiled kernel rounds once, eager per op
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(c[3], a[3], **tol)
    torch.testing.assert_close(c[4], a[4], **tol)


def test_lstm_training_on_cpu_runs_eagerly_with_eagers_gradients():
    # an LSTM's CPU kernel (mkldnn_rnn_layer) returns an undefined workspace where its meta function
    # gives an empty tensor; the compiled backward crashed on it (None refused, an empty tensor
    # segfaults the op): the training graph now runs eagerly, counted as an eager fallback
    from ember.diagnostics import counters
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(2, 5, 8)

    def f(x):
        return lstm(x)[0].sum()

    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xe).backward()
    want = [xe.grad] + [p.grad.clone() for p in lstm.parameters()]
    lstm.zero_grad(set_to_none=True)
    before = counters.snapshot()
    ember.reset()
    got_loss = ember.compile(f)(xc)
    got_loss.backward()
    torch.testing.assert_close(got_loss, f(x))
    for g, w in zip([xc.grad] + [p.grad for p in lstm.parameters()], want):
        torch.testing.assert_close(g, w)
    assert (counters.snapshot() - before)["eager_fallbacks.aot_variant"] == 1
    # without gradients the same LSTM still compiles (inference has no saved workspace)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(lambda x: lstm(x)[0])(x), lstm(x)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
@pytest.mark.parametrize("n", [5, 400, 1024])
def test_sign_on_cuda(dtype, n):
    # session 40's CUDA sweep: a standalone sign/sgn kernel on bf16 answered 1.0 for every nonzero
    # element, negative ones included (an int32 select cast through float to bf16, Triton 3.6, H100)
    x = (torch.randn(n, device="cuda") * 4).to(dtype)
    if dtype.is_floating_point:
        x[:3] = torch.tensor([float("nan"), -0.0, 0.0])
    for fn in (torch.sign, torch.sgn, lambda t: torch.sign(t) * 2):
        torch.testing.assert_close(ember.compile(fn, dynamic=False)(x), fn(x), equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_negative_ints_to_half_types_on_cuda(dtype):
    # the same conversion elsewhere: int results (comparisons, integer inputs) stored as bf16/fp16
    x = torch.randint(-50, 50, (1024,), device="cuda", dtype=torch.int32)
    y = torch.randn(1024, device="cuda")
    for fn in (lambda a, b: a.to(dtype), lambda a, b: (b > 0).to(dtype) - (b < 0).to(dtype),
               lambda a, b: (a - 3).to(dtype), lambda a, b: torch.where(b > 0, a, -a).to(dtype)):
        torch.testing.assert_close(ember.compile(fn, dynamic=False)(x, y), fn(x, y))
