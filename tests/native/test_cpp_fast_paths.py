"""The C++ renderer's fast paths against eager: vectorized reductions with tails that are not a
multiple of the vector width, softmax rows of -inf/NaN/huge values, Welford statistics, row-invariant
divisions done as a reciprocal, and large CPU buffers pooled across calls (cpu_pool)."""
import gc

import pytest
import torch
import torch.nn.functional as F

import ember.config

from ember.native import compile_aten_graph, cpu_pool
from tests.native.harness import compare, trace
from tests.native.test_cpp import CPP, run_cpp

pytestmark = pytest.mark.skipif(not any(map(__import__("shutil").which, ("c++", "g++"))), reason="no C++ compiler")

@pytest.fixture(autouse=True, params=["auto", "portable"])
def cpu_simd(request, monkeypatch):
    """Every fast path twice: with the explicit AVX-512 loops (cpp_vector; on a CPU without avx512f
    'auto' is scalar C++ too) and with the scalar C++ loops only."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", request.param)
    return request.param


# odd widths: below one vector, one vector plus a tail, several vectors plus a tail, and a looped row
WIDTHS = [1, 7, 17, 100, 1023, 9000]


@pytest.mark.parametrize("n", WIDTHS)
def test_softmax_odd_widths(n, native_cache):
    run_cpp(lambda x: torch.softmax(x * 0.5, -1), [torch.randn(5, n) * 10], native_cache)


@pytest.mark.parametrize("n", WIDTHS)
def test_layer_norm_gelu_odd_widths(n, native_cache):
    w, b = torch.randn(n), torch.randn(n)
    run_cpp(lambda x, w, b: F.gelu(F.layer_norm(x, (n,), w, b)), [torch.randn(6, n), w, b], native_cache,
            atol=1e-5, rtol=1e-4)


def test_softmax_special_rows(native_cache):
    """All -inf (NaN in eager), a NaN, +inf, huge and tiny values, a single finite value."""
    x = torch.randn(8, 37)
    x[0] = float("-inf")
    x[1, 5] = float("nan")
    x[2, 3] = float("inf")
    x[3] = torch.linspace(-3e38, 3e38, 37)
    x[4] = 1e-40
    x[5] = float("-inf")
    x[5, 30] = 2.0
    x[6] = torch.randn(37) * 1e4
    x[7, :20] = -200.0  # exp underflows to subnormal / zero next to a large max
    run_cpp(lambda x: torch.softmax(x, -1), [x], native_cache)
    run_cpp(lambda x: torch.log_softmax(x, -1), [x], native_cache)


def _compiled(fn, inputs, native_cache):
    compiled = compile_aten_graph(trace(fn, inputs), inputs, options={**CPP, "cache_dir": native_cache})
    assert compiled.ember_native["reason"] is None
    return compiled


@pytest.mark.parametrize("offset", [0.0, 1e4, -3e5])
@pytest.mark.parametrize("n", [300, 4099])
def test_welford_statistics_far_from_zero(offset, n, native_cache):
    """Rows far from zero: a running sum (or sum of squares) loses digits that eager's Welford keeps.
    Against float64: the C++ path's mean, variance and layer_norm stay within 2x eager's own error."""
    torch.manual_seed(0)
    x = torch.randn(7, n) + offset
    exact_v, exact_m = torch.var_mean(x.double(), -1)
    v, m = _compiled(lambda x: torch.var_mean(x, -1), [x], native_cache)(x)
    ev, em = torch.var_mean(x, -1)
    err = lambda got, exact: (got.double() - exact).abs().max().item()  # noqa: E731
    # the variance (~1) to 1e-6 (a two-pass float sum misses by ~2e-6 at 1e4, a sum of squares by ~10);
    # the mean to rounding at the data's magnitude
    assert err(v, exact_v) <= 2 * err(ev, exact_v) + 1e-6 * exact_v.abs().max().item()
    assert err(m, exact_m) <= 2 * err(em, exact_m) + 2 * 2 ** -23 * x.abs().max().item()
    ln = lambda x: F.layer_norm(x, (n,))  # noqa: E731
    out = _compiled(ln, [x], native_cache)(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    exact = ln(x.double())
    assert (out.double() - exact).abs().max() <= 2 * (ln(x).double() - exact).abs().max() + 1e-5


def test_welford_kernel_is_one_pass(native_cache, monkeypatch, cpu_simd):
    if cpu_simd != "portable":
        pytest.skip("counts the scalar loops (test_cpp_vector.py counts the V ones)")
    from ember.native import cpp_build
    sources = []
    real = cpp_build.write_source
    monkeypatch.setattr(cpp_build, "write_source", lambda text, base=None: sources.append(text) or real(text, base))
    run_cpp(lambda x: F.layer_norm(x, (100,)), [torch.randn(3, 100)], native_cache, atol=1e-5, rtol=1e-5)
    kernel = sources[-1].split("// cpp_red")[-1]
    assert "e_welford_lanes" in kernel and kernel.count("for (int64_t v1") == 2  # the tail and the normalize


def test_welford_rows_with_inf_and_nan(native_cache):
    x = torch.randn(5, 70)
    x[0, 3] = float("inf")
    x[1, 0] = float("-inf")
    x[2, 9] = float("nan")
    x[3, 0], x[3, 1] = float("inf"), float("-inf")
    x[4] = 3e38  # huge but finite: the mean stays finite
    run_cpp(lambda x: torch.var_mean(x, -1), [x], native_cache)
    run_cpp(lambda x: F.layer_norm(x, (70,)), [x], native_cache)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_softmax_and_layer_norm(dtype, native_cache):
    x = (torch.randn(9, 133) * 4).to(dtype)
    run_cpp(lambda x: torch.softmax(x, -1), [x], native_cache)
    run_cpp(lambda x: F.layer_norm(x, (133,)), [x], native_cache)


def test_int_reductions(native_cache):
    x = torch.randint(-1000, 1000, (6, 77), dtype=torch.int32)
    run_cpp(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1), x.argmax(-1)), [x], native_cache)
    run_cpp(lambda x: (x.to(torch.int64) * 3).sum(-1), [x], native_cache)


def test_row_invariant_division_is_a_multiply(native_cache, monkeypatch):
    """x / x.sum(-1, keepdim=True): one reciprocal per row (within an ulp of eager's division)."""
    from ember.native import cpp_build
    sources = []
    real = cpp_build.write_source
    monkeypatch.setattr(cpp_build, "write_source", lambda text, base=None: sources.append(text) or real(text, base))
    run_cpp(lambda x: x / x.sum(-1, keepdim=True), [torch.rand(5, 50) + 0.1], native_cache)
    kernel = sources[-1].split("// cpp_red")[-1]
    assert "/ acc" in kernel or "1.0f /" in kernel
    loop = kernel.split("for (int64_t v1")[-1]
    assert " / " not in loop  # the last loop (the division) multiplies


def _pooled_fn(native_cache, monkeypatch):
    monkeypatch.setattr(cpu_pool, "POOL_MIN_BYTES", 1)
    fn = lambda x: torch.softmax(x, -1) * 2  # noqa: E731
    x = torch.randn(64, 256)
    gm = trace(fn, [x])
    compiled = compile_aten_graph(gm, [x], options={**CPP, "cache_dir": native_cache})
    assert compiled.ember_native["reason"] is None
    return fn, x, compiled


def test_pool_reuses_a_dropped_result(native_cache, monkeypatch):
    fn, x, compiled = _pooled_fn(native_cache, monkeypatch)
    out = compiled(x)
    ptr = out.data_ptr()
    del out
    gc.collect()
    again = compiled(x * 3)
    assert again.data_ptr() == ptr  # the storage came back from the pool
    compare(again, fn(x * 3))


def test_pool_never_overwrites_a_held_result(native_cache, monkeypatch):
    """A result the caller holds (itself, a view of it, or its storage) is never handed out again."""
    fn, x, compiled = _pooled_fn(native_cache, monkeypatch)
    held = []
    for i in range(5):
        out = compiled(x + i)
        kind = i % 3
        held.append(out if kind == 0 else out[1:] if kind == 1 else (out.untyped_storage(), out.clone()))
        del out
    ptrs = set()
    for i, h in enumerate(held):
        t = h[1] if isinstance(h, tuple) else h
        compare(t, fn(x + i)[1:] if i % 3 == 1 else fn(x + i))
        if isinstance(h, tuple):
            ptrs.add(h[0].data_ptr())
        else:
            ptrs.add(h.untyped_storage().data_ptr())
    assert len(ptrs) == 5


def test_pool_is_off_for_small_buffers(native_cache):
    fn = lambda x: x.exp() + 1  # noqa: E731
    x = torch.randn(16, 16)
    compiled = compile_aten_graph(trace(fn, [x]), [x], options={**CPP, "cache_dir": native_cache})
    a = compiled(x)
    ptr = a.data_ptr()
    del a
    compare(compiled(x), fn(x))
    assert not cpu_pool.pooled((16, 16), (16, 1), torch.float32, "cpu")
    assert cpu_pool.pooled((8192, 1024), (1024, 1), torch.float32, "cpu")
    assert not cpu_pool.pooled((8192, 1024), (1024, 1), torch.float32, "meta")
    del ptr


COLUMN_CASES = {
    "sum_rows": (lambda x: x.sum(0), [(33, 300)]),
    "bias_grad_and_pointwise": (lambda x, g: ((g * torch.sigmoid(x)), (g * torch.sigmoid(x)).sum(0)), [(17, 1000), (17, 1000)]),
    "middle_dim": (lambda x: x.amax(1) + 1, [(3, 9, 70)]),
    "two_reduced": (lambda x: x.sum((0, 1)), [(4, 5, 19)]),
    "min_prod": (lambda x: (x.amin(0), (x * 0.1 + 1).prod(0)), [(6, 257)]),
}


@pytest.mark.parametrize("name", list(COLUMN_CASES))
def test_column_reductions(name, native_cache, monkeypatch):
    """Reductions over rows (the innermost range kept): blocks of columns reduced side by side."""
    from ember.native import cpp_build
    sources = []
    real = cpp_build.write_source
    monkeypatch.setattr(cpp_build, "write_source", lambda text, base=None: sources.append(text) or real(text, base))
    fn, shapes = COLUMN_CASES[name]
    torch.manual_seed(0)
    run_cpp(fn, [torch.randn(s) for s in shapes], native_cache, atol=1e-5, rtol=1e-5)
    assert "const int64_t vn = em::min<int64_t>(" in sources[-1]


def test_column_reductions_special_values(native_cache):
    x = torch.randn(9, 40)
    x[3, 0] = float("nan")
    x[:, 1] = float("-inf")
    x[2, 2] = float("inf")
    run_cpp(lambda x: (x.amax(0), x.amin(0), x.sum(0), (x > 0).any(0), (x > -10).all(0)), [x], native_cache)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_column_reductions_dtypes(dtype, native_cache):
    x = (torch.randn(21, 45) * 10).to(dtype)
    run_cpp(lambda x: (x.sum(0), x.amax(0)), [x], native_cache)
