"""Explicit AVX-512 loops for the C++ renderer (a mixin of ``cpp_emit.CppKernelEmitter``).

gcc vectorizes the renderer's scalar C++ (``omp simd``), but three things keep a row loop of softmax or
layer_norm+GELU far from memory speed (issue 25): a vectorized reduction runs one vector accumulator,
so the NaN-propagating max's compare/or/blend chain (~7 cycles per 16 floats) sets the pace; the
portable ``e_exp`` scales by 2^n in two halves with integer ops and range selects (~25 instructions
per 16 floats) where AVX-512 has ``vscalefps``; and ``e_erf`` divides (a slow ``vdivps`` on 512-bit
vectors). Where the CPU has avx512f and ``cpu_simd`` is 'auto' (the default), a stage of a row
reduction over one contiguous fp32 range (``cpp_reduce._reduce_stage``, and Welford's pass:
``_welford_stage``, 64 lanes) is written a second time over ``V``: E_VW = 64 consecutive floats as
four zmm registers (PRELUDE below), so every op is four independent instructions and every
accumulator four independent chains; the scalar loop then runs only the tail (the row's last
``n % 64`` elements), or the whole row when the stage holds anything ``V`` does not spell (a gather, a
mask, a cast, an op outside VECTOR_OPS: ``NoVector``). A later loop over the row prefetches the
next row's lines of what it reads, and values fixed along the row are computed once before the loop.

Values that do not depend on the reduced index (constants, the row's max or mean) stay scalars and
convert to ``V`` by broadcast in the ops. The semantics are the scalar helpers' (NaN/Inf included);
sums add in a different order (as ``omp simd`` already does).
"""
from __future__ import annotations

import functools

import sympy
import torch

from ember.native.cpp_prelude import erf_polynomials
from ember.native.cpp_spelling import CScope, combine, identity, indent

# floats per V (four zmm registers: four independent chains per accumulator)
VECTOR_WIDTH = 64
# ops with a V overload in PRELUDE (anything else in a vector loop: NoVector, the scalar loop runs)
VECTOR_OPS = {"add", "sub", "mul", "truediv", "neg", "maximum", "minimum", "exp", "erf", "sigmoid"}
# GELU's erf argument is u times this (aten.gelu's decomposition, approximate="none": M_SQRT1_2)
GELU_SCALE = 0.7071067811865476
# the horizontal end of a V accumulator, per reduction type
HORIZONTAL = {"sum": "e_vsum", "max": "e_vmax", "min": "e_vmin"}


def _const_arg(e, value):
    """The operand of binary ``e`` other than the fp32 constant ``value`` (either side), or None."""
    for i in (0, 1):
        c = e.args[i]
        if c.op == "const" and isinstance(c.attr, float) and abs(c.attr - value) <= 1e-12 * abs(value):
            return e.args[1 - i]
    return None


def gelu_operand(e):
    """``u`` where ``e`` is ``(u * 0.5) * (erf(u * M_SQRT1_2) + 1)`` in fp32 (operands in either order), else None."""
    if e.op != "mul" or e.dtype != torch.float32 or any(a.dtype != torch.float32 for a in e.args):
        return None
    for i in (0, 1):
        half, one_plus = e.args[i], e.args[1 - i]
        if half.op != "mul" or one_plus.op != "add":
            continue
        u, erf = _const_arg(half, 0.5), _const_arg(one_plus, 1.0)
        if u is None or erf is None or erf.op != "erf" or erf.args[0].op != "mul":
            continue
        if _const_arg(erf.args[0], GELU_SCALE) == u and u.dtype == torch.float32:
            return u
    return None


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


