"""Welford in Triton's looped reductions: var_mean's pair of sums in one pass over the data.

The lowering spells var_mean as two sums, ``A = sum(x)`` and ``B = sum((x - A / n) ** 2)``
(lower_ops._var_mean; the pairs are found by split_reduction.variance_pairs, for both renderers).
Looped literally, B's loop needs A's finished value: a second pass over x (a second read of every
row from memory: BatchNorm statistics of a channels-last activation, an outer reduction, were 1.6x
torch.compile's time). Here both come out of one r-loop:

* every lane of the ``[XBLOCK, RBLOCK]`` tile keeps a running mean and M2 (sum of squared deviations
  from it), Welford's update ``d = x - mean; mean += d / count; M2 += d * (x - mean)`` (eager's
  var_mean and layer_norm use Welford too), of the data shifted by the row's first element ``k``
  (read once before the loop; 0 if not finite), as the C++ renderer does: ``x - k`` is exact near
  ``k``, so the running means stay small and keep their digits. Unshifted, fp32 Welford's rounding of
  a running mean of 1e4 + randn (steps of 1e-3) put ~1e-4 relative errors into the variance; the
  two-pass spelling it replaces was within ~1e-7;
* when RBLOCK divides rnumel (the r-mask is constant true: split_reduction's chunks are multiples of
  ALIGN_ROWS rows) every lane has seen the same count, a scalar: one reciprocal per loop iteration,
  and the lanes merge in two passes over the tile (``mean = avg(mean_l)``, ``M2 = sum(M2_l) + count *
  sum((mean_l - mean) ** 2)``); otherwise the count is per lane (``[1, RBLOCK]``), masked lanes do
  not update, and the lanes merge pairwise (``welford_combine``, Chan et al.).

A's value is ``(k + mean) * n`` (what the sum's readers expect); readers of ``A / n`` (the mean, in this
kernel) get the mean itself. Persistent kernels keep the two-pass spelling: the row is in registers,
so the second pass reads no memory and is exact.
"""
from __future__ import annotations

import sympy

from ember.native import ir
from ember.native.split_reduction import variance_pairs
from ember.native.symbolic import is_static


def pairs(em) -> dict:
    """{A: B}: the var_mean pairs of a looped (not persistent, not single-program) kernel."""
    k = em.k
    if not k.is_reduction or k.single or em.cfg.persistent or not is_static(k.rnumel):
        return {}
    sums = {n.name: k.bodies[n.name] for n in k.nodes if k.roles[n.name] == "red" and n.reduction_type == "sum"}
    return variance_pairs(sums, k.rnumel)


class StageWelford:
    """The Welford accumulators of one r-loop's pairs: ``init`` before the loop, ``count`` at the
    loop's top, ``update`` per pair in it, ``finish`` after it."""

    def __init__(self, em, names: list, top):
        from ember.native.triton_emit import TL_DTYPE, compute_dtype
        self.em, self.names = em, names
        k = em.k
        self.exact = k.rnumel % em.cfg.RBLOCK == 0  # (triton_emit._mask writes rmask constant true then)
        i = em.tmp
        em.tmp += 1
        self.count = f"_wf{i}_n"  # exact: iterations so far (a scalar); else per lane, [1, RBLOCK]
        self.acc, self.shift = {}, {}
        dts = [TL_DTYPE[compute_dtype(k.bodies[a].dtype)] for a in names]
        cdt = "tl.float64" if "tl.float64" in dts else "tl.float32"
        if self.exact:
            top.lines.append(f"{self.count} = tl.full([], 0.0, {cdt})")
        else:
            top.lines.append(f"{self.count} = tl.zeros([1, RBLOCK], {cdt})")
        for j, (a, dt) in enumerate(zip(names, dts)):
            mean, m2 = f"_wf{i}_mean{j}", f"_wf{i}_m2{j}"
            top.lines.append(f"{mean} = tl.zeros([XBLOCK, RBLOCK], {dt})")
            top.lines.append(f"{m2} = tl.zeros([XBLOCK, RBLOCK], {dt})")
            self.acc[a] = (mean, m2)

    def shifts(self, top) -> None:
        """``k`` of each pair: its x at the first reduced position of each row ([XBLOCK, 1]), computed
        before the loop: x with the reduced variables set to 0 (no r-index is defined outside the
        loop: Triton would take it for a loop-carried value of another shape)."""
        em, k = self.em, self.em.k
        first = {em.vars[i]: sympy.Integer(0) for i in k.reduced}
        for a in self.names:
            if any(x.op == "load" and x.attr[0] in em.nodes for x in ir.walk([k.bodies[a]])):
                # x reads a value this kernel computes (a concatenation it also stores, say): that
                # node's code indexes with the loop's r-variables, which renaming x cannot reach and
                # which exist only inside the loop (Triton: "v2 is not defined"; the Stable Diffusion
                # UNet's GroupNorm of a skip concatenation). Such a pair runs unshifted, as eager's
                # CUDA Welford does
                self.shift[a] = "0.0"
                continue
            v = em.value(ir.rename(k.bodies[a], first), top)
            self.shift[a] = em.emit_line(top, f"tl.where(tl.abs({v}) < float('inf'), {v}, 0.0)")

    def count_lines(self) -> list:
        if self.exact:
            return [f"{self.count} = {self.count} + 1.0", f"{self.count}_r = 1.0 / {self.count}"]
        return [f"{self.count} = tl.where(rmask, {self.count} + 1.0, {self.count})"]

    def update(self, a, v, scope) -> None:
        em = self.em
        mean, m2 = self.acc[a]
        v = em.emit_line(scope, f"tl.broadcast_to({v} - {self.shift[a]}, [XBLOCK, RBLOCK])")
        d = em.emit_line(scope, f"{v} - {mean}")
        if self.exact:
            scope.lines.append(f"{mean} = {mean} + {d} * {self.count}_r")
            scope.lines.append(f"{m2} = {m2} + {d} * ({v} - {mean})")
            return
        # (a lane's count is 0 only while rmask has kept it out: its update is discarded)
        new = em.emit_line(scope, f"{mean} + {d} / tl.maximum({self.count}, 1.0)")
        scope.lines.append(f"{m2} = tl.where(rmask, {m2} + {d} * ({v} - {new}), {m2})")
        scope.lines.append(f"{mean} = tl.where(rmask, {new}, {mean})")

    def finish(self, a, top) -> tuple:
        """(mean, M2) of each row, ``[XBLOCK, 1]`` values in ``top``."""
        em = self.em
        mean, m2 = self.acc[a]
        if self.exact:
            t = em.emit_line(top, f"tl.sum({mean}, 1)[:, None] / RBLOCK")
            dm = em.emit_line(top, f"{mean} - {t}")
            out = em.emit_line(top, f"tl.sum({m2}, 1)[:, None] + {self.count} * tl.sum({dm} * {dm}, 1)[:, None]")
            return em.emit_line(top, f"{self.shift[a]} + {t}"), out
        t, out = em.new_tmp(), em.new_tmp()
        top.lines.append(f"{t}, {out}, _ = tl.reduce(({mean}, {m2}, tl.broadcast_to({self.count}, [XBLOCK, RBLOCK])"
                         f".to({mean}.dtype)), 1, welford_combine)")
        return em.emit_line(top, f"{self.shift[a]} + {t}[:, None]"), em.emit_line(top, f"{out}[:, None]")


def mean_expr(k, b) -> object:
    """The ``A / n`` subexpression of B's body (its readers get the Welford mean)."""
    return k.bodies[b].args[0].args[1]
