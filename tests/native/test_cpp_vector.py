"""The C++ renderer's explicit AVX-512 loops (cpp_vector) against eager, and their portable twin:
which stages get a V loop, the V helpers' special values (exp's clamps and subnormals, erf's
saturation, NaN-propagating max/min), rows with and without a scalar tail, and the stages that keep
their scalar loop (a mask, a bf16 row, an op V does not spell)."""
import math

import pytest
import torch
import torch.nn.functional as F

import ember
import ember.config
from ember.native import cpp_vector
from ember.native.cpp_vector import VECTOR_WIDTH, cpu_has_avx512
from tests.native.harness import trace
from tests.native.test_cpp import run_cpp

pytestmark = pytest.mark.skipif(not any(map(__import__("shutil").which, ("c++", "g++"))), reason="no C++ compiler")
needs_avx512 = pytest.mark.skipif(not (cpu_has_avx512() and cpp_vector.compiler_is_gcc()),
                                  reason="the CPU has no avx512f (or the compiler is not gcc): no V loops to test")
MODES = ["auto", "portable"]
# one V and a tail, exactly two Vs (no tail), several Vs and a tail
WIDTHS = [VECTOR_WIDTH + 7, 2 * VECTOR_WIDTH, 5 * VECTOR_WIDTH + 33]


def _source(fn, inputs, mode):
    from ember.native.backend import plan
    _, _, _, emitted = plan(trace(fn, inputs), inputs, {"cpu_simd": mode}, "cpp")
    return "\n".join(ck.source for _, ck in emitted), [ck for _, ck in emitted]


@needs_avx512
def test_softmax_stages_get_v_loops():
    x = torch.randn(4, 300)
    src, kernels = _source(lambda x: torch.softmax(x * 0.125, -1), [x], "auto")
    # the max, the exp-and-sum and the normalizing stage: a V loop each, then the scalar tail (300 % 64);
    # the exp loop prefetches the next row of x
    assert src.count("e_vld(") == 3 and src.count("V vacc") == 2 and kernels[0].vector, src
    assert src.count("e_vprefetch(&in_ptr0[(300 + (300 * v0) + v1)])") == 1, src
    assert src.count("e_exp(") == 2 and f"v1 = {256}; v1 < 300" in src, src  # V loop + tail, exp once each
    src, kernels = _source(lambda x: torch.softmax(x * 0.125, -1), [x], "portable")
    assert "e_vld" not in src and not kernels[0].vector, src


def test_other_compilers_and_cpus_get_the_portable_loops(monkeypatch):
    x = torch.randn(4, 300)
    monkeypatch.setattr(cpp_vector, "compiler_is_gcc", lambda: False)
    src, _ = _source(lambda x: torch.softmax(x, -1), [x], "auto")
    assert "e_vld" not in src, src
    monkeypatch.setattr(cpp_vector, "compiler_is_gcc", lambda: True)
    monkeypatch.setattr(cpp_vector, "cpu_has_avx512", lambda: False)
    src, _ = _source(lambda x: torch.softmax(x, -1), [x], "auto")
    assert "e_vld" not in src, src


@needs_avx512
def test_no_tail_loop_for_whole_vectors():
    x = torch.randn(4, 2 * VECTOR_WIDTH)
    src, _ = _source(lambda x: x.amax(-1), [x], "auto")
    assert "e_vld(" in src and "++v1" not in src, src


