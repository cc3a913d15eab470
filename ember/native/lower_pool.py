"""Lowering of max pooling: ``max_pool2d_with_indices`` as a pointwise value over the output, each
element the maximum of its window's loads (Inductor lowers it the same way).

Why: ATen's CPU max pooling is a slow scalar loop (a small CNN's 2x2 pools took as long as its
convolutions on the development VM), and as an extern call it also needs its input in memory. As a
lowering, the window reads inline whatever feeds it (a batch norm + ReLU after a convolution), so
the producer's kernel writes only the pooled result. The indices are a second value of the same
windows; they reach memory only when something reads them (the backward's
``max_pool2d_with_indices_backward``), never in inference.

The backward, ``max_pool2d_with_indices_backward``, is a pointwise value over the *input* in gather
form: each input element sums the gradients of the windows that cover it (at most
``ceil(kh / sh) * ceil(kw / sw)`` of them: 4 for ResNet's 3x3 stride-2 stem) whose stored index
points at it. Each program reads grad_out and the indices near its inputs and writes grad_in once,
with no zero fill and no atomics (ATen's channels-last CUDA kernel took 0.46 ms of ResNet-50's
training step at batch 64). The indices decide, never a recomputed argmax, so ties and NaNs route
the gradient exactly as eager's forward chose. The sum runs in the windows' order (output row, then
column), from +0, as eager's loops add: float32 results are bit-equal; bf16/fp16 ones are summed in
float32 and rounded once (ATen's CUDA kernels do the same; its CPU kernels round after each add).

Eager's semantics, kept exactly: a window's maximum ignores padding, NaN wins (and the last NaN's
index is the one reported), ties keep the first index; the index is ``h * W + w`` in the input plane.
A window whose elements are all -inf reports its first in-bounds element. Windows of more than
``MAX_WINDOW`` elements (covering windows, for the backward), dilation, symbolic spatial sizes and
integer dtypes decline (ATen runs them).
"""
from __future__ import annotations

import torch

from ember.native import ir
from ember.native.lowering import Decline, Lazy, register
from ember.native.symbolic import is_static

