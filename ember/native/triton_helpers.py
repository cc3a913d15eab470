"""``@triton.jit`` helpers that generated kernels call (``from ember.native.triton_helpers import *``).

Under the Triton interpreter (``TRITON_INTERPRET=1``) ``libdevice`` functions are stubs that return
None (triton-lang/triton#8825), so math that ``tl``/``tl.math`` lacks is written out here from
exp/log/sqrt; on a GPU the same names call libdevice. Comparisons are written so NaN propagates the
way eager's does (``maximum``, ``amax``, ``argmax`` all let NaN win).
"""

import triton
import triton.language as tl
from triton import knobs

# Triton's own reading of TRITON_INTERPRET. Not ember.config: build workers load this module by path,
# without the ember package (importing it would import torch in every worker: seconds per worker)
INTERPRET = bool(knobs.runtime.interpret)

__all__ = ["maximum", "minimum", "prod_combine", "welford_combine", "argmax_combine", "argmin_combine", "floordiv",
           "remainder", "sign", "trunc", "round_half_even", "tanh", "expm1", "log1p", "pow", "atan", "atan2", "asin",
           "acos", "sinh", "cosh", "tan", "max_nan_reduce", "min_nan_reduce", "erf_rational"]


@triton.jit
def maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def max_nan_reduce(x, axis):
    return tl.reduce(x, axis, maximum)


@triton.jit
def min_nan_reduce(x, axis):
    return tl.reduce(x, axis, minimum)


@triton.jit
def prod_combine(a, b):
    return a * b


@triton.jit
def welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # Chan et al.'s merge of two (mean, M2, count) triples (triton_welford); empty ones (n = 0) add nothing
    n = n_a + n_b
    frac = n_b / tl.maximum(n, 1.0)
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n


