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
  pass over the row (``_welford_stage``): 16 lanes of running (mean, M2) merged pairwise, the data
  shifted by the row's first element, eager's accuracy for rows far from zero;
* a one-stage reduction whose innermost range is kept (a bias gradient: a sum over rows) walks the rows
  in order and reduces a block of columns side by side (``_column_body``), vectorized and contiguous,
  the blocks shared by the threads;
* a single-program kernel (``Kernel.single``) also reduces across the kept points (``xred``) and
  computes scalars from those (``final``), without threads.

Values are computed in their compute dtype (fp16/bf16 as float: converted on load and store, as the
Triton renderer does); index math is int64; sizes of dynamic shapes are arguments (``ks0``...).
Loads under ``masked`` (cat, pad) run inside an ``if``, so no address outside a buffer is read.
Anything this renderer cannot spell raises ``CppUnsupported``; the backend then runs that graph's ATen
code instead, with the reason logged.
"""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ember.native import ir, ops
from ember.native.scope import Names, Scope, node_value
from ember.native.cpp_prelude import PRELUDE  # the e_* helpers the registry's "cpp" spellings call
from ember.native.scheduler import Kernel
from ember.native.symbolic import FloorDiv, IMod, is_static

# the C type of a buffer's elements, and the type values of that dtype are computed in
STORAGE = {torch.float32: "float", torch.float64: "double", torch.float16: "_Float16", torch.bfloat16: "uint16_t",
           torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
           torch.uint8: "uint8_t", torch.bool: "bool"}
LOW_PRECISION = (torch.float16, torch.bfloat16)
# points per thread of a kernel's parallel region (kernels under two of these run on one thread: a
# parallel region costs a few microseconds, and far more when the machine is oversubscribed)
PARALLEL_NUMEL = 1 << 15
# rows up to this many elements keep costly values a later loop needs in a stack buffer (32 KiB of fp32)
ROW_CACHE_NUMEL = 8192
# column reductions: kept points reduced side by side per block (accumulators on the stack)
COLUMN_BLOCK = 256
# Welford lanes: one AVX-512 vector of floats (two AVX2 vectors)
WELFORD_LANES = 16
COSTLY = ops.HEAVY | {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "sin", "cos", "truediv"}
# integer ops that divide: by zero they record an error (eager raises)
INT_DIVISIONS = ("truncdiv", "floordiv", "remainder", "fmod")


class CppUnsupported(Exception):
    """Something the C++ renderer cannot spell: the graph runs its ATen code instead."""


def compute_dtype(dt):
    return torch.float32 if dt in LOW_PRECISION else dt


def ctype(dt) -> str:
    if dt not in STORAGE:
        raise CppUnsupported(f"dtype {dt} has no C++ spelling")
    return "float" if dt in LOW_PRECISION else STORAGE[dt]


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
    renderer: str = "cpp"

    @property
    def symbolic(self) -> bool:
        return bool(self.size_args)


class _Scope(Scope):
    """A block of C++ code; a loop body or an ``if`` gets a child scope (``scope.Scope``)."""


def _indent(lines, n=1):
    return ["  " * n + l for l in lines]


class CppKernelEmitter(Names):
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
        self.row_cache, self.stage_sets, self._rdeps = {}, {}, {}
        self.row_scope = None  # while a reduction loop is built: the scope of its row (values before the loop)
        self.welford: dict = {}  # sum node -> the sum of squared deviations from its mean (var_mean's pair)

    # -- names ---------------------------------------------------------------------------------
    def emit(self, scope, dtype, code) -> str:
        name = self.new_tmp()
        scope.lines.append(f"{ctype(dtype)} {name} = {code};")
        return name

    def size_name(self, s) -> str:
        if not ir.is_size_symbol(s):
            raise CppUnsupported(f"symbol {s} in an index expression")
        if s not in self.size_names:
            self.size_names[s] = f"ks{len(self.size_names)}"
        return self.size_names[s]

    def index_str(self, expr, indirect=None) -> str:
        names = {**{v: f"v{i}" for i, v in enumerate(self.vars)}, **(indirect or {})}
        return _print_c(sympy.sympify(expr), lambda s: names[s] if s in names else self.size_name(s))

    # -- expressions ---------------------------------------------------------------------------
    def value(self, e: ir.Expr, scope: _Scope) -> str:
        hit = scope.lookup(e)
        if hit is not None:
            return hit
        out = self._value(e, scope)
        scope.cache[e] = out
        return out

    def _value(self, e, scope):
        if e.op == "load":
            return self.load(e, scope)
        if e.op == "const":
            return self.emit(scope, compute_dtype(e.dtype), _literal(e.attr, compute_dtype(e.dtype)))
        if e.op == "index":
            return self.emit(scope, e.dtype, f"({ctype(e.dtype)})({self.index_str(e.attr)})")
        if e.op == "cast":
            return self.cast(self.value(e.args[0], scope), e.args[0].dtype, e.dtype, scope)
        if e.op == "masked":
            # the body (and its loads) runs only where the mask holds; `other` elsewhere
            m = self.value(e.args[0], scope)
            out = self.emit(scope, compute_dtype(e.dtype), _literal(e.attr, compute_dtype(e.dtype)))
            inner = _Scope(scope)
            v = self.value(e.args[1], inner)
            inner.lines.append(f"{out} = {v};")
            scope.lines += [f"if ({m}) {{"] + _indent(inner.lines) + ["}"]
            return out
        if e.op not in ops.OPS:
            raise CppUnsupported(f"IR op {e.op!r} has no C++ spelling")
        if e.op == "truediv" and self._row_invariant_divisor(e):
            # x / d with d fixed for the row (softmax's sum): one reciprocal per row and a multiply per
            # element, as eager's softmax kernel does (a vector division costs ~10x a multiply)
            num = self.value(e.args[0], scope)
            cdt = compute_dtype(e.dtype)
            rcp = self.value(ir.op("truediv", ir.const(1.0, cdt), e.args[1]), self.row_scope)
            return self.emit(scope, cdt, f"{num} * {rcp}")
        args = [self.value(a, scope) for a in e.args]
        if e.op in INT_DIVISIONS and not e.dtype.is_floating_point:
            self.checked = True
        return self.emit(scope, compute_dtype(e.dtype), ops.render("cpp", e, args))

    def _row_invariant_divisor(self, e) -> bool:
        return (self.row_scope is not None and e.dtype.is_floating_point and e.args[1].dtype == e.dtype
                and self._rdep(e.args[0]) and not self._rdep(e.args[1]))

    def cast(self, v, src, dst, scope):
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
        if buf in self.nodes:  # computed in this kernel: the scheduler checked the index matches
            return self.node_value(buf, scope)
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
    def _loops(self, positions, body_lines, pragma=None) -> list:
        lines = []
        for depth, i in enumerate(positions):
            r = self.index_str(self.k.ranges[i])
            lines.append("  " * depth + f"for (int64_t v{i} = 0; v{i} < {r}; ++v{i}) {{")
        if pragma and positions:
            lines.insert(pragma[1], "  " * pragma[1] + pragma[0])
        lines += _indent(body_lines, len(positions))
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
        return (_parallel_for(clause, numel), 0)

    # -- row buffers: a costly value a later loop needs again is kept, not recomputed -------------
    def _stage_exprs(self, nodes) -> set:
        """The r-dependent Exprs a stage computes for ``nodes`` (in-kernel inner nodes expanded)."""
        roots, out, seen = [self.k.bodies[n.name] for n in nodes], set(), set()
        while roots:
            for e in ir.walk(roots):
                if e in seen:
                    continue
                seen.add(e)
                if self._rdep(e):
                    out.add(e)
            roots = [self.k.bodies[e.attr[0]] for e in seen if e.op == "load" and e.attr[0] in self.nodes
                     and self.k.roles[e.attr[0]] == "inner" and self.k.bodies[e.attr[0]] not in seen]
        return out

    def _rdep(self, e) -> bool:
        hit = self._rdeps.get(e)
        if hit is None:
            rv = {self.vars[i] for i in self.k.reduced}
            if e.op == "load" and e.attr[0] in self.nodes:
                hit = self.k.roles[e.attr[0]] == "inner"
            elif e.op in ("load", "index"):
                index = e.attr[1] if e.op == "load" else e.attr
                hit = bool(rv & index.free_symbols) or any(self._rdep(a) for a in e.args)
            else:
                hit = any(self._rdep(a) for a in e.args)
            self._rdeps[e] = hit
        return hit

    def _plan_row_cache(self, stage_nodes: dict, scope) -> None:
        """Keep in a per-row stack buffer each costly value (exp, erf, a division...) that a later
        stage recomputes: softmax's exp(x - max) is computed for the sum and read back to normalize.
        Static rows up to ROW_CACHE_NUMEL only, and not under ``masked`` (its values live in an if)."""
        k = self.k
        self.row_cache, self.stage_sets = {}, {}
        if not is_static(k.rnumel) or k.rnumel > ROW_CACHE_NUMEL or k.single or len(stage_nodes) < 2:
            return
        for s, nodes in sorted(stage_nodes.items()):
            self.stage_sets[s] = self._stage_exprs(nodes)
        if any(e.op == "masked" for es in self.stage_sets.values() for e in es):
            return
        first = {}
        for s, es in sorted(self.stage_sets.items()):
            for e in es:
                if e in first:
                    if e not in self.row_cache and e.op not in ("load", "const", "index", "cast") \
                            and any(x.op in COSTLY for x in ir.walk([e])):
                        buf = f"row{len(self.row_cache)}"
                        self.row_cache[e] = (buf, first[e])
                        scope.lines.append(f"{ctype(compute_dtype(e.dtype))} {buf}[{k.rnumel}];")
                else:
                    first[e] = s

    def _reduce_stage(self, scope, reds, stores, all_nodes, stage=0):
        """One loop nest over the reduced ranges: accumulate ``reds``, store the inner nodes ``stores``."""
        k = self.k
        if any(n.name in self.welford for n in reds):
            return self._welford_stage(scope, reds, stores, all_nodes, stage)
        accs = {n.name: self._init_acc(n, scope) for n in reds}
        inner = _Scope(scope)
        rvars = list(k.reduced)
        rlin = self.index_str(_linear(self.vars, k.ranges, rvars))
        mine = self.stage_sets.get(stage, ())
        for e, (buf, s0) in self.row_cache.items():
            if s0 < stage and e in mine:  # computed by an earlier loop of this row
                inner.cache[e] = self.emit(inner, compute_dtype(e.dtype), f"{buf}[{rlin}]")
        self.row_scope = scope
        for n in all_nodes:
            if n in reds:
                self._accumulate(n, self.value(k.bodies[n.name], inner), accs[n.name], inner, rvars)
            elif n in stores:
                self.store(n.name, self.node_value(n.name, inner), inner)
        for e, (buf, s0) in self.row_cache.items():
            if s0 == stage:
                inner.lines.append(f"{buf}[{rlin}] = {self.value(e, inner)};")
        self.row_scope = None
        simd = None
        clauses = [_SIMD_REDUCTION.get(n.reduction_type) for n in reds]
        if reds and all(clauses) and all(accs[n.name][1] != torch.bool for n in reds):
            # reductions vectorize only when declared (without -ffast-math gcc keeps the order; max
            # and min are our NaN-propagating ones, PRELUDE's `declare reduction`)
            simd = ("#pragma omp simd " + " ".join(f"reduction({c}:{accs[n.name][0]})" for c, n in zip(clauses, reds)),
                    len(rvars) - 1)
        scope.lines += self._loops(rvars, inner.lines, simd)
        for n in reds:
            r = self._finish_acc(n, accs[n.name], scope)
            self.outer_vals[n.name] = self.cast(r, k.bodies[n.name].dtype, n.layout.dtype, scope)
            if n.name not in k.local:
                self.store(n.name, self.outer_vals[n.name], scope)

    # -- Welford: var/var_mean/layer_norm statistics in one pass ----------------------------------
    def _welford_pairs(self) -> dict:
        """{sum node: squares node} for the lowering's var_mean pair ``A = sum(x)``, ``B = sum((x -
        A / n) ** 2)`` over one contiguous reduced range of static length (lower_ops._var_mean). One
        Welford pass computes both: the mean without a large running sum (eager's own layer_norm and
        var use Welford too), and one pass over the row less."""
        k = self.k
        if len(k.reduced) != 1 or not is_static(k.rnumel) or k.single or k.rnumel < 2 * WELFORD_LANES:
            return {}
        sums = {n.name: n for n in k.nodes if k.roles[n.name] == "red" and n.reduction_type == "sum"
                and k.bodies[n.name].dtype in (torch.float32, torch.float64)}
        pairs = {}
        for b in sums.values():
            sq = k.bodies[b.name]
            if sq.op != "mul" or sq.args[0] != sq.args[1] or sq.args[0].op != "sub":
                continue
            x, mean = sq.args[0].args
            if mean.op != "truediv" or mean.args[0].op != "load" or mean.args[1].op != "const":
                continue
            a = mean.args[0].attr[0]
            if (a in sums and a not in pairs and k.bodies[a] == x and mean.args[1].attr == k.rnumel
                    and x.dtype == sq.dtype and not self._loads_node(x, a)):
                pairs[a] = b.name
        return pairs

    def _loads_node(self, e, name) -> bool:
        return any(l.attr[0] == name for l in ir.loads_of(e))

    def _welford_fits(self, stages) -> bool:
        """Each stage's reductions are all Welford pairs or none (the blocked loop is all or nothing)."""
        squares = set(self.welford.values())
        by_stage: dict = {}
        for n in self.k.nodes:
            if self.k.roles[n.name] == "red":
                by_stage.setdefault(stages[n.name], []).append(n.name in self.welford or n.name in squares)
        return all(all(v) or not any(v) for v in by_stage.values())

    def _welford_stage(self, scope, reds, stores, all_nodes, stage):
        """The row in blocks of WELFORD_LANES: lane ``l`` keeps the running mean and squared deviations
        of elements ``l, l + W, ...`` (equal counts, so one reciprocal per block), ``omp simd`` over the
        lanes; the lanes merge pairwise (Chan et al.), then the tail elements update the merged result."""
        k = self.k
        (r,) = k.reduced
        n_r = int(k.rnumel)
        lanes = WELFORD_LANES
        full = n_r // lanes * lanes
        pairs = [(n, self.nodes[self.welford[n.name]]) for n in reds if n.name in self.welford]
        names = {}
        for a, b in pairs:
            t = ctype(compute_dtype(k.bodies[a.name].dtype))
            w = f"wf{len(names)}"
            names[a.name] = (w, t)
            scope.lines.append(f"{t} {w}_m[{lanes}] = {{}}, {w}_m2[{lanes}] = {{}};")
        rvar = f"v{r}"
        mine = self.stage_sets.get(stage, ())

        def body(update):
            inner = _Scope(scope)
            for e, (buf, s0) in self.row_cache.items():
                if s0 < stage and e in mine:
                    inner.cache[e] = self.emit(inner, compute_dtype(e.dtype), f"{buf}[{rvar}]")
            self.row_scope = scope
            for n in all_nodes:
                if n.name in names:
                    x = self.value(k.bodies[n.name], inner)
                    inner.lines += update(names[n.name], x)
                elif n in stores:
                    self.store(n.name, self.node_value(n.name, inner), inner)
            for e, (buf, s0) in self.row_cache.items():
                if s0 == stage:
                    inner.lines.append(f"{buf}[{rvar}] = {self.value(e, inner)};")
            self.row_scope = None
            return inner.lines

        def lane_update(wt, x):
            w, t = wt
            return [f"{t} {w}_x = {x} - {w}_k;", f"{t} {w}_d = {w}_x - {w}_m[vl];",
                    f"{w}_m[vl] += {w}_d * wrc;", f"{w}_m2[vl] += {w}_d * ({w}_x - {w}_m[vl]);"]

        def tail_update(wt, x):
            w, t = wt
            return [f"{t} {w}_x = {x} - {w}_k;", f"{t} {w}_d = {w}_x - {w}_mean;",
                    f"{w}_mean += {w}_d / ({t})wn;", f"{w}_M2 += {w}_d * ({w}_x - {w}_mean);"]

        # the row's first element shifts the data (x - k is exact near k), so the running means stay
        # small and keep their digits: rows far from zero (1e4 + randn) get eager's accuracy
        first = _Scope(scope)
        first.lines.append(f"const int64_t {rvar} = 0;")
        for a, _ in pairs:
            w, t = names[a.name]
            x0 = self.value(k.bodies[a.name], first)
            first.lines.append(f"{w}_k = std::isfinite({x0}) ? {x0} : {t}(0);")
        for w, t in names.values():
            scope.lines.append(f"{t} {w}_k;")
        scope.lines += ["{"] + _indent(first.lines) + ["}"]
        t0 = names[pairs[0][0].name][1]
        scope.lines.append(f"for (int64_t vb = 0; vb < {full}; vb += {lanes}) {{")
        scope.lines.append(f"  const {t0} wrc = {t0}(1) / {t0}(vb / {lanes} + 1);")
        scope.lines.append("  #pragma omp simd")
        scope.lines.append(f"  for (int64_t vl = 0; vl < {lanes}; ++vl) {{")
        scope.lines.append(f"    const int64_t {rvar} = vb + vl;")
        scope.lines += _indent(body(lane_update), 2)
        scope.lines += ["  }", "}"]
        for w, t in names.values():
            scope.lines.append(f"{t} {w}_mean, {w}_M2;")
            scope.lines.append(f"e_welford_lanes<{t}, {lanes}>({w}_m, {w}_m2, {full // lanes}, {w}_mean, {w}_M2);")
        if full < n_r:
            scope.lines.append(f"int64_t wn = {full};")
            scope.lines.append(f"for (int64_t {rvar} = {full}; {rvar} < {n_r}; ++{rvar}) {{")
            scope.lines.append("  ++wn;")
            scope.lines += _indent(body(tail_update))
            scope.lines.append("}")
        for a, b in pairs:
            w, t = names[a.name]
            # (an infinite element makes the mean NaN, as eager's Welford does: var_mean([1, inf]) = (nan, nan))
            scope.lines.append(f"{w}_mean += {w}_k;")
            # readers of the mean (A / n, the lowering's spelling) get Welford's mean itself
            for e in ir.walk([k.bodies[b.name]]):
                if e.op == "truediv" and e.args[0].op == "load" and e.args[0].attr[0] == a.name:
                    scope.cache[e] = f"{w}_mean"
            self.outer_vals[a.name] = self.cast(f"({w}_mean * {t}({n_r}))", k.bodies[a.name].dtype, a.layout.dtype, scope)
            self.outer_vals[b.name] = self.cast(f"{w}_M2", k.bodies[b.name].dtype, b.layout.dtype, scope)
            for n in (a, b):
                if n.name not in k.local:
                    self.store(n.name, self.outer_vals[n.name], scope)

    def _init_acc(self, n, scope):
        rt = n.reduction_type
        cdt = compute_dtype(self.k.bodies[n.name].dtype)
        name = f"acc{self.tmp}"
        self.tmp += 1
        if rt in ("any", "all"):
            scope.lines.append(f"bool {name} = {'false' if rt == 'any' else 'true'};")
            return name, None
        if rt in ("argmax", "argmin"):
            scope.lines.append(f"{ctype(cdt)} {name} = {_identity('max' if rt == 'argmax' else 'min', cdt)};")
            scope.lines.append(f"int64_t {name}_idx = 0;")
            return name, cdt
        scope.lines.append(f"{ctype(cdt)} {name} = {_identity(rt, cdt)};")
        return name, cdt

    def _accumulate(self, n, v, acc, scope, rvars):
        a, cdt = acc
        rt = n.reduction_type
        if rt in ("argmax", "argmin"):
            # the first extreme wins; a NaN counts as the extreme (and the first NaN stays)
            rindex = self.index_str(_linear(self.vars, self.k.ranges, rvars))
            cmp = ">" if rt == "argmax" else "<"
            scope.lines.append(f"if (!({a} != {a}) && ({v} != {v} || {v} {cmp} {a})) {{ {a} = {v}; {a}_idx = {rindex}; }}")
            return
        scope.lines.append(f"{a} = {_combine(rt, a, v)};")

    def _finish_acc(self, n, acc, scope):
        return f"{acc[0]}_idx" if n.reduction_type in ("argmax", "argmin") else acc[0]

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
        src = [f'extern "C" void KERNEL_NAME({", ".join(params)}) {{'] + _indent(body) + ["}"]
        from ember.native.triton_emit import provenance
        return CppKernel("\n".join(src) + "\n", "red" if k.is_reduction else "poi", list(self.args), k.xnumel,
                         k.rnumel, provenance(k).replace("# ", "// "), size_args=list(self.size_names),
                         checked=self.checked)

    # -- column reductions: the reduced ranges outside the contiguous one (a bias gradient) ------
    def _columns_fit(self) -> bool:
        """A one-stage reduction whose innermost range is kept (sum over the rows of a matrix): its
        rows are walked in order and the kept points of a block are reduced side by side, vectorized,
        instead of one strided pass per kept point."""
        k = self.k
        last = len(k.ranges) - 1
        if not k.is_reduction or k.single or last in k.reduced or not k.ranges:
            return False
        n = k.ranges[last]
        if is_static(n) and n < 16:
            return False
        stages = self.stages()
        for node in k.nodes:
            role = k.roles[node.name]
            if stages[node.name] != 0 or role not in ("inner", "red", "outer"):
                return False
            if role == "red" and node.reduction_type not in ("sum", "prod", "max", "min", "any", "all"):
                return False
        return any(k.roles[node.name] == "red" for node in k.nodes)

    def _column_body(self) -> list:
        k = self.k
        last = len(k.ranges) - 1
        outer = [i for i in self.kept if i != last]
        n = self.index_str(k.ranges[last])
        # blocks of up to COLUMN_BLOCK columns, at least 8 of them where the columns allow (the blocks
        # are what threads share: 256 columns in one block would leave one thread working)
        b = COLUMN_BLOCK if not is_static(k.ranges[last]) else \
            max(16, min(COLUMN_BLOCK, 1 << max(0, (int(k.ranges[last]) // 8).bit_length() - 1)))
        top = _Scope()
        blk = _Scope(top)
        reds = [node for node in k.nodes if k.roles[node.name] == "red"]
        accs = {}
        for node in reds:
            rt, cdt = node.reduction_type, compute_dtype(k.bodies[node.name].dtype)
            name = f"acc{self.tmp}"
            self.tmp += 1
            t = "bool" if rt in ("any", "all") else ctype(cdt)
            init = {"any": "false", "all": "true"}.get(rt) or _identity(rt, cdt)
            blk.lines.append(f"{t} {name}[{b}];")
            blk.lines.append(f"for (int64_t vi = 0; vi < {b}; ++vi) {name}[vi] = {init};")
            accs[node.name] = name
        inner = _Scope(blk)
        inner.lines.append(f"const int64_t v{last} = vb + vi;")
        for node in k.nodes:
            if node.name in accs:
                v = self.value(k.bodies[node.name], inner)
                a = f"{accs[node.name]}[vi]"
                inner.lines.append(f"{a} = {_combine(node.reduction_type, a, v)};")
            elif k.roles[node.name] == "inner" and node.name not in k.local:
                self.store(node.name, self.node_value(node.name, inner), inner)
        simd = ["#pragma omp simd", "for (int64_t vi = 0; vi < vn; ++vi) {"] + _indent(inner.lines) + ["}"]
        blk.lines += self._loops(list(k.reduced), simd)
        epi = _Scope(blk)
        epi.lines.append(f"const int64_t v{last} = vb + vi;")
        for node in k.nodes:
            role = k.roles[node.name]
            if role == "inner":
                continue
            if role == "red":
                v = f"{accs[node.name]}[vi]"
            else:
                v = self.value(k.bodies[node.name], epi)
            self.outer_vals[node.name] = self.cast(v, k.bodies[node.name].dtype, node.layout.dtype, epi)
            if node.name not in k.local:
                self.store(node.name, self.outer_vals[node.name], epi)
        blk.lines += ["for (int64_t vi = 0; vi < vn; ++vi) {"] + _indent(epi.lines) + ["}"]
        block = [f"for (int64_t vb = 0; vb < {n}; vb += {b}) {{", f"  const int64_t vn = std::min<int64_t>({b}, {n} - vb);"]
        block += _indent(blk.lines) + ["}"]
        numel = self.index_str(k.numel)
        collapse = len(outer) + 1
        clause = f" collapse({collapse})" if collapse > 1 else ""
        pragma = (_parallel_for(clause, numel), 0)
        if outer:
            return top.lines + self._loops(outer, block, pragma)
        return top.lines + [pragma[0]] + block

    def _row_body(self) -> list:
        k = self.k
        top = _Scope()   # function level: cross-x accumulators (single), final scalars
        xs = _Scope(top)  # one kept point
        xaccs = []
        if not k.is_reduction:
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
                            xs.lines.append(f"{acc[0]} = {_combine(n.reduction_type, acc[0], v)};")
                            xaccs.append((n, acc))
                            continue
                        self.outer_vals[n.name] = self.cast(v, k.bodies[n.name].dtype, n.layout.dtype, xs)
                        if n.name not in k.local:
                            self.store(n.name, self.outer_vals[n.name], xs)
        body = list(top.lines)
        top.lines = []
        pragma = self._parallel_pragma(len(self.kept), not k.is_reduction)
        body += self._loops(self.kept, xs.lines, pragma)
        fin = _Scope(top)
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


def _parallel_for(clause, numel) -> str:
    """OpenMP over the outer loops with at most one thread per PARALLEL_NUMEL points (ATen's grain:
    eager runs an op of 32K elements on one thread, and so do we), none below two grains."""
    return (f"#pragma omp parallel for{clause} num_threads(e_threads({numel}, {PARALLEL_NUMEL})) "
            f"if(({numel}) >= {2 * PARALLEL_NUMEL})")


_SIMD_REDUCTION = {"sum": "+", "prod": "*", "max": "e_max", "min": "e_min"}


def _combine(rt, a, v) -> str:
    return {"sum": f"{a} + {v}", "prod": f"{a} * {v}", "max": f"e_maximum({a}, {v})",
            "min": f"e_minimum({a}, {v})", "any": f"{a} || ({v} != 0)", "all": f"{a} && ({v} != 0)"}[rt]


def _linear(vars_, ranges, positions):
    """The row-major position of the point among the ranges at ``positions`` (an argmax's index)."""
    out, stride = sympy.Integer(0), sympy.Integer(1)
    for i in reversed(positions):
        out, stride = out + vars_[i] * stride, stride * ranges[i]
    return out


def _identity(rt, dt) -> str:
    if rt in ("sum", "any"):
        return "0"
    if rt in ("prod", "all"):
        return "1"
    if dt.is_floating_point:
        inf = f"std::numeric_limits<{ctype(dt)}>::infinity()"
        return f"-{inf}" if rt == "max" else inf
    if dt == torch.bool:
        return "false" if rt == "max" else "true"
    return f"std::numeric_limits<{ctype(dt)}>::{'lowest' if rt == 'max' else 'max'}()"


def _literal(value, dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        t = ctype(dtype)
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return repr(value) + ("f" if t == "float" else "")
    value = int(value)
    if value == -(2 ** 63):
        return "(-9223372036854775807LL - 1)"
    return f"{value}LL" if ctype(dtype) == "int64_t" else str(value)


def _print_c(expr, name_of) -> str:
    """C source of an integer index expression (int64 math, Python's floor division and modulo)."""
    if expr.is_Integer:
        return f"{int(expr)}LL" if abs(int(expr)) >= 2 ** 31 else str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return name_of(expr)
    if expr.is_Add:
        terms = sorted(expr.args, key=sympy.default_sort_key)
        return "(" + " + ".join(_print_c(t, name_of) for t in terms) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(_print_c(a, name_of) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "(" + " * ".join([_print_c(expr.base, name_of)] * int(expr.exp)) + ")"
    if isinstance(expr, FloorDiv):
        return f"e_idiv({_print_c(expr.args[0], name_of)}, {_print_c(expr.args[1], name_of)})"
    if isinstance(expr, IMod):
        return f"e_imod({_print_c(expr.args[0], name_of)}, {_print_c(expr.args[1], name_of)})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "std::max" if isinstance(expr, sympy.Max) else "std::min"
        out = _print_c(expr.args[0], name_of)
        for a in expr.args[1:]:
            out = f"{fn}<int64_t>({out}, {_print_c(a, name_of)})"
        return out
    raise CppUnsupported(f"index expression {expr}")


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
    for name, ck in kernels:
        parts += [f"// {name} ({ck.kind})", ck.comment, ck.source.replace("KERNEL_NAME", name)]
    return "\n".join(parts) + "\n"