@needs_avx512
def test_layer_norm_gelu_v_statistics_and_hoisted_row_values():
    # a row that fits in cache: two V passes (the shifted sum, the squared deviations), no Welford lanes;
    # a longer row keeps the one-pass V Welford
    x, w, b = torch.randn(2, 9000), torch.randn(9000), torch.randn(9000)
    src, _ = _source(lambda x, w, b: F.layer_norm(x, (9000,), w, b), [x, w, b], "auto")
    assert "e_welford_lanes<float, 64>" in src and "V wf0_vm(0.0f)" in src, src
    x, w, b = torch.randn(4, 300), torch.randn(300), torch.randn(300)
    src, _ = _source(lambda x, w, b: F.gelu(F.layer_norm(x, (300,), w, b)), [x, w, b], "auto")
    kernel = src.split("// cpp_red")[-1]
    assert "e_welford_lanes" not in kernel and kernel.count("V wf0_vs(0.0f);") == 2, src
    assert "wf0_vs = wf0_vs + (tmp0 - wf0_k);" in kernel and "wf0_vs = wf0_vs + wf0_d * wf0_d;" in kernel, src
    # rsqrt(var + eps) once per row, before the GELU's V loop (not inside it)
    v_loop = src.rindex("for (int64_t v1 = 0; v1 < 256; v1 += 64) {\n        V tmp")
    assert src.index("e_rsqrt(") < v_loop and "e_gelu(" in src[v_loop:], src
    # the GELU loop asks for the next row: its input to read, its output to write
    assert "e_vprefetch(&in_ptr0[(300 + (300 * v0) + v1)]);" in src[v_loop:], src
    assert src.count("e_vprefetchw(") == 1 and "e_vprefetchw(&out_ptr0[(300 + (300 * v0) + v1)]);" in src[v_loop:], src


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [300, 1024])
def test_v_statistics_special_rows(n, mode, native_cache, monkeypatch):
    """The two-pass V statistics (cpp_reduce._two_pass) keep Welford's results on rows with inf, NaN,
    huge values, a constant row, and rows far from zero with a tiny spread (the float mean's rounding)."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", mode)
    torch.manual_seed(0)
    x = torch.randn(10, n)
    x[0, 3] = float("inf")
    x[1, 0] = float("-inf")
    x[2, n - 9] = float("nan")
    x[3, 0], x[3, 1] = float("inf"), float("-inf")
    x[4] = 3e38
    x[5] = 7.0
    x[6] = 3e5 + torch.randn(n) * 0.01
    x[7, 0] = 1e4  # an outlier as the shift
    v, _ = run_cpp(lambda x: torch.var_mean(x, -1), [x], native_cache, rtol=1e-4, atol=1e-6)(x)
    # (eager's layer_norm of the 3e38 row is NaN at n=1024, 0 at 300; the 3e5 row is at float's limit)
    ln_rows = x[[0, 1, 2, 3, 5, 7, 8, 9]]
    run_cpp(lambda x: F.layer_norm(x, (n,)), [ln_rows], native_cache, rtol=1e-4, atol=1e-4)
    exact, ev = x[6:8].double().var(-1), x[6:8].var(-1)
    assert ((v[6:8] - exact).abs() <= 2 * (ev - exact).abs() + 1e-6 * exact).all(), (v[6:8], ev, exact)


@needs_avx512
def test_gelu_erf_form_is_one_v_helper(native_cache):
    """GELU's erf form in a V loop is e_gelu (the 1/sqrt(2) folded into erf's coefficients, vrangeps
    saturation): within 1.2e-6 of float64 gelu over [-8, 8] (the spelled-out form: 1.5e-6), exactly
    eager's u above 5.94 and 0 below -5.94 (huge values included), NaN kept; a lone erf stays e_erf."""
    x = torch.linspace(-8, 8, 16 * 4096).view(16, 4096)
    x[0, :6] = torch.tensor([float("nan"), 1e30, -1e30, 1e38, -3e38, -0.0])  # (eager: gelu(3e38) = inf)
    fn = lambda x: (F.gelu(x), F.gelu(x).amax(-1))  # noqa: E731
    src, _ = _source(fn, [x], "auto")
    body = src.split("// cpp_red")[-1]
    assert "e_gelu(" in body and "e_erf(" not in body.split("for (int64_t v1 = 4096")[0], src
    src, _ = _source(lambda x: (torch.erf(x * 0.5), torch.erf(x).amax(-1)), [x], "auto")
    assert "e_gelu(" not in src.split("// cpp_red")[-1], src
    out = run_cpp(fn, [x], native_cache, atol=1.2e-6, rtol=1.3e-6)(x)[0]
    exact = F.gelu(x.double())
    fin = x.isfinite() & (x.abs() <= 8)
    assert (out.double() - exact)[fin].abs().max() <= 1.2e-6
    big = x.abs() >= 5.94
    assert torch.equal(out[big & (x > 0)], x[big & (x > 0)]) and (out[big & (x < 0)] == 0).all()
    assert out[0, 0].isnan()


