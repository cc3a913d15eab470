"""C++ source for one scheduled ``Kernel``: the CPU renderer beside ``triton_emit``.

It reads the same ``Kernel`` objects the Triton renderer gets (fusion is decided once, by the
scheduler) and the same op spellings (the registry, ops.py, key "cpp"). The code is scalar C++ that
gcc vectorizes at ``-O3``:

* the kept (non-reduced) ranges become a nest of ``for`` loops, in the order of the ranges (the
  last one is usually the contiguous one); the outer ones run in an OpenMP ``parallel for`` when the
  kernel is large enough (``PARALLEL_NUMEL``), a pointwise kernel's innermost loop stays plain so gcc
  vectorizes it;
* a reduction kernel runs, per kept point, one loop nest over the reduced ranges per "stage" (a
  reduction reading an earlier reduction of the kernel, softmax's sum reading its max, runs in a later
  loop, as in Triton's looped reductions), with scalar accumulators; sums (the common case) carry an
  ``omp simd reduction`` so they vectorize without ``-ffast-math`` (which would break NaN/Inf); a
  division by a value fixed for the row (softmax's sum) is one reciprocal per row;
* var_mean's pair of sums (the lowering's two-pass spelling, lower_ops._var_mean) becomes one Welford
  pass over the row (``cpp_reduce``): 16 lanes of running (mean, M2) merged pairwise, the data
  shifted by the row's first element, eager's accuracy for rows far from zero;
* where the CPU has avx512f (option ``cpu_simd``), those row loops of fp32 reductions are written
  again as explicit AVX-512 code over 64 floats at a time (``cpp_vector``), the scalar loop running
  the tail;
* a one-stage reduction whose innermost range is kept (a bias gradient: a sum over rows) walks the rows
  in order and reduces a block of columns side by side (``cpp_reduce``), vectorized and contiguous,
  the blocks shared by the threads;
* a single-program kernel (``Kernel.single``) also reduces across the kept points (``xred``) and
  computes scalars from those (``final``), without threads.

Values are computed in their compute dtype (fp16/bf16 as float: converted on load and store, as the
Triton renderer does); index math is int64; sizes of dynamic shapes are arguments (``ks0``...).
Loads under ``masked`` (cat, pad) run inside an ``if``, so no address outside a buffer is read.
Anything this renderer cannot spell raises ``CppUnsupported``; the backend then runs that graph's ATen
code instead, with the reason logged.

This module holds the kernel's structure (values, loads, stores, loops); reductions live in
``cpp_reduce`` (a mixin of the emitter) and C spellings of types, literals and indices in
``cpp_spelling``.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch

from ember.native import ir, ops
from ember.native.cpp_prelude import PRELUDE  # the e_* helpers the registry's "cpp" spellings call
from ember.native.cpp_reduce import ReductionEmitter
from ember.native.cpp_tiles import TileEmitter
from ember.native.cpp_vector import PRELUDE as VECTOR_PRELUDE, NoVector, VectorEmitter
# (PARALLEL_NUMEL: re-exported for the tests that read the renderer's grain)
from ember.native.cpp_spelling import (LOW_PRECISION, PARALLEL_NUMEL, STORAGE, CppUnsupported, CScope,  # noqa: F401
                                       combine, compute_dtype, ctype, indent, literal, parallel_for, print_c)
from ember.native.scheduler import Kernel
from ember.native.scope import Names, node_value
from ember.native.symbolic import is_static

# integer ops that divide: by zero they record an error (eager raises)
INT_DIVISIONS = ("truncdiv", "floordiv", "remainder", "fmod")


@dataclasses.dataclass
class CppKernel:
    """What the wrapper needs of an emitted C++ kernel (the Triton renderer's EmittedKernel, for C)."""
    source: str                 # the function, named KERNEL_NAME until deduplicated
    kind: str                   # poi | red
    args: list                  # buffer names passed as pointers, in order
    xnumel: object
    rnumel: object
    comment: str                # provenance lines
    size_args: list = dataclasses.field(default_factory=list)  # size symbols passed as ks0, ks1...
    int32_limits: list = dataclasses.field(default_factory=list)  # (always empty: index math is int64)
    checked: bool = False       # may record an error the wrapper raises (cpp_build.check)
    vector: bool = False        # has explicit AVX-512 loops (cpp_vector: its prelude goes in the unit)
    renderer: str = "cpp"

    @property
    def symbolic(self) -> bool:
        return bool(self.size_args)


class CppKernelEmitter(ReductionEmitter, VectorEmitter, TileEmitter, Names):
    unknown_symbol = CppUnsupported  # (Names.size_name: a symbol C++ cannot name sends the graph to ATen)

    def __init__(self, k: Kernel, layouts: dict, options, sv: ir.SizeVars | None = None):
        self.k, self.layouts, self.options = k, layouts, options
        self.sv = sv or ir.SizeVars()
        self.size_names: dict = {}
        self.args: list = []
        self.ptr: dict = {}
        self.nodes = {n.name: n for n in k.nodes}
        self.tmp = 0
        self.outer_vals: dict = {}
        self.vars = ir.node_vars(len(k.ranges))
        self.kept = [i for i in range(len(k.ranges)) if i not in k.reduced]
        self.checked = False  # the kernel may record an error (see PRELUDE's ember_fail)
        self.row_cache, self.stage_sets, self._rdeps, self.row_in_output = {}, {}, {}, {}
        self.row_scope = None  # while a reduction loop is built: the scope of its row (values before the loop)
        self.welford: dict = {}  # sum node -> the sum of squared deviations from its mean (var_mean's pair)
        self.vnames: set = set()  # temporaries holding a V (cpp_vector), while a V loop is emitted
        self.vector = False       # some stage got a V loop
        self.staged = {}          # transposed loads read through local tiles (cpp_tiles)

    # -- names ---------------------------------------------------------------------------------
    def emit(self, scope, dtype, code) -> str:
        name = self.new_tmp()
        scope.lines.append(f"{ctype(dtype)} {name} = {code};")
        return name

    def index_str(self, expr, indirect=None) -> str:
        names = {**{v: f"v{i}" for i, v in enumerate(self.vars)}, **(indirect or {})}
        return print_c(sympy.sympify(expr), lambda s: names[s] if s in names else self.size_name(s))

    # -- expressions ---------------------------------------------------------------------------
    def value(self, e: ir.Expr, scope: CScope) -> str:
        hit = scope.lookup(e)
        if hit is not None:
            return hit
        if self.vmode is not None and self.row_scope is not None and scope is not self.row_scope \
                and not self._rdep(e) and not self._may_fail(e):
            # fixed along the row (layer_norm's rsqrt(var + eps)): once per row, before the V loop (gcc
            # left a scalar sqrt and division inside it)
            return self.value(e, self.row_scope)
        out = self._value(e, scope)
        scope.cache[e] = out
        return out

    def _value(self, e, scope):
        if self.vmode is not None:
            self._vcheck_scalar(e)
            if e.op == "mul":
                hit = self._vgelu(e, scope)
                if hit is not None:
                    return hit
        if e.op == "load":
            return self.load(e, scope)
        if e.op == "const":
            return self.emit(scope, compute_dtype(e.dtype), literal(e.attr, compute_dtype(e.dtype)))
        if e.op == "index":
            return self.emit(scope, e.dtype, f"({ctype(e.dtype)})({self.index_str(e.attr)})")
        if e.op == "cast":
            return self.cast(self.value(e.args[0], scope), e.args[0].dtype, e.dtype, scope)
        if e.op == "masked":
            # the body (and its loads) runs only where the mask holds; `other` elsewhere
            m = self.value(e.args[0], scope)
            out = self.emit(scope, compute_dtype(e.dtype), literal(e.attr, compute_dtype(e.dtype)))
            inner = CScope(scope)
            v = self.value(e.args[1], inner)
            inner.lines.append(f"{out} = {v};")
            scope.lines += [f"if ({m}) {{"] + indent(inner.lines) + ["}"]
            return out
        if e.op not in ops.OPS:
            raise CppUnsupported(f"IR op {e.op!r} has no C++ spelling")
        if e.op == "truediv" and self._row_invariant_divisor(e):
            # x / d with d fixed for the row (softmax's sum): one reciprocal per row and a multiply per
            # element, as eager's softmax kernel does (a vector division costs ~10x a multiply)
            num = self.value(e.args[0], scope)
            cdt = compute_dtype(e.dtype)
            rcp = self.value(ir.op("truediv", ir.const(1.0, cdt), e.args[1]), self.row_scope)
            if num in self.vnames:
                return self._vop(e, e.args, f"{num} * {rcp}", scope)
            return self.emit(scope, cdt, f"{num} * {rcp}")
        args = [self.value(a, scope) for a in e.args]
        if e.op in INT_DIVISIONS and not e.dtype.is_floating_point:
            self.checked = True
        if any(a in self.vnames for a in args):
            return self._vop(e, e.args, ops.render("cpp", e, args), scope)
        return self.emit(scope, compute_dtype(e.dtype), ops.render("cpp", e, args))

    def _may_fail(self, e) -> bool:
        """Whether computing ``e`` may record an error (an integer division, a gathered load): such a
        value is not moved out of a loop that might not run."""
        return any((x.op in INT_DIVISIONS and not x.dtype.is_floating_point) or (x.op == "load" and x.attr[2])
                   for x in ir.walk([e]))

    def _row_invariant_divisor(self, e) -> bool:
        return (self.row_scope is not None and e.dtype.is_floating_point and e.args[1].dtype == e.dtype
                and self._rdep(e.args[0]) and not self._rdep(e.args[1]))

    def cast(self, v, src, dst, scope):
        if v in self.vnames and (dst == torch.bool or compute_dtype(src) != compute_dtype(dst)
                                 or (dst in LOW_PRECISION and self.options.emulate_precision_casts)):
            raise NoVector(f"cast {src} -> {dst}")
        if dst == torch.bool:
            return self.emit(scope, dst, f"{v} != 0")
        if dst in LOW_PRECISION and self.options.emulate_precision_casts:
            fn = "e_round_bf16" if dst == torch.bfloat16 else "e_round_f16"
            return self.emit(scope, dst, f"{fn}((float)({v}))")
        if compute_dtype(src) == compute_dtype(dst):
            return v
        return self.emit(scope, dst, f"({ctype(dst)})({v})")

    def load(self, e, scope):
        buf, index, syms = e.attr
        if self.vmode is not None and buf not in self.nodes:
            hit = self._vload(e, scope)
            if hit is not None:
                return hit
        if buf in self.nodes:  # computed in this kernel: the scheduler checked the index matches
            return self.node_value(buf, scope)
        staged = self.staged_load(buf, index) if not syms else None
        if staged is not None:  # (fp32: no conversion)
            return self.emit(scope, torch.float32, staged)
        ind = {s: f"((int64_t){self.value(a, scope)})" for s, a in zip(syms, e.args)}
        ptr = self.pointer(buf)
        code = f"{ptr}[{self.index_str(index, ind)}]"
        if syms:  # a gathered index: checked against the buffer, as eager checks it (error 1)
            i = self.emit(scope, torch.int64, self.index_str(index, ind))
            n = self.index_str(self.layouts[buf].storage_numel)
            scope.lines.append(f"if ({i} < 0 || {i} >= {n}) {{ ember_fail(1); {i} = 0; }}")
            self.checked = True
            code = f"{ptr}[{i}]"
        dt = self.layouts[buf].dtype
        if dt == torch.bfloat16:
            code = f"e_bf16_load({code})"
        elif dt == torch.float16:
            code = f"(float)({code})"
        return self.emit(scope, compute_dtype(dt), code)

    # -- nodes ---------------------------------------------------------------------------------
    node_value = node_value  # (scope.py: shared by both renderers)

    def store(self, name, v, scope):
        if self.vmode is not None:
            return self._vstore(name, v, scope)
        n = self.nodes[name]
        ptr = self.pointer(name, out=True)
        dt = n.layout.dtype
        if dt == torch.bfloat16:
            v = f"e_bf16_store({v})"
        elif dt == torch.float16:
            v = f"(_Float16)({v})"
        scope.lines.append(f"{ptr}[{self.index_str(self.k.stores[name])}] = {v};")

    def stages(self):
        """Loop stage of every node: a reduction reading an earlier reduction of this kernel runs in
        a later loop over the reduced ranges (as triton_emit's looped reductions)."""
        st = {}
        for n in self.k.nodes:
            role = self.k.roles[n.name]
            if role == "final":
                continue
            deps = [l.attr[0] for l in ir.loads_of(self.k.bodies[n.name]) if l.attr[0] in self.nodes]
            s = 0 if role not in ("outer", "xred") else -1
            for d in deps:
                if role in ("outer", "xred"):
                    s = max(s, st[d])
                elif self.welford.get(d) == n.name:  # one Welford pass computes both
                    s = max(s, st[d])
                else:
                    s = max(s, st[d] if self.k.roles[d] == "inner" else st[d] + 1)
            st[n.name] = s
        return st

    # -- loops ---------------------------------------------------------------------------------
    def _loops(self, positions, body_lines, pragma=None, start="0") -> list:
        """A loop nest over ``positions``; the innermost loop from ``start`` (a V loop's scalar tail)."""
        lines = []
        for depth, i in enumerate(positions):
            r = self.index_str(self.k.ranges[i])
            first = start if depth == len(positions) - 1 else "0"
            lines.append("  " * depth + f"for (int64_t v{i} = {first}; v{i} < {r}; ++v{i}) {{")
        if pragma and positions:
            lines.insert(pragma[1], "  " * pragma[1] + pragma[0])
        lines += indent(body_lines, len(positions))
        lines += ["  " * d + "}" for d in reversed(range(len(positions)))]
        return lines

    def _parallel_pragma(self, nkept, pointwise):
        """The OpenMP pragma over the outer kept loops: all of them for a reduction, all but the
        innermost for a pointwise kernel (whose inner loop gcc vectorizes)."""
        if self.k.single or nkept == 0:
            return None
        collapse = nkept - 1 if pointwise and nkept > 1 else nkept
        numel = self.index_str(self.k.numel)
        clause = f" collapse({collapse})" if collapse > 1 else ""
        return (parallel_for(clause, numel), 0)

    # -- the kernel ----------------------------------------------------------------------------
    def generate(self) -> CppKernel:
        k = self.k
        body = self._column_body() if self._columns_fit() else self._row_body()
        params = []
        for b in self.args:
            dt = self.layouts[b].dtype
            if dt not in STORAGE:
                raise CppUnsupported(f"buffer {b} of dtype {dt}")
            const = "" if self.ptr[b].startswith("out_") else "const "
            params.append(f"{const}{STORAGE[dt]}* __restrict__ {self.ptr[b]}")
        params += [f"int64_t {self.size_names[s]}" for s in self.size_names]
        src = [f'extern "C" void KERNEL_NAME({", ".join(params)}) {{'] + indent(body) + ["}"]
        from ember.native.triton_emit import provenance
        return CppKernel("\n".join(src) + "\n", "red" if k.is_reduction else "poi", list(self.args), k.xnumel,
                         k.rnumel, provenance(k).replace("# ", "// "), size_args=list(self.size_names),
                         checked=self.checked, vector=self.vector)

    def _row_body(self) -> list:
        k = self.k
        top = CScope()   # function level: cross-x accumulators (single), final scalars
        xs = CScope(top)  # one kept point
        xaccs = []
        if not k.is_reduction:
            self.staged = self._tile_plan()
            for n in k.nodes:
                v = self.node_value(n.name, xs)
                if n.name not in k.local:
                    self.store(n.name, v, xs)
        else:
            self.welford = self._welford_pairs()
            stages = self.stages()
            if not self._welford_fits(stages):
                self.welford = {}
                stages = self.stages()
            nstages = max(list(stages.values()) + [0]) + 1
            plan = {}
            for s in range(nstages):
                reds = [n for n in k.nodes if k.roles[n.name] == "red" and stages[n.name] == s]
                stores = [n for n in k.nodes if k.roles[n.name] == "inner" and stages[n.name] == s
                          and n.name not in k.local]
                if reds or stores:
                    plan[s] = (reds, stores)
            squares = set(self.welford.values())  # (their bodies are not computed: Welford's update is)
            self._plan_row_cache({s: [n for n in r if n.name not in squares] + st for s, (r, st) in plan.items()}, xs)
            for s in range(-1, nstages):
                if s in plan:
                    self._reduce_stage(xs, plan[s][0], plan[s][1], k.nodes, s)
                for n in k.nodes:
                    if k.roles[n.name] in ("outer", "xred") and stages[n.name] == s:
                        v = self.value(k.bodies[n.name], xs)
                        if k.roles[n.name] == "xred":
                            acc = self._init_acc(n, top)
                            xs.lines.append(f"{acc[0]} = {combine(n.reduction_type, acc[0], v)};")
                            xaccs.append((n, acc))
                            continue
                        self.outer_vals[n.name] = self.cast(v, k.bodies[n.name].dtype, n.layout.dtype, xs)
                        if n.name not in k.local:
                            self.store(n.name, self.outer_vals[n.name], xs)
        body = list(top.lines)
        top.lines = []
        if self.staged:
            body += self._tiled_loops(xs.lines)
        else:
            pragma = self._parallel_pragma(len(self.kept), not k.is_reduction)
            body += self._loops(self.kept, xs.lines, pragma)
        fin = CScope(top)
        for n, acc in xaccs:
            self.outer_vals[n.name] = self.cast(acc[0], k.bodies[n.name].dtype, n.layout.dtype, fin)
            if n.name not in k.local:
                self.store(n.name, self.outer_vals[n.name], fin)
        for n in k.nodes:
            if k.roles[n.name] == "final":
                v = self.value(k.bodies[n.name], fin)
                self.outer_vals[n.name] = self.cast(v, k.bodies[n.name].dtype, n.layout.dtype, fin)
                if n.name not in k.local:
                    self.store(n.name, self.outer_vals[n.name], fin)
        body += top.lines + fin.lines
        return body


def kernel_name(k: Kernel, kind: str, i: int) -> str:
    from ember.native.triton_emit import kernel_name as triton_name
    return "cpp" + triton_name(k, kind, i).removeprefix("triton")


def emit_kernel(k: Kernel, layouts: dict, options, sv: ir.SizeVars | None = None) -> CppKernel:
    if not all(is_static(r) or isinstance(r, sympy.Basic) for r in k.ranges):
        raise CppUnsupported(f"ranges {k.ranges}")
    return CppKernelEmitter(k, layouts, options, sv).generate()


def translation_unit(kernels: list) -> str:
    """One C++ file for a graph's kernels ``[(name, CppKernel)]``: one compiler run per graph."""
    parts = ["// ember native C++ kernels: generated code, do not edit", PRELUDE]
    if any(ck.vector for _, ck in kernels):
        parts.append(VECTOR_PRELUDE)
    for name, ck in kernels:
        parts += [f"// {name} ({ck.kind})", ck.comment, ck.source.replace("KERNEL_NAME", name)]
    return "\n".join(parts) + "\n"