@triton.jit
def argmax_combine(a, ia, b, ib):
    # the larger value wins, NaN beats numbers, ties go to the lower index (eager's first match)
    a_nan = a != a
    b_nan = b != b
    pick_a = (a > b) | (a_nan & (b == b)) | (((a == b) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(pick_a, a, b), tl.where(pick_a, ia, ib)


@triton.jit
def argmin_combine(a, ia, b, ib):
    a_nan = a != a
    b_nan = b != b
    pick_a = (a < b) | (a_nan & (b == b)) | (((a == b) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(pick_a, a, b), tl.where(pick_a, ia, ib)


@triton.jit
def floordiv(a, b):
    # Triton's // truncates toward zero; eager's floor_divide rounds down
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def remainder(a, b):
    # Triton's % is C's fmod; eager's remainder takes the sign of the divisor
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def sign(x):
    # float constants, not ints: on the H100 (Triton 3.6) the int32 select cast to float and stored as
    # bf16 came out 1.0 for every nonzero element, negative ones included (session 40's CUDA OpInfo
    # sweep: sign/sgn bf16); NaN gives 0 as in eager
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)


@triton.jit
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


if INTERPRET:
    @triton.jit
    def _div(a, b):
        return a / b

    @triton.jit
    def round_half_even(x):
        r = tl.floor(x + 0.5)
        return tl.where(((r - x) == 0.5) & ((r % 2) != 0), r - 1, r)

    @triton.jit
    def expm1(x):
        small = tl.abs(x) < 1e-2
        xs = tl.where(small, x, 0.0)
        series = xs + xs * xs * 0.5 + xs * xs * xs / 6.0 + xs * xs * xs * xs / 24.0
        return tl.where(small, series, tl.exp(x) - 1.0)

    @triton.jit
    def log1p(x):
        u = 1.0 + x
        d = u - 1.0
        return tl.where(d == 0, x, tl.log(u) * (x / tl.where(d == 0, 1.0, d)))

    @triton.jit
    def tanh(x):
        e = expm1(-2.0 * tl.abs(x))
        t = -e / (2.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def pow(x, y):
        r = tl.exp2(y * tl.log2(tl.abs(x)))
        y_int = tl.floor(y) == y
        odd = y_int & ((tl.abs(y) % 2) == 1)
        neg = tl.where(y_int, tl.where(odd, -r, r), float("nan"))
        r = tl.where(x < 0, neg, r)
        return tl.where(y == 0, 1.0, r)

    @triton.jit
    def atan(x):
        # two half-angle reductions, then the odd series; |error| < 1e-9
        t = tl.abs(x)
        inv = t > 1.0
        t = tl.where(inv, 1.0 / tl.where(t == 0, 1.0, t), t)
        t = t / (1.0 + tl.sqrt(1.0 + t * t))
        t = t / (1.0 + tl.sqrt(1.0 + t * t))
        t2 = t * t
        s = t * (1.0 - t2 * (1.0 / 3 - t2 * (1.0 / 5 - t2 * (1.0 / 7 - t2 * (1.0 / 9 - t2 / 11)))))
        s = 4.0 * s
        s = tl.where(inv, 1.5707963267948966 - s, s)
        return tl.where(x < 0, -s, s)

    @triton.jit
    def atan2(y, x):
        a = atan(y / tl.where(x == 0, 1.0, x))
        pi = 3.141592653589793
        r = tl.where(x > 0, a, tl.where(y >= 0, a + pi, a - pi))
        return tl.where(x == 0, tl.where(y > 0, pi / 2, tl.where(y < 0, -pi / 2, 0.0)), r)

    @triton.jit
    def asin(x):
        return atan2(x, tl.sqrt(1.0 - x * x))

    @triton.jit
    def acos(x):
        return atan2(tl.sqrt(1.0 - x * x), x)

    @triton.jit
    def sinh(x):
        return (expm1(x) - expm1(-x)) * 0.5

    @triton.jit
    def cosh(x):
        return (tl.exp(x) + tl.exp(-x)) * 0.5

    @triton.jit
    def tan(x):
        return tl.sin(x) / tl.cos(x)
else:
    from triton.language.extra import libdevice

    @triton.jit
    def _div(a, b):
        # erf_rational's quotient: MUFU.RCP and a multiply (2 ulp; the divisor stays in [-2.4, -0.014],
        # far from fast division's limits)
        return libdevice.fast_dividef(a, b)

    @triton.jit
    def round_half_even(x):
        return libdevice.nearbyint(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def pow(x, y):
        return libdevice.pow(x, y)

    @triton.jit
    def atan(x):
        return libdevice.atan(x)

    @triton.jit
    def atan2(y, x):
        return libdevice.atan2(y, x)

    @triton.jit
    def asin(x):
        return libdevice.asin(x)

    @triton.jit
    def acos(x):
        return libdevice.acos(x)

    @triton.jit
    def sinh(x):
        return libdevice.sinh(x)

    @triton.jit
    def cosh(x):
        return libdevice.cosh(x)

    @triton.jit
    def tan(x):
        return libdevice.tan(x)


@triton.jit
def erf_rational(x):
    """erf as the odd/even rational function Eigen and XLA use for float32 (numerator of degree 13,
    denominator 8, on [-4, 4]; erf rounds to +-1 beyond). On an H100 within 3.9e-7 absolute (6.4
    float32 ulps) of float64 erf over [-6, 6], where libdevice's erf is within 1 ulp
    (``benchmarks/probes/erf_accuracy.py``; ``tests/native/test_fusion.py`` bounds it). Used
    only where the result is rounded to bf16/fp16 (``triton_emit``): there its error is 10^4 times
    below one rounding step, while libdevice's erf made layer_norm+gelu 8192x4096 bf16
    compute-bound on an H100 (71% of copy bandwidth, 91% with this form: gpu_suite's ln_gelu row)."""
    x = tl.clamp(x, -4.0, 4.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN (min.NaN/max.NaN)
    x2 = x * x
    p = x2 * -2.72614225801306e-10 + 2.77068142495902e-08
    p = x2 * p + -2.10102402082508e-06
    p = x2 * p + -5.69250639462346e-05
    p = x2 * p + -7.34990630326855e-04
    p = x2 * p + -2.95459980854025e-03
    p = x2 * p + -1.60960333262415e-02
    q = x2 * -1.45660718464996e-05 + -2.13374055278905e-04
    q = x2 * q + -1.68282697438203e-03
    q = x2 * q + -7.37332916720468e-03
    q = x2 * q + -1.42647390514189e-02
    return _div(x * p, q)