@needs_avx512
@pytest.mark.parametrize("case", ["mask", "bf16", "argmax", "tanh"])
def test_stages_v_cannot_spell_keep_scalar_loops(case, native_cache):
    """A stage with something V does not spell is scalar; the other stages may still be V loops."""
    x = torch.randn(6, 150)
    fn, inputs = {
        "mask": (lambda x: torch.softmax(x.masked_fill(x > 1, float("-inf")), -1), [x]),
        "bf16": (lambda x: torch.softmax(x, -1), [x.bfloat16()]),
        "argmax": (lambda x: x.argmax(-1), [x]),
        "tanh": (lambda x: torch.tanh(x).sum(-1), [x]),
    }[case]
    src, _ = _source(fn, inputs, "auto")
    if case in ("bf16", "argmax", "tanh"):
        assert "e_vld" not in src, src
    for mode in MODES:
        ember.config.native_cpu_simd = mode
        try:
            run_cpp(fn, inputs, native_cache)
        finally:
            ember.config.native_cpu_simd = "auto"


def _special(n):
    """Rows of exp/erf arguments: NaN, +-inf, the clamps' edges, subnormal results, huge and tiny."""
    vals = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 88.72, 88.73, 89.0, 89.5, -87.3, -87.4,
            -100.0, -103.9, -104.0, -104.1, -150.0, 1e-40, -1e-40, 3.9, 4.0, 4.1, -3.9, -4.1, 1e30, -1e30,
            0.5, -0.5, 1e-3, 2.0, -2.0]
    x = torch.randn(7, n) * 3
    flat = x.view(-1)
    flat[: len(vals)] = torch.tensor(vals)
    flat[n + 40: n + 40 + len(vals)] = torch.tensor(vals)  # in a later V of the next row too
    x[6, -len(vals):] = torch.tensor(vals)                  # and in the scalar tail (or the last V)
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("op", ["exp", "erf", "sigmoid", "gelu"])
def test_pointwise_special_values(op, n, mode, native_cache, monkeypatch):
    """Each element stored (a V store in a reduction's stage) and reduced: eager's values, NaN and inf
    where eager has them (exp within 2 ulp, erf within 4e-7 absolute, as the scalar helpers)."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", mode)
    f = {"exp": torch.exp, "erf": torch.erf, "sigmoid": torch.sigmoid, "gelu": F.gelu}[op]
    x = _special(n)
    if op == "gelu":  # (eager's gelu(+inf) is NaN, ember's +inf on either path: not this test's subject)
        x = x.nan_to_num(nan=float("nan"), posinf=1e30, neginf=-1e30)
    tol = {"exp": (0, 3e-7), "erf": (5e-7, 0), "sigmoid": (1e-7, 3e-7), "gelu": (1e-6, 1e-6)}[op]
    run_cpp(lambda x: (f(x), f(x).amax(-1)), [x], native_cache, atol=tol[0] + 1e-45,
            rtol=max(tol[1], 1.3e-6) if op != "exp" else 3e-7)
    run_cpp(lambda x: f(x).sum(-1), [x], native_cache, atol=1e-5, rtol=1e-5)  # (another order of adding)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", WIDTHS)
def test_max_min_nan_and_signed_zero(n, mode, native_cache, monkeypatch):
    """The V max/min keep the scalar e_maximum's semantics: a NaN anywhere in the row wins."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", mode)
    x = torch.randn(6, n)
    x[0, 3] = float("nan")
    x[1, -1] = float("nan")  # in the tail (or the last V)
    x[2] = float("-inf")
    x[3] = float("inf")
    x[4] = -0.0
    x[5, n // 2] = float("nan")
    x[5, n // 2 + 1] = float("inf")
    run_cpp(lambda x: (x.amax(-1), x.amin(-1), torch.maximum(x, x.flip(-1)).sum(-1)), [x], native_cache)


@pytest.mark.parametrize("mode", MODES)
def test_dynamic_row_length(mode, native_cache, monkeypatch):
    """A row length that is a size symbol: the V loop runs to the largest multiple of 64, the tail after."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", mode)
    fn = ember.compile(lambda x: torch.softmax(x * 0.5, -1), dynamic=True)
    for n in (70, 128, 333):
        x = torch.randn(5, n)
        torch.testing.assert_close(fn(x), torch.softmax(x * 0.5, -1))


def test_bad_cpu_simd_names_the_choices():
    from ember.native.options import resolve
    with pytest.raises(ValueError, match="auto, portable"):
        resolve({"cpu_simd": "avx2"})
    assert math.isfinite(VECTOR_WIDTH)