@functools.lru_cache(maxsize=None)
def compiler_is_gcc() -> bool:
    """PRELUDE uses GCC's vector extensions (``__builtin_shuffle``, ``?:`` on vectors), tested with
    gcc only: another compiler (clang as $CXX) gets the portable loops."""
    import subprocess

    from ember.native import cpp_build
    try:
        out = subprocess.run([cpp_build.find_compiler(), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError, cpp_build.CompilerMissing):
        return False
    return "Free Software Foundation" in out and "clang" not in out.lower()  # (gcc's --version)


def vector_available(options) -> bool:
    return options.cpu_simd == "auto" and cpu_has_avx512() and compiler_is_gcc()


PRELUDE = r"""
// ember's explicit AVX-512 loops (cpp_vector.py). GCC vector types and the ia32 builtins, not
// <immintrin.h>: parsing that header alone doubles the compile time of a kernel unit (0.2 s).
// V holds E_VW consecutive floats as E_VN zmm registers: every op is E_VN independent instructions
// and every accumulator E_VN independent chains (the NaN-propagating max's compare/or/blend chain
// and the sum's add chain overlap). Scalars (constants, the row's max or mean) convert to V by
// broadcast.
#define E_VN 4
#define E_VW (16 * E_VN)
typedef float e_v16 __attribute__((vector_size(64)));
typedef int32_t e_i16 __attribute__((vector_size(64)));
typedef float e_v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline e_v16 e_bc(float s) { return (e_v16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
struct V {
  e_v16 r[E_VN];
  V() = default;
  V(float s) { for (int i = 0; i < E_VN; ++i) r[i] = e_bc(s); }
};
#define E_VMAP(expr) V o; _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) o.r[i] = expr; return o
static inline V e_vld(const float* p) { E_VMAP(*(const e_v16u*)(p + 16 * i)); }
static inline void e_vst(float* p, const V& v) { _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) *(e_v16u*)(p + 16 * i) = v.r[i]; }
// the next row's cache lines, asked for while this row computes (its first loop then finds them in L1)
static inline void e_vprefetch(const float* p) { _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) __builtin_prefetch(p + 16 * i, 0, 3); }
// and the next row's output lines, for writing (prefetchw): the stores then find them in cache, owned,
// instead of each waiting on a read-for-ownership from L3
static inline void e_vprefetchw(float* p) { _Pragma("GCC unroll 4") for (int i = 0; i < E_VN; ++i) __builtin_prefetch(p + 16 * i, 1, 3); }
static inline V operator+(const V& a, const V& b) { E_VMAP(a.r[i] + b.r[i]); }
static inline V operator-(const V& a, const V& b) { E_VMAP(a.r[i] - b.r[i]); }
static inline V operator*(const V& a, const V& b) { E_VMAP(a.r[i] * b.r[i]); }
static inline V operator/(const V& a, const V& b) { E_VMAP(a.r[i] / b.r[i]); }
static inline V operator-(const V& a) { E_VMAP(-a.r[i]); }
// as the scalar e_maximum/e_minimum: a where a > b (a < b) or a is NaN, else b
static inline e_v16 e_vmax16(e_v16 a, e_v16 b) { return (a > b || a != a) ? a : b; }
static inline e_v16 e_vmin16(e_v16 a, e_v16 b) { return (a < b || a != a) ? a : b; }
static inline V e_maximum(const V& a, const V& b) { E_VMAP(e_vmax16(a.r[i], b.r[i])); }
static inline V e_minimum(const V& a, const V& b) { E_VMAP(e_vmin16(a.r[i], b.r[i])); }
// vmaxps/vminps: the second operand where either is NaN (so clamp(x) keeps a NaN x)
static inline e_v16 e_vmaxps(e_v16 a, e_v16 b) { return __builtin_ia32_maxps512_mask(a, b, a, (uint16_t)-1, 4); }
static inline e_v16 e_vminps(e_v16 a, e_v16 b) { return __builtin_ia32_minps512_mask(a, b, a, (uint16_t)-1, 4); }
// exp: e_exp's Cody-Waite reduction and polynomial; x clamped to [-104, 89] first (NaN stays NaN),
// n = round(x / ln 2) by vrndscaleps, and p * 2^n by vscalefps, which rounds once and gets the
// subnormals, 0 and inf right: 14 instructions per 16 floats, the portable e_exp's ~25
static inline e_v16 e_vexp16(e_v16 x) {
  x = e_vminps(e_bc(89.0f), e_vmaxps(e_bc(-104.0f), x));
  e_v16 n = __builtin_ia32_rndscaleps_mask(x * 1.44269504088896341f, 0x08, x, (uint16_t)-1, 4);
  e_v16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  e_v16 p = 1.9875691500E-4f * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + (r + 1.0f);
  return __builtin_ia32_scalefps512_mask(p, n, p, (uint16_t)-1, 4);
}
// erf: e_erf's rational function, x * p / q as x * p * (1 / q) with 1 / q from vrcp14ps and one
// Newton step (relative error ~2^-28, under float's rounding): a 512-bit vdivps costs several FMAs.
static inline e_v16 e_verf16(e_v16 x) {
  e_v16 x2 = x * x;
@ERF_POLYNOMIALS_e_v16@
  e_v16 rq = __builtin_ia32_rcp14ps512_mask(q, q, (uint16_t)-1);
  rq = rq + rq * (1.0f - q * rq);
  e_v16 y = x * p * rq;  // NaN stays NaN (the selects below are false for it)
  // +-1 past +-4 (erf(4) rounds to 1 in float; the approximate 1 / q may not give exactly 1 there,
  // and gelu(-1e30) needs 1 + erf(x) = 0 exactly): two compares and two masked moves
  y = x > 4.0f ? e_bc(1.0f) : y;
  return x < -4.0f ? e_bc(-1.0f) : y;
}
// GELU, u / 2 * (1 + erf(u / sqrt(2))) (the erf form: layer_norm+GELU's row loop, ~20 of its ~30
// instructions per 16 floats): h + h * e with h = u / 2 and e = erf(u / sqrt(2)) from e_verf16's rational
// with the 1 / sqrt(2) folded into its coefficients (@GELU_SCALE@), and the saturation done by two
// vrangeps (|a| clamped to |b|, a's sign; one instruction each) in place of two compares and two masked
// moves: u to +-5.94 (erf's argument to +-4.2, where the rational is past 1 by 2.7e-6 and
// grows), then e to +-1 exactly, so h + h * e is exactly u (eager's value) above 5.94 and exactly 0
// below -5.94, huge u included (gelu(-1e30) = 0). vrangeps drops a NaN (it returns the other operand),
// which h carries through: NaN in, NaN out. Error against float64 gelu over [-8, 8]: 1.1e-6 absolute,
// the decomposed e_verf16 form's 1.5e-6 (tests/native/test_cpp_vector.py).
static inline e_v16 e_vrange_abs(e_v16 a, float b) { return __builtin_ia32_rangeps512_mask(a, e_bc(b), 2, a, (uint16_t)-1, 4); }
static inline e_v16 e_vgelu16(e_v16 u) {
  e_v16 h = u * 0.5f;
  e_v16 x = e_vrange_abs(u, 5.93969696f);
  e_v16 x2 = x * x;
@GELU_POLYNOMIALS_e_v16@
  e_v16 rq = __builtin_ia32_rcp14ps512_mask(q, q, (uint16_t)-1);
  rq = rq + rq * (1.0f - q * rq);
  e_v16 e = e_vrange_abs(x * p * rq, 1.0f);
  return h * e + h;
}
static inline V e_exp(const V& a) { E_VMAP(e_vexp16(a.r[i])); }
static inline V e_erf(const V& a) { E_VMAP(e_verf16(a.r[i])); }
static inline V e_gelu(const V& a) { E_VMAP(e_vgelu16(a.r[i])); }
static inline V e_sigmoid(const V& a) { return V(1.0f) / (V(1.0f) + e_exp(-a)); }
// the horizontal end of a V accumulator: halves folded (8, 4, 2, 1 lanes apart) with the combine's
// own semantics
template <class F> static inline float e_vfold(const V& a, F f) {
  e_v16 s = a.r[0];
  for (int i = 1; i < E_VN; ++i) s = f(s, a.r[i]);
  s = f(s, __builtin_shuffle(s, (e_i16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  s = f(s, __builtin_shuffle(s, (e_i16){4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}));
  s = f(s, __builtin_shuffle(s, (e_i16){2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
  s = f(s, __builtin_shuffle(s, (e_i16){1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}));
  return s[0];
}
static inline float e_vsum(const V& a) { return e_vfold(a, [](e_v16 x, e_v16 y) { return x + y; }); }
static inline float e_vmax(const V& a) { return e_vfold(a, e_vmax16); }
static inline float e_vmin(const V& a) { return e_vfold(a, e_vmin16); }
""".replace("@ERF_POLYNOMIALS_e_v16@", erf_polynomials("e_v16")).replace(
    "@GELU_POLYNOMIALS_e_v16@", erf_polynomials("e_v16", GELU_SCALE)).replace("@GELU_SCALE@", f"{GELU_SCALE!r}")


class VectorEmitter:
    """The V half of ``cpp_emit.CppKernelEmitter``: ``vmode`` is the reduced range's position while a V
    loop body is emitted (None otherwise), ``vnames`` the temporaries that hold a V."""

    vmode = None

    def _vector_wanted(self, reds, accs) -> bool:
        k = self.k
        if not vector_available(self.options) or k.single or len(k.reduced) != 1:
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
        self.vmode, self.vnames, self.vloads, self.vstores = r, set(), [], []
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
            if stage > min(self.stage_sets, default=0):
                inner.lines += self._prefetch_next_row()
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

    vloads: list = []  # (pointer, index) of the V loads of the loop being emitted
    vstores: list = []  # (pointer, index) of its V stores of graph outputs

    def _vector_lines(self, r, build):
        """The lines ``build()`` emits with V values along the reduced range ``r`` (a Welford stage's
        body: cpp_reduce._welford_stage), or None where V does not spell them or is not wanted."""
        if not self._vector_wanted([], {}):
            return None
        self.vmode, self.vnames, self.vloads, self.vstores = r, set(), [], []
        try:
            return build()
        except NoVector:
            return None
        finally:
            self.vmode, self.row_scope = None, None

    def _prefetch_next_row(self) -> list:
        """A later loop over the row (softmax's exp, layer_norm's GELU: computing, its data in L1)
        asks for the next row's lines of what it reads, so the next row's first loop, which only
        streams, finds them in cache: the memory traffic hides behind this row's arithmetic
        (layer_norm+GELU 1024x1024, 1 thread: ~15% faster on the development VM). The next row is
        the innermost kept index plus one (a row of another thread's block, or past the end, at a
        block's last row: a prefetch never faults). Such a loop also asks for the next row's lines of
        the outputs it stores, for writing: layer_norm+GELU 1024x1024, 1 thread, ~9% faster on the
        development VM (CPU time, harness of the generated kernel)."""
        if not self.kept:
            return []
        vk = self.vars[self.kept[-1]]
        out = []
        for ptr, index in dict.fromkeys(self.vloads):
            nxt = sympy.sympify(index).subs(vk, vk + 1)
            if nxt != index:
                out.append(f"e_vprefetch(&{ptr}[{self.index_str(nxt)}]);")
        for ptr, index in dict.fromkeys(self.vstores) if out else ():
            nxt = sympy.sympify(index).subs(vk, vk + 1)
            if nxt != index:
                out.append(f"e_vprefetchw(&{ptr}[{self.index_str(nxt)}]);")
        return out

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
        self.vloads.append((self.pointer(buf), index))
        return self._vemit(scope, f"e_vld(&{self.pointer(buf)}[{self.index_str(index)}])")

    def _vstore(self, name, v, scope) -> None:
        n = self.nodes[name]
        index = self.k.stores[name]
        if n.layout.dtype != torch.float32 or not self._contiguous(index):
            raise NoVector(f"store of {name}")
        v = v if v in self.vnames else f"V({v})"
        self.vstores.append((self.pointer(name, out=True), index))
        scope.lines.append(f"e_vst(&{self.pointer(name, out=True)}[{self.index_str(index)}], {v});")

    def _vop(self, e, args, code, scope) -> str:
        if e.op not in VECTOR_OPS or e.dtype != torch.float32 or any(a.dtype != torch.float32 for a in e.args):
            raise NoVector(f"op {e.op} ({e.dtype})")
        return self._vemit(scope, code)

    def _vgelu(self, e, scope):
        """``e_gelu(u)`` where ``e`` is GELU's erf form on a V ``u`` (``u * 0.5 * (erf(u * M_SQRT1_2) + 1)``,
        aten.gelu's decomposition, either operand order), else None: PRELUDE's e_vgelu16 saves the
        scaling multiply, the + 1 and two of the four saturation instructions of the spelled-out form."""
        u = gelu_operand(e)
        if u is None:
            return None
        uv = self.value(u, scope)
        if uv not in self.vnames:
            return None
        return self._vop(e, e.args, f"e_gelu({uv})", scope)

    def _vcheck_scalar(self, e) -> None:
        """Ops with no V spelling are fine on scalars only (a value fixed along the row)."""
        if e.op == "masked" or (e.op == "index" and self._vdepends(e.attr)):
            raise NoVector(e.op)
