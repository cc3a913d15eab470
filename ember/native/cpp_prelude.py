"""The C++ code every translation unit of the native CPU path starts with (``cpp_emit``)."""

# Helpers the registry's "cpp" spellings call where C's semantics differ from eager's. No
# -ffast-math anywhere: NaN and Inf must behave as in eager (max/min propagate NaN, isnan works).
# erf's rational function in x^2 (the one Eigen and XLA use; highest power first): one table for the
# scalar e_erf below and the AVX-512 e_verf16 (cpp_vector.py)
ERF_P = ("-2.72614225801306e-10f", "2.77068142495902e-08f", "-2.10102402082508e-06f", "-5.69250639462346e-05f",
         "-7.34990630326855e-04f", "-2.95459980854025e-03f", "-1.60960333262415e-02f")
ERF_Q = ("-1.45660718464996e-05f", "-2.13374055278905e-04f", "-1.68282697438203e-03f", "-7.37332916720468e-03f",
         "-1.42647390514189e-02f")


def erf_polynomials(ctype: str, scale: float = 1.0) -> str:
    """The C lines computing erf's numerator ``p`` and denominator ``q`` (Horner in ``x2``) as ``ctype``.
    ``scale`` != 1: the rational of erf(scale * x) in x, so x * p / q is that (the coefficient of
    x^(2i) times scale^(2i), and p's also times scale): GELU's erf(u / sqrt(2)) without the multiply."""
    lines = []
    for name, coeffs in (("p", ERF_P), ("q", ERF_Q)):
        if scale != 1.0:
            top = len(coeffs) - 1
            coeffs = [f"{float(c.rstrip('f')) * scale ** (2 * (top - i)) * (scale if name == 'p' else 1.0)!r}f"
                      for i, c in enumerate(coeffs)]
        lines.append(f"  {ctype} {name} = x2 * {coeffs[0]} + {coeffs[1]};")
        lines += [f"  {name} = x2 * {name} + {c};" for c in coeffs[2:]]
    return "\n".join(lines)


# The standard library's names the kernels use, as gcc/clang builtins in namespace ``em`` (what
# libstdc++'s <cmath> overloads call themselves: the machine code is the same, byte for byte, on every
# unit the C++ tests generate). Parsing <cmath>, <algorithm> and <limits> was a third of a small
# unit's build (0.1 s of a 0.3 s compiler run for the transformer encoder layer's 4 kernels, g++ 12),
# paid again by every unit and by the compiler check. One line per function: float and double
# overloads keep the operand's precision, and an integer argument takes the double one (as <cmath>).
EM_MATH1 = ("sqrt", "exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
            "cosh", "tanh", "erf", "floor", "ceil", "trunc", "nearbyint", "fabs")
EM_MATH2 = ("pow", "atan2", "fmod", "copysign")
EM_CLASSIFY = ("isnan", "isinf", "isfinite")
# numeric_limits' members the renderer spells (cpp_spelling.identity / literal): (C type, lowest, max)
EM_INT_LIMITS = (("int64_t", "(-__INT64_MAX__ - 1)", "__INT64_MAX__"), ("int32_t", "(-__INT32_MAX__ - 1)", "__INT32_MAX__"),
                 ("int16_t", "int16_t(-__INT16_MAX__ - 1)", "int16_t(__INT16_MAX__)"),
                 ("int8_t", "int8_t(-__INT8_MAX__ - 1)", "int8_t(__INT8_MAX__)"), ("uint8_t", "uint8_t(0)", "uint8_t(__UINT8_MAX__)"))


