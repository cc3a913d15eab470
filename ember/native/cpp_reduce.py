"""Reductions of the C++ renderer (a mixin of ``cpp_emit.CppKernelEmitter``): the loop stages of a row
reduction with their accumulators, the per-row buffers that keep costly values a later stage reads
again, Welford's one-pass mean and variance, and column reductions (the reduced range outside the
contiguous one). See cpp_emit's docstring for where each is used."""
from __future__ import annotations

import torch

from ember.native import ir, ops
from ember.native.cpp_spelling import (SIMD_REDUCTION, STORAGE, CScope, combine, compute_dtype, ctype, identity, indent,
                                       linear, parallel_for)
from ember.native.cpp_vector import VECTOR_WIDTH
from ember.native.split_reduction import variance_pairs
from ember.native.symbolic import is_static

# rows up to this many elements keep costly values a later loop needs in a stack buffer (32 KiB of fp32)
ROW_CACHE_NUMEL = 8192
# column reductions: kept points reduced side by side per block (accumulators on the stack)
COLUMN_BLOCK = 256
# Welford lanes: one AVX-512 vector of floats (two AVX2 vectors)
WELFORD_LANES = 16
COSTLY = ops.HEAVY | {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "sin", "cos", "truediv"}


class ReductionEmitter:
    """The reduction half of ``cpp_emit.CppKernelEmitter`` (which provides value, store, _loops...)."""

    # -- row buffers: a costly value a later loop needs again is kept, not recomputed -------------
    def _stage_exprs(self, nodes) -> dict:
        """The r-dependent Exprs a stage computes for ``nodes`` (in-kernel inner nodes expanded), in
        walk order: dicts, not sets, so the row buffers are planned in the same order in every
        process (an Expr's hash varies with PYTHONHASHSEED; a different source would miss the
        disk cache of a warm process)."""
        roots, out, seen = [self.k.bodies[n.name] for n in nodes], {}, {}
        while roots:
            for e in ir.walk(roots):
                if e in seen:
                    continue
                seen[e] = None
                if self._rdep(e):
                    out[e] = None
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
                        self.row_cache[e] = (f"row{len(self.row_cache)}", first[e])
                else:
                    first[e] = s
        self.row_in_output = self._rows_in_outputs(stage_nodes)
        for e, (buf, _) in self.row_cache.items():
            if buf not in self.row_in_output:
                scope.lines.append(f"{ctype(compute_dtype(e.dtype))} {buf}[{k.rnumel}];")

    def _rows_in_outputs(self, stage_nodes: dict) -> dict:
        """{row buffer: output node} for the kept values whose last reader is the stage that stores an
        output of the same element type over the same row: the value is kept in that output's own
        elements and overwritten there by the result (softmax: exp(x - max) is written to the output,
        then scaled in place). A stack buffer would be one more stream through L1 and leave the
        output's stores to a final loop with nothing to hide their memory traffic behind: softmax
        1024x1024, 1 thread, 0.75 -> 0.53 ms on the development VM (8192x1024: 47 -> 29 ms)."""
        k, out, taken = self.k, {}, set()
        for e, (buf, s0) in self.row_cache.items():
            last = max(s for s, es in self.stage_sets.items() if e in es)
            for n in stage_nodes.get(last, ()):
                if (n.name in taken or k.roles[n.name] != "inner" or n.name in k.local or last <= s0
                        or STORAGE.get(n.layout.dtype) != ctype(compute_dtype(e.dtype))
                        or n.layout.dtype != compute_dtype(e.dtype)):
                    continue
                out[buf] = n.name
                taken.add(n.name)
                break
        return out

    def _row_slot(self, buf, rindex) -> str:
        """Where a kept row value lives for the current reduced index: its stack buffer, or the output
        element it is kept in (``_rows_in_outputs``)."""
        name = self.row_in_output.get(buf)
        if name is None:
            return f"{buf}[{rindex}]"
        return f"{self.pointer(name, out=True)}[{self.index_str(self.k.stores[name])}]"

    def _reduce_stage(self, scope, reds, stores, all_nodes, stage=0):
        """One loop nest over the reduced ranges: accumulate ``reds``, store the inner nodes ``stores``."""
        k = self.k
        if any(n.name in self.welford for n in reds):
            return self._welford_stage(scope, reds, stores, all_nodes, stage)
        accs = {n.name: self._init_acc(n, scope) for n in reds}
        # explicit AVX-512 over the row's multiples of 64 (cpp_vector); the scalar loop runs the tail
        vec = self._vector_stage(scope, reds, stores, all_nodes, stage, accs)
        inner = CScope(scope)
        rvars = list(k.reduced)
        rlin = self.index_str(linear(self.vars, k.ranges, rvars))
        mine = self.stage_sets.get(stage, ())
        for e, (buf, s0) in self.row_cache.items():
            if s0 < stage and e in mine:  # computed by an earlier loop of this row
                inner.cache[e] = self.emit(inner, compute_dtype(e.dtype), self._row_slot(buf, rlin))
        self.row_scope = scope
        for n in all_nodes:
            if n in reds:
                self._accumulate(n, self.value(k.bodies[n.name], inner), accs[n.name], inner, rvars)
            elif n in stores:
                self.store(n.name, self.node_value(n.name, inner), inner)
        for e, (buf, s0) in self.row_cache.items():
            if s0 == stage:
                inner.lines.append(f"{self._row_slot(buf, rlin)} = {self.value(e, inner)};")
        self.row_scope = None
        simd = None
        clauses = [SIMD_REDUCTION.get(n.reduction_type) for n in reds]
        if reds and all(clauses) and all(accs[n.name][1] != torch.bool for n in reds):
            # reductions vectorize only when declared (without -ffast-math gcc keeps the order; max
            # and min are our NaN-propagating ones, PRELUDE's `declare reduction`)
            simd = ("#pragma omp simd " + " ".join(f"reduction({c}:{accs[n.name][0]})" for c, n in zip(clauses, reds)),
                    len(rvars) - 1)
        if vec is None:
            scope.lines += self._loops(rvars, inner.lines, simd)
        else:
            self.vector = True
            scope.lines += vec[0]
            if vec[1] is not None:
                scope.lines += self._loops(rvars, inner.lines, simd, start=vec[1])
        for n in reds:
            r = self._finish_acc(n, accs[n.name], scope)
            self.outer_vals[n.name] = self.cast(r, k.bodies[n.name].dtype, n.layout.dtype, scope)
            if n.name not in k.local:
                self.store(n.name, self.outer_vals[n.name], scope)

    # -- Welford: var/var_mean/layer_norm statistics in one pass ----------------------------------
    def _welford_pairs(self) -> dict:
        """{sum node: squares node} for the lowering's var_mean pair ``A = sum(x)``, ``B = sum((x -
        A / n) ** 2)`` over one contiguous reduced range of static length (lower_ops._var_mean; found
        by split_reduction.variance_pairs, as the Triton renderer's are). One Welford pass computes
        both: the mean without a large running sum (eager's own layer_norm and var use Welford too),
        and one pass over the row less."""
        k = self.k
        if len(k.reduced) != 1 or not is_static(k.rnumel) or k.single or k.rnumel < 2 * WELFORD_LANES:
            return {}
        sums = {n.name: k.bodies[n.name] for n in k.nodes if k.roles[n.name] == "red" and n.reduction_type == "sum"}
        return variance_pairs(sums, k.rnumel)

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
        pairs = [(n, self.nodes[self.welford[n.name]]) for n in reds if n.name in self.welford]
        names = {}
        for a, b in pairs:
            names[a.name] = (f"wf{len(names)}", ctype(compute_dtype(k.bodies[a.name].dtype)))
        rvar = f"v{r}"
        mine = self.stage_sets.get(stage, ())

        def body(update, vec=False, keep=True):  # keep: this loop also stores the stage's outputs
            inner = CScope(scope)
            for e, (buf, s0) in self.row_cache.items():
                if s0 < stage and e in mine:
                    inner.cache[e] = (self._vemit(inner, f"e_vld(&{self._vslot(buf, rvar)})") if vec else
                                      self.emit(inner, compute_dtype(e.dtype), self._row_slot(buf, rvar)))
            self.row_scope = scope
            for n in all_nodes:
                if n.name in names:
                    x = self.value(k.bodies[n.name], inner)
                    inner.lines += update(names[n.name], x)
                elif n in stores and keep:
                    self.store(n.name, self.node_value(n.name, inner), inner)
            for e, (buf, s0) in self.row_cache.items():
                if s0 == stage and keep:
                    inner.lines.append(f"e_vst(&{self._vslot(buf, rvar)}, {self.value(e, inner)});" if vec else
                                       f"{self._row_slot(buf, rvar)} = {self.value(e, inner)};")
            self.row_scope = None
            return inner.lines

        def v_update(wt, x):  # V lanes (cpp_vector): the running mean and M2 in registers, four chains
            w, _ = wt
            return [f"V {w}_x = {x} - {w}_k;", f"V {w}_d = {w}_x - {w}_vm;",
                    f"{w}_vm = {w}_vm + {w}_d * wrc;", f"{w}_vm2 = {w}_vm2 + {w}_d * ({w}_x - {w}_vm);"]

        vlines = None
        if all(t == "float" for _, t in names.values()) and n_r >= 2 * VECTOR_WIDTH:
            if n_r <= ROW_CACHE_NUMEL and self._two_pass(scope, pairs, names, body, rvar, n_r):
                return
            vlines = self._vector_lines(r, lambda: body(v_update, vec=True))
        lanes = VECTOR_WIDTH if vlines is not None else WELFORD_LANES
        full = n_r // lanes * lanes
        for w, t in names.values():
            scope.lines.append(f"{t} {w}_m[{lanes}] = {{}}, {w}_m2[{lanes}] = {{}};")

        def lane_update(wt, x):
            w, t = wt
            return [f"{t} {w}_x = {x} - {w}_k;", f"{t} {w}_d = {w}_x - {w}_m[vl];",
                    f"{w}_m[vl] += {w}_d * wrc;", f"{w}_m2[vl] += {w}_d * ({w}_x - {w}_m[vl]);"]

        def tail_update(wt, x):
            w, t = wt
            return [f"{t} {w}_x = {x} - {w}_k;", f"{t} {w}_d = {w}_x - {w}_mean;",
                    f"{w}_mean += {w}_d / ({t})wn;", f"{w}_M2 += {w}_d * ({w}_x - {w}_mean);"]

        for w, t in names.values():
            scope.lines.append(f"{t} {w}_k;")
        self._welford_shift(scope, pairs, names, rvar)
        t0 = names[pairs[0][0].name][1]
        if vlines is not None:
            self.vector = True
            scope.lines.append("{")
            scope.lines += [f"  V {w}_vm(0.0f), {w}_vm2(0.0f);" for w, _ in names.values()]
            scope.lines.append(f"  for (int64_t {rvar} = 0; {rvar} < {full}; {rvar} += {lanes}) {{")
            scope.lines.append(f"    const float wrc = 1.0f / float({rvar} / {lanes} + 1);")
            scope.lines += indent(vlines, 2) + ["  }"]
            scope.lines += [f"  e_vst({w}_m, {w}_vm); e_vst({w}_m2, {w}_vm2);" for w, _ in names.values()]
            scope.lines.append("}")
        else:
            scope.lines.append(f"for (int64_t vb = 0; vb < {full}; vb += {lanes}) {{")
            scope.lines.append(f"  const {t0} wrc = {t0}(1) / {t0}(vb / {lanes} + 1);")
            scope.lines.append("  #pragma omp simd")
            scope.lines.append(f"  for (int64_t vl = 0; vl < {lanes}; ++vl) {{")
            scope.lines.append(f"    const int64_t {rvar} = vb + vl;")
            scope.lines += indent(body(lane_update), 2)
            scope.lines += ["  }", "}"]
        for w, t in names.values():
            scope.lines.append(f"{t} {w}_mean, {w}_M2;")
            scope.lines.append(f"e_welford_lanes<{t}, {lanes}>({w}_m, {w}_m2, {full // lanes}, {w}_mean, {w}_M2);")
        if full < n_r:
            scope.lines.append(f"int64_t wn = {full};")
            scope.lines.append(f"for (int64_t {rvar} = {full}; {rvar} < {n_r}; ++{rvar}) {{")
            scope.lines.append("  ++wn;")
            scope.lines += indent(body(tail_update))
            scope.lines.append("}")
        for a, b in pairs:
            w, t = names[a.name]
            # (an infinite element makes the mean NaN, as eager's Welford does: var_mean([1, inf]) = (nan, nan))
            scope.lines.append(f"{w}_mean += {w}_k;")
            self._welford_results(scope, a, b, names[a.name], n_r)

    def _welford_shift(self, scope, pairs, names, rvar) -> None:
        """``k``: the row's first element (0 if not finite) shifts the data (x - k is exact near k), so
        the running means stay small and keep their digits: rows far from zero (1e4 + randn) get
        eager's accuracy."""
        first = CScope(scope)
        first.lines.append(f"const int64_t {rvar} = 0;")
        for a, _ in pairs:
            w, t = names[a.name]
            x0 = self.value(self.k.bodies[a.name], first)
            first.lines.append(f"{w}_k = em::isfinite({x0}) ? {x0} : {t}(0);")
        scope.lines += ["{"] + indent(first.lines) + ["}"]

    def _welford_results(self, scope, a, b, wt, n_r) -> None:
        """The pair's sum and squared deviations from ``{w}_mean`` and ``{w}_M2``; readers of the mean
        (A / n, the lowering's spelling) get the mean itself."""
        k, (w, t) = self.k, wt
        for e in ir.walk([k.bodies[b.name]]):
            if e.op == "truediv" and e.args[0].op == "load" and e.args[0].attr[0] == a.name:
                scope.cache[e] = f"{w}_mean"
        self.outer_vals[a.name] = self.cast(f"({w}_mean * {t}({n_r}))", k.bodies[a.name].dtype, a.layout.dtype, scope)
        self.outer_vals[b.name] = self.cast(f"{w}_M2", k.bodies[b.name].dtype, b.layout.dtype, scope)
        for n in (a, b):
            if n.name not in k.local:
                self.store(n.name, self.outer_vals[n.name], scope)

    def _two_pass(self, scope, pairs, names, body, rvar, n_r) -> bool:
        """The mean and squared deviations of a row that fits in cache in two V passes (cpp_vector): the
        sum of x - k (k: Welford's shift), then the sum of (x - m)^2 for the float mean m (corrected by
        m's rounding once per row), each a plain V accumulator: 4 instructions per 16 floats where the
        V Welford update takes 5 and a division per 64 (layer_norm+GELU 1024 wide: the row loop ~5%
        faster on the development VM), for a second read of a row the first pass just brought into L1. A NaN or infinite element makes
        both NaN (Welford's result). False where V does not spell the stage (the Welford loops run)."""
        k = self.k
        full = n_r // VECTOR_WIDTH * VECTOR_WIDTH

        def v_sum(wt, x):
            return [f"{wt[0]}_vs = {wt[0]}_vs + ({x} - {wt[0]}_k);"]

        def v_sq(wt, x):
            w = wt[0]
            return [f"V {w}_d = {x} - {w}_mean;", f"{w}_vs = {w}_vs + {w}_d * {w}_d;"]

        def s_sum(wt, x):
            return [f"{wt[0]}_mean += {x} - {wt[0]}_k;"]

        def s_sq(wt, x):
            w, t = wt
            return [f"{t} {w}_d = {x} - {w}_mean;", f"{w}_M2 += {w}_d * {w}_d;"]

        (r,) = k.reduced
        passes = [self._vector_lines(r, lambda: body(v_sum, vec=True)),
                  self._vector_lines(r, lambda: body(v_sq, vec=True, keep=False))]
        if None in passes:
            return False
        self.vector = True
        scope.lines += [f"{t} {w}_k, {w}_mean, {w}_M2, {w}_e;" for w, t in names.values()]
        self._welford_shift(scope, pairs, names, rvar)
        for i, (vlines, tail, acc) in enumerate(((passes[0], s_sum, "mean"), (passes[1], s_sq, "M2"))):
            scope.lines.append("{")
            scope.lines += [f"  V {w}_vs(0.0f);" for w, _ in names.values()]
            scope.lines.append(f"  for (int64_t {rvar} = 0; {rvar} < {full}; {rvar} += {VECTOR_WIDTH}) {{")
            scope.lines += indent(vlines, 2) + ["  }"]
            scope.lines += [f"  {w}_{acc} = e_vsum({w}_vs);" for w, _ in names.values()]
            scope.lines.append("}")
            if full < n_r:
                scope.lines.append(f"for (int64_t {rvar} = {full}; {rvar} < {n_r}; ++{rvar}) {{")
                scope.lines += indent(body(tail, keep=i == 0))
                scope.lines.append("}")
            if i == 0:  # the float mean, and what the exact one (k + the shifted mean) exceeds it by
                for w, t in names.values():
                    scope.lines += [f"{w}_e = {w}_mean / {t}({n_r});", f"{w}_mean = {w}_e + {w}_k;",
                                    f"{w}_e = ({w}_k - {w}_mean) + {w}_e;"]
        for a, b in pairs:
            w, t = names[a.name]
            # sum (x - mean)^2 = sum (x - m)^2 - n (mean - m)^2 for the float mean m: the rounding of a mean
            # far from zero (3e5: ulp/2 = 0.016) would add its square to the variance
            scope.lines.append(f"{w}_M2 -= {t}({n_r}) * {w}_e * {w}_e;")
            scope.lines.append(f"if ({w}_M2 < {t}(0)) {w}_M2 = {t}(0);")
            scope.lines.append(f"if ({w}_M2 != {w}_M2) {w}_mean = {w}_M2;  // (an inf element: NaN, as Welford's)")
            self._welford_results(scope, a, b, names[a.name], n_r)
        return True

    def _init_acc(self, n, scope):
        rt = n.reduction_type
        cdt = compute_dtype(self.k.bodies[n.name].dtype)
        name = f"acc{self.tmp}"
        self.tmp += 1
        if rt in ("any", "all"):
            scope.lines.append(f"bool {name} = {'false' if rt == 'any' else 'true'};")
            return name, None
        if rt in ("argmax", "argmin"):
            scope.lines.append(f"{ctype(cdt)} {name} = {identity('max' if rt == 'argmax' else 'min', cdt)};")
            scope.lines.append(f"int64_t {name}_idx = 0;")
            return name, cdt
        scope.lines.append(f"{ctype(cdt)} {name} = {identity(rt, cdt)};")
        return name, cdt

    def _accumulate(self, n, v, acc, scope, rvars):
        a, cdt = acc
        rt = n.reduction_type
        if rt in ("argmax", "argmin"):
            # the first extreme wins; a NaN counts as the extreme (and the first NaN stays)
            rindex = self.index_str(linear(self.vars, self.k.ranges, rvars))
            cmp = ">" if rt == "argmax" else "<"
            scope.lines.append(f"if (!({a} != {a}) && ({v} != {v} || {v} {cmp} {a})) {{ {a} = {v}; {a}_idx = {rindex}; }}")
            return
        scope.lines.append(f"{a} = {combine(rt, a, v)};")

    def _finish_acc(self, n, acc, scope):
        return f"{acc[0]}_idx" if n.reduction_type in ("argmax", "argmin") else acc[0]

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
        top = CScope()
        blk = CScope(top)
        reds = [node for node in k.nodes if k.roles[node.name] == "red"]
        accs = {}
        for node in reds:
            rt, cdt = node.reduction_type, compute_dtype(k.bodies[node.name].dtype)
            name = f"acc{self.tmp}"
            self.tmp += 1
            t = "bool" if rt in ("any", "all") else ctype(cdt)
            init = {"any": "false", "all": "true"}.get(rt) or identity(rt, cdt)
            blk.lines.append(f"{t} {name}[{b}];")
            blk.lines.append(f"for (int64_t vi = 0; vi < {b}; ++vi) {name}[vi] = {init};")
            accs[node.name] = name
        inner = CScope(blk)
        inner.lines.append(f"const int64_t v{last} = vb + vi;")
        for node in k.nodes:
            if node.name in accs:
                v = self.value(k.bodies[node.name], inner)
                a = f"{accs[node.name]}[vi]"
                inner.lines.append(f"{a} = {combine(node.reduction_type, a, v)};")
            elif k.roles[node.name] == "inner" and node.name not in k.local:
                self.store(node.name, self.node_value(node.name, inner), inner)
        simd = ["#pragma omp simd", "for (int64_t vi = 0; vi < vn; ++vi) {"] + indent(inner.lines) + ["}"]
        blk.lines += self._loops(list(k.reduced), simd)
        epi = CScope(blk)
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
        blk.lines += ["for (int64_t vi = 0; vi < vn; ++vi) {"] + indent(epi.lines) + ["}"]
        block = [f"for (int64_t vb = 0; vb < {n}; vb += {b}) {{", f"  const int64_t vn = em::min<int64_t>({b}, {n} - vb);"]
        block += indent(blk.lines) + ["}"]
        numel = self.index_str(k.numel)
        collapse = len(outer) + 1
        clause = f" collapse({collapse})" if collapse > 1 else ""
        pragma = (parallel_for(clause, numel), 0)
        if outer:
            return top.lines + self._loops(outer, block, pragma)
        return top.lines + [pragma[0]] + block
