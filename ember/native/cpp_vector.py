"""Explicit AVX-512 loops for the C++ renderer (a mixin of ``cpp_emit.CppKernelEmitter``).

gcc vectorizes the renderer's scalar C++ (``omp simd``), but three things keep a row loop of softmax or
layer_norm+GELU far from memory speed (issue 25): a vectorized reduction runs one vector accumulator,
so the NaN-propagating max's compare/or/blend chain (~7 cycles per 16 floats) sets the pace; the
portable ``e_exp`` scales by 2^n in two halves with integer ops and range selects (~25 instructions
per 16 floats) where AVX-512 has ``vscalefps``; and ``e_erf`` divides (a slow ``vdivps`` on 512-bit
vectors). Where the CPU has avx512f and ``cpu_simd`` is 'auto', a stage of a row reduction
(``cpp_reduce._reduce_stage``) over one contiguous fp32 range is written a second time over ``V``:
E_VW = 64 consecutive floats as four zmm registers (PRELUDE below), so every op is four independent
instructions and every accumulator four independent chains; the scalar loop then runs only the
tail (the row's last ``n % 64`` elements), or everything when the stage holds anything ``V`` does
not spell (a gather, a mask, a cast, an op outside VECTOR_OPS: ``NoVector``).

Values that do not depend on the reduced index (constants, the row's max or mean) stay scalars and
convert to ``V`` by broadcast in the ops. The semantics are the scalar helpers' (NaN/Inf included);
sums add in a different order (as ``omp simd`` already does).
"""
from __future__ import annotations

import functools

import sympy
import torch

from ember.native.cpp_spelling import CScope, combine, identity, indent

# floats per V (four zmm registers: four independent chains per accumulator)
VECTOR_WIDTH = 64
# ops with a V overload in PRELUDE (anything else in a vector loop: NoVector, the scalar loop runs)
VECTOR_OPS = {"add", "sub", "mul", "truediv", "neg", "maximum", "minimum", "exp", "erf", "sigmoid"}
# the horizontal end of a V accumulator, per reduction type
HORIZONTAL = {"sum": "e_vsum", "max": "e_vmax", "min": "e_vmin"}


class NoVector(Exception):
    """Something of a stage the V loop does not spell: the stage keeps its scalar loop."""