def _em_namespace() -> str:
    lines = ["// em:: the few names of <cmath>, <limits>, <algorithm> and <type_traits> the kernels use, from the",
             "// compiler's builtins (as <cmath> itself does): those headers cost a third of a small unit's build",
             "namespace em {",
             "template <class T> inline constexpr bool is_floating_point_v = false;",
             "template <> inline constexpr bool is_floating_point_v<float> = true;",
             "template <> inline constexpr bool is_floating_point_v<double> = true;",
             "template <> inline constexpr bool is_floating_point_v<long double> = true;",
             "#define E_MATH1(F) static inline float F(float x) { return __builtin_##F##f(x); } \\",
             "  static inline double F(double x) { return __builtin_##F(x); } \\",
             "  template <class T> static inline double F(T x) { return __builtin_##F(double(x)); }",
             "#define E_MATH2(F) static inline float F(float x, float y) { return __builtin_##F##f(x, y); } \\",
             "  static inline double F(double x, double y) { return __builtin_##F(x, y); } \\",
             "  template <class A, class B> static inline double F(A x, B y) { return __builtin_##F(double(x), double(y)); }",
             *(" ".join(f"E_MATH1({f})" for f in EM_MATH1[i:i + 8]) for i in range(0, len(EM_MATH1), 8)),
             " ".join(f"E_MATH2({f})" for f in EM_MATH2),
             "#undef E_MATH1",
             "#undef E_MATH2"]
    lines += [f"template <class T> static inline bool {f}(T x) {{ return __builtin_{f}(x); }}" for f in EM_CLASSIFY]
    # (min/max as libstdc++ writes them: an `if`, which gcc compiles differently from `?:`)
    lines += ["template <class T> static inline const T& min(const T& a, const T& b) { if (b < a) return b; return a; }",
              "template <class T> static inline const T& max(const T& a, const T& b) { if (a < b) return b; return a; }",
              "template <class T> struct numeric_limits;"]
    for t, suffix, big in (("float", "f", "__FLT_MAX__"), ("double", "", "__DBL_MAX__")):
        lines.append(f"template <> struct numeric_limits<{t}> {{ static constexpr {t} infinity() {{ return __builtin_huge_val{suffix}(); }} "
                     f"static constexpr {t} quiet_NaN() {{ return __builtin_nan{suffix}(\"\"); }} "
                     f"static constexpr {t} lowest() {{ return -{big}; }} static constexpr {t} max() {{ return {big}; }} }};")
    for t, lo, hi in EM_INT_LIMITS:
        lines.append(f"template <> struct numeric_limits<{t}> {{ static constexpr {t} lowest() {{ return {lo}; }} "
                     f"static constexpr {t} max() {{ return {hi}; }} }};")
    return "\n".join(lines + ["}  // namespace em"])


EM_NAMESPACE = _em_namespace()