aten = torch.ops.aten
# more loads per output than this would make one element's code long for little gain (Inductor's
# limit too); such windows stay ATen calls
MAX_WINDOW = 25


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, (list, tuple)):
        return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])
    return (v, v)


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(L, node, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if (dh, dw) != (1, 1) or kh * kw > MAX_WINDOW or not x.dtype.is_floating_point:
        raise Decline
    H, W = x.sizes[-2], x.sizes[-1]
    out = node.meta["val"][0]
    OH, OW = out.shape[-2], out.shape[-1]
    if not all(is_static(v) for v in (H, W, OH, OW)):
        raise Decline
    H, W, OH, OW = int(H), int(W), int(OH), int(OW)
    sizes, dtype, device = tuple(x.sizes[:-2]) + (OH, OW), x.dtype, x.device

    def window(idx):
        """[(in bounds: Expr or None when always, value Expr, flat index Expr)] in eager's order."""
        *lead, oh, ow = idx
        items = []
        for i in range(kh):
            h = oh * sh - ph + i
            # can this row of the window fall outside the input (top padding / past the end)?
            low_h, high_h = i - ph < 0, (OH - 1) * sh - ph + i >= H
            for j in range(kw):
                w = ow * sw - pw + j
                low_w, high_w = j - pw < 0, (OW - 1) * sw - pw + j >= W
                conds = []
                for flag, e, bound, cmp in ((low_h, h, 0, "ge"), (high_h, h, H, "lt"),
                                            (low_w, w, 0, "ge"), (high_w, w, W, "lt")):
                    if flag:
                        conds.append(ir.op(cmp, ir.index_value(e), ir.const(bound, torch.int64)))
                mask = None
                for c in conds:
                    mask = c if mask is None else ir.op("logical_and", mask, c)
                v = x.load(list(lead) + [h, w])
                if mask is not None:
                    v = ir.op("where", mask, ir.masked(mask, v, float("-inf")), ir.const(float("-inf"), dtype))
                items.append((mask, v, ir.index_value(h * W + w)))
        return items

    def values(idx):
        items = window(idx)
        first_mask, best, _ = items[0]
        if first_mask is not None:
            best = ir.const(float("-inf"), dtype)
            rest = items
        else:
            rest = items[1:]
        for _, v, _ in rest:
            best = ir.op("maximum", v, best)  # (v > best || isnan(v)) ? v : best, as eager's loop
        return best

    def indices(idx):
        items = window(idx)
        *_, oh, ow = idx
        first_mask, best, pos = items[0]
        rest = items[1:]
        if first_mask is not None:
            # eager starts at the window's first in-bounds element, with -inf as the maximum
            i64 = torch.int64
            h0, w0 = (ir.op("maximum", ir.index_value(e), ir.const(0, i64)) for e in (oh * sh - ph, ow * sw - pw))
            first = ir.op("add", ir.op("mul", h0, ir.const(W, i64)), w0)
            best, pos, rest = ir.const(float("-inf"), dtype), first, items
        for _, v, p in rest:
            take = ir.op("logical_or", ir.op("gt", v, best), ir.op("isnan", v))
            best = ir.op("where", take, v, best)
            pos = ir.op("where", take, p, pos)
        return pos

    return [Lazy(sizes, dtype, device, values), Lazy(sizes, torch.int64, device, indices)]


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(L, node, grad_out, x, kernel_size, stride=None, padding=0, dilation=1,
                                     ceil_mode=False, indices=None):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, (kh, kw))
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    # candidate windows per input row (column): the ones starting at most kh - 1 (kw - 1) before it
    ch, cw = -(-kh // sh), -(-kw // sw)
    if (dh, dw) != (1, 1) or ch * cw > MAX_WINDOW or not grad_out.dtype.is_floating_point or indices is None:
        raise Decline
    H, W = x.sizes[-2], x.sizes[-1]
    OH, OW = grad_out.sizes[-2], grad_out.sizes[-1]
    if not all(is_static(v) for v in (H, W, OH, OW)):
        raise Decline
    H, W, OH, OW = int(H), int(W), int(OH), int(OW)
    dtype = grad_out.dtype
    i64 = torch.int64

    def axis(e, p, s, k, n_in, n_out, count):
        """[(window position expression, [conditions it covers e and exists])] for one spatial axis,
        in increasing window position. Window o covers e when o * s - p <= e < o * s - p + k; the last
        one to start at or before e is (e + p) // s, the earlier ones step back by one."""
        last = ir.FloorDiv(e + p, s)
        out = []
        for back in reversed(range(count)):
            o = last - back
            conds = []
            if back > 0:  # (the first window is at 0 or later: the last one is, always)
                conds.append((o, 0, "ge"))
            if (n_in - 1 + p) // s - back >= n_out:  # (only if some input position would go past the end)
                conds.append((o, n_out, "lt"))
            if (s - 1) + back * s >= k:  # does it still reach e? ((e + p) % s + back * s < k)
                conds.append((e + p - o * s, k, "lt"))
            out.append((o, conds))
        return out

    def grad_in(idx):
        *lead, h, w = idx
        here = ir.index_value(h * W + w)
        total = ir.const(0.0, dtype)  # (+0 first, as eager's zero-filled grad_in: -0 grads sum to +0)
        for oh, hc in axis(h, ph, sh, kh, H, OH, ch):
            for ow, wc in axis(w, pw, sw, kw, W, OW, cw):
                valid = None
                for e, bound, cmp in hc + wc:
                    c = ir.op(cmp, ir.index_value(e), ir.const(bound, i64))
                    valid = c if valid is None else ir.op("logical_and", valid, c)
                at = list(lead) + [oh, ow]
                ind = indices.load(at)
                if valid is not None:  # (no load outside the window grid: no address outside the buffers)
                    ind = ir.masked(valid, ind, -1)
                # the gradient is loaded only where the window chose this element
                hit = ir.op("eq", ind, here)
                total = ir.op("add", total, ir.masked(hit, grad_out.load(at), 0.0))
        return total

    return Lazy(x.sizes, dtype, x.device, grad_in)