@functools.lru_cache(maxsize=None)
def cpu_has_avx512() -> bool:
    """Whether this CPU has avx512f (the kernels are built with -march=native for it)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(l.startswith("flags") and " avx512f" in l for l in f)
    except OSError:
        return False


PRELUDE = r"""
#include <immintrin.h>
// ember's explicit AVX-512 loops (cpp_vector): V holds E_VW consecutive floats as E_VN zmm registers, so a
// reduction has E_VN independent accumulators (the max's compare/blend and the sum's add chains
// overlap) and every op is E_VN independent instructions. Scalars (row-invariant values, constants)
// convert to V by broadcast.
#define E_VN 4
#define E_VW (16 * E_VN)
struct V { __m512 r[E_VN]; V() = default; V(float s) { for (int i = 0; i < E_VN; ++i) r[i] = _mm512_set1_ps(s); } };
#define E_VMAP(out, expr) V out; _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) out.r[i] = expr; return out
static inline V e_vld(const float* p) { V out; _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) out.r[i] = _mm512_loadu_ps(p + 16 * i); return out; }
static inline void e_vst(float* p, const V& v) { _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) _mm512_storeu_ps(p + 16 * i, v.r[i]); }
static inline V operator+(const V& a, const V& b) { E_VMAP(o, _mm512_add_ps(a.r[i], b.r[i])); }
static inline V operator-(const V& a, const V& b) { E_VMAP(o, _mm512_sub_ps(a.r[i], b.r[i])); }
static inline V operator*(const V& a, const V& b) { E_VMAP(o, _mm512_mul_ps(a.r[i], b.r[i])); }
static inline V operator/(const V& a, const V& b) { E_VMAP(o, _mm512_div_ps(a.r[i], b.r[i])); }
static inline V operator-(const V& a) { E_VMAP(o, _mm512_xor_ps(a.r[i], _mm512_set1_ps(-0.0f))); }
// e_maximum/e_minimum as the scalar ones: a if a > b (a < b) or a is NaN, else b
static inline __m512 e_vmax16(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), b, a);
}
static inline __m512 e_vmin16(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), b, a);
}
static inline V e_maximum(const V& a, const V& b) { E_VMAP(o, e_vmax16(a.r[i], b.r[i])); }
static inline V e_minimum(const V& a, const V& b) { E_VMAP(o, e_vmin16(a.r[i], b.r[i])); }
// exp: e_exp's reduction and polynomial; x clamped to [-104, 89] first (NaN stays NaN: vmaxps/vminps
// return their second operand when one is NaN), n = round(x / ln 2) by vrndscaleps, and p * 2^n by
// vscalefps, which rounds once and gives the subnormals, 0 and inf right
static inline __m512 e_vexp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500E-4f), r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
// erf: e_erf's rational function with x * p / q as x * p * (1/q), 1/q from vrcp14ps and one Newton step
// (relative error ~2^-28, below float's rounding): a vdivps costs several times an FMA on 512-bit vectors
static inline __m512 e_verf16(__m512 x) {
  __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_fmadd_ps(x2, _mm512_set1_ps(-2.72614225801306e-10f), _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-1.60960333262415e-02f));
  __m512 q = _mm512_fmadd_ps(x2, _mm512_set1_ps(-1.45660718464996e-05f), _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(-1.42647390514189e-02f));
  __m512 rq = _mm512_rcp14_ps(q);
  rq = _mm512_fmadd_ps(rq, _mm512_fnmadd_ps(q, rq, _mm512_set1_ps(1.0f)), rq);
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(x, p), rq);  // NaN stays NaN
  __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
  __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(4.0f), _CMP_GT_OQ);
  return _mm512_mask_blend_ps(big, y, one);
}
static inline V e_exp(const V& a) { E_VMAP(o, e_vexp16(a.r[i])); }
static inline V e_erf(const V& a) { E_VMAP(o, e_verf16(a.r[i])); }
static inline V e_sigmoid(const V& a) { return V(1.0f) / (V(1.0f) + e_exp(-a)); }
// the horizontal end of a V accumulator, in the scalar combine's semantics
static inline float e_vsum(const V& a) {
  __m512 s = a.r[0];
  for (int i = 1; i < E_VN; ++i) s = _mm512_add_ps(s, a.r[i]);
  return _mm512_reduce_add_ps(s);
}
static inline float e_vmax(const V& a) {
  alignas(64) float t[16]; __m512 s = a.r[0];
  for (int i = 1; i < E_VN; ++i) s = e_vmax16(s, a.r[i]);
  _mm512_store_ps(t, s); float m = t[0];
  for (int i = 1; i < 16; ++i) m = e_maximum(m, t[i]);
  return m;
}
static inline float e_vmin(const V& a) {
  alignas(64) float t[16]; __m512 s = a.r[0];
  for (int i = 1; i < E_VN; ++i) s = e_vmin16(s, a.r[i]);
  _mm512_store_ps(t, s); float m = t[0];
  for (int i = 1; i < 16; ++i) m = e_minimum(m, t[i]);
  return m;
}
"""


class VectorEmitter:
    """The V half of ``cpp_emit.CppKernelEmitter``: ``vmode`` is the reduced range's position while a V
    loop body is emitted (None otherwise), ``vnames`` the temporaries that hold a V."""

    vmode = None

    def _vector_wanted(self, reds, accs) -> bool:
        k = self.k
        if self.options.cpu_simd != "auto" or not cpu_has_avx512() or k.single or len(k.reduced) != 1:
            return False
        if isinstance(k.rnumel, int) or getattr(k.rnumel, "is_Integer", False):
            if int(k.rnumel) < VECTOR_WIDTH:
                return False
        return all(n.reduction_type in HORIZONTAL and accs[n.name][1] == torch.float32 for n in reds)

    def _vector_stage(self, scope, reds, stores, all_nodes, stage, accs):
        """(lines of the V loop and its accumulators' ends, first index of the scalar tail) for one
        stage of ``_reduce_stage``, or None when the stage has something V does not spell."""
        if not self._vector_wanted(reds, accs):
            return None
        k = self.k
        (r,) = k.reduced
        n_r = self.index_str(k.ranges[r])
        rvar = f"v{r}"
        full = str(int(k.rnumel) // VECTOR_WIDTH * VECTOR_WIDTH) if str(n_r).isdigit() else \
            f"(({n_r}) / {VECTOR_WIDTH} * {VECTOR_WIDTH})"
        inner = CScope(scope)
        self.vmode, self.vnames = r, set()
        vaccs = {n.name: f"v{accs[n.name][0]}" for n in reds}
        try:
            mine = self.stage_sets.get(stage, ())
            for e, (buf, s0) in self.row_cache.items():
                if s0 < stage and e in mine:
                    inner.cache[e] = self._vemit(inner, f"e_vld(&{self._vslot(buf, rvar)})")
            self.row_scope = scope
            for n in all_nodes:
                if n in reds:
                    v = self.value(self.k.bodies[n.name], inner)
                    a = vaccs[n.name]
                    inner.lines.append(f"{a} = {combine(n.reduction_type, a, v)};")
                elif n in stores:
                    self.store(n.name, self.node_value(n.name, inner), inner)
            for e, (buf, s0) in self.row_cache.items():
                if s0 == stage:
                    inner.lines.append(f"e_vst(&{self._vslot(buf, rvar)}, {self.value(e, inner)});")
        except NoVector:
            return None
        finally:
            self.vmode, self.row_scope = None, None
        lines = ["{"]
        for n in reds:
            lines.append(f"  V {vaccs[n.name]}({identity(n.reduction_type, torch.float32)});")
        lines.append(f"  for (int64_t {rvar} = 0; {rvar} < {full}; {rvar} += {VECTOR_WIDTH}) {{")
        lines += indent(inner.lines, 2) + ["  }"]
        for n in reds:
            a = accs[n.name][0]
            end = f"{HORIZONTAL[n.reduction_type]}({vaccs[n.name]})"
            lines.append(f"  {a} = {combine(n.reduction_type, a, end)};")
        lines.append("}")
        tail = None if str(n_r).isdigit() and int(n_r) % VECTOR_WIDTH == 0 else full
        return lines, tail

    # -- the hooks cpp_emit calls while vmode is set --------------------------------------------
    def _vemit(self, scope, code) -> str:
        name = self.new_tmp()
        scope.lines.append(f"V {name} = {code};")
        self.vnames.add(name)
        return name

    def _contiguous(self, index) -> bool:
        """Whether ``index`` steps by one along the reduced range (so 64 consecutive points are one V)."""
        rv = self.vars[self.vmode]
        idx = sympy.expand(sympy.sympify(index))
        if rv not in idx.free_symbols:
            return False
        rest = idx.subs(rv, 0)
        return sympy.expand(idx - rest - rv) == 0 and rv not in rest.free_symbols

    def _vdepends(self, index) -> bool:
        return self.vars[self.vmode] in sympy.sympify(index).free_symbols

    def _vslot(self, buf, rvar) -> str:
        name = self.row_in_output.get(buf)
        if name is not None and (self.nodes[name].layout.dtype != torch.float32
                                 or not self._contiguous(self.k.stores[name])):
            raise NoVector(f"row buffer kept in {name}")
        return self._row_slot(buf, rvar)

    def _vload(self, e, scope):
        """A V load of a contiguous fp32 row, None for a load fixed along the row (a scalar)."""
        buf, index, syms = e.attr
        if syms:
            raise NoVector("gathered load")
        if not self._vdepends(index):
            return None
        if self.layouts[buf].dtype != torch.float32 or not self._contiguous(index):
            raise NoVector(f"load of {buf}")
        return self._vemit(scope, f"e_vld(&{self.pointer(buf)}[{self.index_str(index)}])")

    def _vstore(self, name, v, scope) -> None:
        n = self.nodes[name]
        index = self.k.stores[name]
        if n.layout.dtype != torch.float32 or not self._contiguous(index):
            raise NoVector(f"store of {name}")
        v = v if v in self.vnames else f"V({v})"
        scope.lines.append(f"e_vst(&{self.pointer(name, out=True)}[{self.index_str(index)}], {v});")

    def _vop(self, e, args, code, scope) -> str:
        if e.op not in VECTOR_OPS or e.dtype != torch.float32 or any(a.dtype != torch.float32 for a in e.args):
            raise NoVector(f"op {e.op} ({e.dtype})")
        return self._vemit(scope, code)

    def _vcheck_scalar(self, e) -> None:
        """Ops with no V spelling are fine on scalars only (a value fixed along the row)."""
        if e.op == "masked" or (e.op == "index" and self._vdepends(e.attr)):
            raise NoVector(e.op)