PRELUDE = r"""
#include <stdint.h>
@EM_NAMESPACE@
static int ember_threads = 1;
extern "C" void ember_set_num_threads(int n) { ember_threads = n > 0 ? n : 1; }
// threads for a parallel region over `numel` points: one per `grain` points, at most torch's count
static inline int e_threads(int64_t numel, int64_t grain) {
  int64_t n = numel / grain;
  return n < 1 ? 1 : (n < ember_threads ? int(n) : ember_threads);
}
// Where eager raises (an index out of range, an integer division by zero) a kernel records the
// error here and the wrapper raises it after the call (cpp_build.check): never a silent result.
static int ember_error = 0;
static inline void ember_fail(int code) { __atomic_store_n(&ember_error, code, __ATOMIC_RELAXED); }
extern "C" int ember_take_error() { return __atomic_exchange_n(&ember_error, 0, __ATOMIC_RELAXED); }

static inline float e_exp(float x);
static inline double e_exp(double x);
template <class T> static inline T e_maximum(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> static inline T e_minimum(T a, T b) { return (a < b || a != a) ? a : b; }
template <class T> static inline T e_abs(T a) { return a < 0 ? T(-a) : a; }
template <class T> static inline T e_sign(T a) { return T((T(0) < a) - (a < T(0))); }
template <class T> static inline T e_reciprocal(T a) { return T(1) / a; }
template <class T> static inline T e_rsqrt(T a) { return T(1) / em::sqrt(a); }
template <class T> static inline T e_sigmoid(T a) { return T(1) / (T(1) + e_exp(-a)); }
template <class T> static inline T e_logit(T a) { return em::log(a / (T(1) - a)); }
template <class T> static inline bool e_isnan(T a) { if constexpr (em::is_floating_point_v<T>) return em::isnan(a); else return false; }
template <class T> static inline bool e_isinf(T a) { if constexpr (em::is_floating_point_v<T>) return em::isinf(a); else return false; }
template <class T> static inline T e_floor(T a) { if constexpr (em::is_floating_point_v<T>) return em::floor(a); else return a; }
template <class T> static inline T e_ceil(T a) { if constexpr (em::is_floating_point_v<T>) return em::ceil(a); else return a; }
template <class T> static inline T e_trunc(T a) { if constexpr (em::is_floating_point_v<T>) return em::trunc(a); else return a; }
// round half to even (the default rounding mode), as torch.round
template <class T> static inline T e_round(T a) { if constexpr (em::is_floating_point_v<T>) return em::nearbyint(a); else return a; }
// integer division by zero is undefined in C (a trap on x86): recorded, eager raises
template <class T> static inline T e_truncdiv(T a, T b) {
  if constexpr (em::is_floating_point_v<T>) return em::trunc(a / b);
  else { if (b == 0) { ember_fail(2); return T(0); } return T(a / b); }
}
template <class T> static inline T e_fmod(T a, T b) {
  if constexpr (em::is_floating_point_v<T>) return em::fmod(a, b);
  else { if (b == 0) { ember_fail(2); return T(0); } return T(a % b); }
}
// Python's floor division and modulo (sign of the divisor), as eager's floor_divide/remainder
template <class T> static inline T e_floordiv(T a, T b) {
  if constexpr (em::is_floating_point_v<T>) {
    if (b == 0) return a / b;
    T mod = em::fmod(a, b), div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return em::copysign(T(0), a / b);
    T fl = em::floor(div);
    return div - fl > T(0.5) ? fl + T(1) : fl;
  } else {
    if (b == 0) { ember_fail(2); return T(0); }
    T q = a / b;
    return ((a % b) != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q;
  }
}
template <class T> static inline T e_remainder(T a, T b) {
  if constexpr (em::is_floating_point_v<T>) {
    T r = em::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
  } else {
    if (b == 0) { ember_fail(2); return T(0); }
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
  }
}
// float exp, erf and tanh that gcc vectorizes (glibc's expf/erff/tanhf are scalar calls unless
// -ffast-math, which would break NaN/Inf). exp: Cody-Waite reduction and Cephes' polynomial, within
// 1 ulp of eager's (Sleef) exp; n = round(x / ln 2) comes from the 1.5 * 2^23 "magic" addition (no
// float->int conversion, so no UB for NaN), and 2^n is applied in two halves so results down to the
// subnormals stay right. Out-of-range inputs are fixed by two selects at the end, not by clamping x:
// gcc turns a clamp into masked code (it constant-folds the clamped lanes): softmax 15% and
// layer_norm+GELU (erf) 7% slower.
// erf: the rational function Eigen and XLA use (within 4e-7 absolute of erf; eager's vectorized CPU
// erf is an approximation of the same order). tanh: Cephes' odd polynomial below 0.625, else
// 1 - 2 / (exp(2|x|) + 1) (a few ulp). Double keeps <cmath>.
static inline float e_exp(float x) {
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  int32_t tb;
  __builtin_memcpy(&tb, &t, 4);
  int32_t ni = tb - 0x4B400000, n1 = ni >> 1, n2 = ni - n1;
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;  // (garbage past the range: selected away)
  float s1, s2;
  __builtin_memcpy(&s1, &b1, 4);
  __builtin_memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;  // NaN stays NaN through p
  y = x < -104.0f ? 0.0f : y;
  return x > 89.0f ? em::numeric_limits<float>::infinity() : y;
}
static inline double e_exp(double x) { return em::exp(x); }
static inline float e_erf(float x) {
  float x2 = x * x;
@ERF_POLYNOMIALS_float@
  float y = x * p / q;  // NaN stays NaN (the select below is false for it)
  return em::fabs(x) > 4.0f ? em::copysign(1.0f, x) : y;  // erf(4) rounds to 1 in float
}
static inline double e_erf(double x) { return em::erf(x); }
static inline float e_tanh(float x) {
  float a = em::fabs(x), z = x * x;
  float p = -5.70498872745E-3f;
  p = p * z + 2.06390887954E-2f;
  p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f;
  p = p * z - 3.33332819422E-1f;
  p = p * z * x + x;
  float q = 1.0f - 2.0f / (e_exp(2.0f * a) + 1.0f);  // NaN stays NaN; inf gives 1
  return a < 0.625f ? p : em::copysign(q, x);
}
static inline double e_tanh(double x) { return em::tanh(x); }
// NaN-propagating max/min as OpenMP reductions, so `omp simd` vectorizes them too
#pragma omp declare reduction(e_max : float, double, int64_t, int32_t, int16_t, int8_t, uint8_t : omp_out = e_maximum(omp_out, omp_in)) initializer(omp_priv = omp_orig)
#pragma omp declare reduction(e_min : float, double, int64_t, int32_t, int16_t, int8_t, uint8_t : omp_out = e_minimum(omp_out, omp_in)) initializer(omp_priv = omp_orig)
// Welford lanes (cpp_reduce._welford_stage): W running (mean, M2) pairs of `count` elements each,
// merged pairwise (Chan et al.: equal counts, so the mean moves half the difference)
template <class T, int W> static inline void e_welford_lanes(T* m, T* m2, int64_t count, T& mean, T& M2) {
  T c = T(count);
  for (int w = W / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) {
      T d = m[l + w] - m[l];
      m[l] += d * T(0.5);
      m2[l] += m2[l + w] + d * d * c * T(0.5);
    }
    c *= T(2);
  }
  mean = m[0];
  M2 = m2[0];
}
// int64 index math with Python's semantics (index expressions are usually non-negative)
static inline int64_t e_idiv(int64_t a, int64_t b) { int64_t q = a / b; return ((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t e_imod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
// bfloat16 is stored as its 16 high bits; stores round to nearest even, NaN stays NaN
static inline float e_bf16_load(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t e_bf16_store(float f) {
  uint32_t u; __builtin_memcpy(&u, &f, 4);
  if (f != f) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
static inline float e_round_bf16(float f) { return e_bf16_load(e_bf16_store(f)); }
static inline float e_round_f16(float f) { return float(_Float16(f)); }
""".replace("@ERF_POLYNOMIALS_float@", erf_polynomials("float")).replace("@EM_NAMESPACE@", EM_NAMESPACE)
