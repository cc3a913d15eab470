"""Lowering: an ATen FX graph -> ``GraphIR``.

``GraphLowering`` interprets the graph node by node. Each op's lowering (pointwise ops: the op registry
``ops.py``; the rest: ``lower_ops.py`` and ``lower_views.py``) maps its arguments to a *tensor value*:

* ``Stored``: a strided view of a buffer (a graph input, a computed buffer, an extern output). Views of
  it stay ``Stored`` while they are expressible with sizes/strides/offset, so extern ops can take them
  without a copy.
* ``Lazy``: not computed yet; ``load(index)`` returns the Expr of one element. Pointwise ops and views of
  lazy values compose loaders, which is how producers get inlined into their consumers.

A value is *realized* into a ``ComputedNode`` when something needs memory: a reduction (always its own
node), an extern argument, a graph output, or a lazy value whose repeated inlining would cost too much
(``should_realize``). Ops without a lowering become ``ExternNode``s, so nothing is silently dropped.

Symbolic sizes (dynamic shapes): when the placeholders' FakeTensors carry SymInts, the lowering reads
the inputs from that metadata, and every SymInt it meets (sizes, strides, size arithmetic nodes such
as ``sym_size``) becomes an expression over the graph's size symbols (``symbolic.SizeVars``, made
current by ``symbolic.active`` while lowering). Each symbol must be some input's size, stride or a
SymInt argument, which is where the wrapper reads it. A lowering that would need a size decision no
proof settles raises ``SymbolicUnsupported``: the graph is then compiled per size instead.
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from typing import Callable

import sympy
import torch
import torch.fx

from ember.native import ir, ops
from ember.native.symbolic import (FloorDiv, SymbolicUnsupported, active, eq, has_symbolic_inputs, is_static, norm,
                                    norm_sizes)

aten = torch.ops.aten
LOWERINGS: dict = {}   # OpOverload -> fn(L, node, *args, **kwargs) -> value
# ops computing sizes of their argument: their (possibly symbolic) value is in the node's metadata
SIZE_OPS = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default}
EXTERN_OPS: set = set()  # ops lowered on purpose as extern calls (matmul, conv, attention)
EXTERN_ALIGN: dict = {}  # OpOverload -> {argument name: alignment in elements} (aligned_arg)


def _is_complex(val) -> bool:
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in vals)


class Unsupported(Exception):
    """The graph cannot be compiled by this backend; the caller runs it as it is."""


class Decline(Exception):
    """A lowering found it cannot handle these arguments (integer pow, a device change...): the
    call becomes an extern op instead."""


def register(*ops):
    def deco(fn):
        for o in ops:
            LOWERINGS[o] = fn
        return fn
    return deco


def register_extern(*ops):
    for o in ops:
        EXTERN_OPS.add(o)


# --------------------------------------------------------------------------------------------------
# tensor values


class Value:
    sizes: tuple
    dtype: torch.dtype
    device: torch.device

    @property
    def numel(self):
        return math.prod(self.sizes)


# (index variables, sizes, strides, offset) -> the flat index a Stored value loads at: the same for
# every buffer of one layout, so each layer of a deep model reuses the first one's sympy arithmetic
_STORED_INDEX: dict = {}


class Stored(Value):
    def __init__(self, L, buf, sizes, strides, offset, dtype, device):
        self.L, self.buf = L, buf
        self.sizes, self.strides, self.offset = norm_sizes(sizes), norm_sizes(strides), norm(offset)
        self.dtype, self.device = dtype, device
        self._memo: dict = {}

    def load(self, idx):
        key = tuple(idx)
        hit = self._memo.get(key)
        if hit is None:
            layout_key = (key, self.sizes, self.strides, self.offset)
            index = _STORED_INDEX.get(layout_key)
            if index is None:
                terms = [i * st for i, size, st in zip(idx, self.sizes, self.strides) if size != 1 and st != 0]
                index = sympy.Add(sympy.sympify(self.offset), *terms)
                if len(_STORED_INDEX) >= 100_000:
                    _STORED_INDEX.clear()
                _STORED_INDEX[layout_key] = index
            hit = self._memo[key] = ir.load(self.buf, index, self.L.indirect, self.dtype)
        return hit

    def is_whole(self, layout: ir.Layout) -> bool:
        return (self.offset == 0 and self.sizes == tuple(layout.sizes)
                and _same_strides(self.sizes, self.strides, layout.strides))

    def __repr__(self):
        return f"Stored({self.buf}, {self.sizes}, {self.strides}, +{self.offset})"


def _same_strides(sizes, a, b):
    return all(s == 1 or x == y for s, x, y in zip(sizes, a, b))


class Lazy(Value):
    origins: list = []  # (op, source line) of the fx nodes folded into this value
    # eager's strides for this value (its FX node's meta), if dense: the layout it gets when realized,
    # so that e.g. channels_last propagates from convolutions through the pointwise ops between them
    stride_hint: tuple | None = None

    def __init__(self, sizes, dtype, device, fn: Callable):
        self.sizes, self.dtype, self.device, self.fn = norm_sizes(sizes), dtype, device, fn
        self._memo: dict = {}

    def load(self, idx):
        # memoized: consumers, should_realize and realize ask for the same index (same Expr back,
        # also the same indirect symbols, which keeps gathers CSE-able)
        key = tuple(idx)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self.fn(list(idx))
        return hit

    def __repr__(self):
        return f"Lazy({self.sizes}, {self.dtype})"


class TensorMeta:
    """A node's tensor metadata with sizes and strides as the IR holds them (ints or size expressions)."""
    __slots__ = ("shape", "dtype", "device", "layout", "_t")

    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype, self.device, self.layout, self._t = norm_sizes(t.shape), t.dtype, t.device, t.layout, t

    def stride(self):
        return norm_sizes(self._t.stride())


def out_meta(node) -> TensorMeta:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        raise Unsupported(f"{node.target}: no tensor metadata")
    return TensorMeta(v)


def squeeze_vars(sizes):
    """Loop ranges without size-1 dims, and the full index (0 for size-1 dims)."""
    ranges, idx = [], []
    vs = iter(ir.node_vars(len(sizes)))
    for s in sizes:
        if s == 1:
            idx.append(sympy.Integer(0))
        else:
            ranges.append(norm(s))
            idx.append(next(vs))
    return tuple(ranges), idx


def ordered_vars(sizes, order):
    """``squeeze_vars`` with the loops nested in ``order`` (dims outermost first): loop j runs over
    dim order[j]; the index returned is still in the dims' logical order."""
    ranges, pidx = squeeze_vars([sizes[d] for d in order])
    idx = [sympy.Integer(0)] * len(sizes)
    for j, d in enumerate(order):
        idx[d] = pidx[j]
    return ranges, idx


def memory_order(strides, hint=int) -> list:
    """Dims from the largest stride to the smallest (ties keep their logical order); symbolic
    strides compare by their hints (``SizeVars.hint``: dense layouts keep one order for all sizes)."""
    return sorted(range(len(strides)), key=lambda d: -hint(strides[d]))


def _hint_strides(v, meta):
    """Record eager's strides on the Lazy values of an FX node (lists for multi-output ops)."""
    if isinstance(v, (list, tuple)) and isinstance(meta, (list, tuple)):
        for x, m in zip(v, meta):
            _hint_strides(x, m)
    elif isinstance(v, Lazy) and v.stride_hint is None and isinstance(meta, torch.Tensor):
        shape, strides = _static(meta.shape), _static(meta.stride())
        if shape is not None and strides is not None and shape == tuple(v.sizes) and _dense_strides(v.sizes, strides):
            v.stride_hint = strides


def _static(vals):
    """vals as plain ints, or None if any is symbolic (symbolic layouts keep contiguous strides)."""
    out = []
    for x in vals:
        if isinstance(x, torch.SymInt):
            x = x.node.maybe_as_int()
            if x is None:
                return None
        out.append(int(x))
    return tuple(out)


def broadcast_loader(v: Value, out_sizes):
    """Index function reading v broadcast (right-aligned) to out_sizes."""
    k, n = len(v.sizes), len(out_sizes)

    def remap(idx):
        tail = idx[n - k:] if k else []
        return [sympy.Integer(0) if s == 1 else i for s, i in zip(v.sizes, tail)]
    return remap


_OP_NAMES: dict = {}  # OpOverload -> its name in origins (str() of an OpOverload costs ~4 us)


def stack_trace_line(node: torch.fx.Node) -> str | None:
    """The last frame of node.meta['stack_trace'] as 'file:line in fn: code' (the user's line)."""
    st = node.meta.get("stack_trace")
    if not st:
        return None
    return _last_frame(st)


@functools.lru_cache(maxsize=4096)
def _last_frame(st: str) -> str | None:
    """stack_trace_line of a stack trace (cached: every layer of a model repeats the same ones)."""
    lines = [l.strip() for l in st.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'File "(.+)", line (\d+), in (.+)', lines[i])
        if m:
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            return f"{m.group(1)}:{m.group(2)} in {m.group(3)}: {code}".rstrip(": ")
    return None


# --------------------------------------------------------------------------------------------------
# the interpreter


class GraphLowering:
    # A multi-use lazy value is realized once its body is this big or reads this many buffers
    # (Inductor's defaults for GPU): recomputing a big body in every consumer costs more than a store.
    REALIZE_OPCOUNT = 30
    REALIZE_READS = 4
    MAX_INLINE_READS = 8
    # ... or once it reads more than this many buffers at least its own size. A transformer's residual
    # stream (h + attn(h) + mlp(h) + ...) feeds each norm's statistics and the next add: left lazy
    # until the limit of 4 reads above, the norm kernels read 2, 3, 4, then 5 [rows, width] buffers (the
    # last one also stores the stream): 19 buffer passes per two GPT-2 layers. Stored once it reads 3,
    # they read the stored stream and one branch, then the stream and two branches and store the new
    # stream: 16 passes, at most 5 in one kernel (GPT-2 124M at 8x512 bf16: 6.3 MB a pass). With two
    # users, storing 3 full reads costs what inlining them twice costs (3 + 1 + 2 against 2 * 3), and
    # what comes after reads one buffer instead of three. Small reads (a norm's weight, a gather's
    # indices) do not count.
    REALIZE_FULL_READS = 2
    # ... or, at most this many elements, once it calls a libdevice op (ops.LIBDEVICE): each kernel
    # that inlined it would carry that code (a Llama's rotary cos/sin table, [512, 64] at 512 tokens,
    # was recomputed inside 2 kernels per layer, 48 sin/cos calls per step; on the H100 host those
    # kernels took 1.3-2.3 s to build where their peers took 0.3-0.8 s:
    # benchmarks/results/llama_buildtimes-h100-s40.json). Stored, it is one small kernel, read like
    # any table. Small only: a large value (GPT-2's tanh GELU) costs a full pass to store and reread.
    # Triton only (``libdevice``): a C++ kernel calls its math functions, inlining nothing.
    REALIZE_LIBDEVICE_NUMEL = 1 << 20

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, libdevice: bool = True):
        self.gm, self.example_inputs = gm, list(example_inputs)
        self.libdevice = libdevice
        self.inputs: list[ir.InputBuffer] = []
        self.nodes: list = []
        self.layouts: dict[str, ir.Layout] = {}
        self.indirect: dict = {}
        self.mutations: list = []
        self.current: torch.fx.Node | None = None
        self._names = itertools.count()
        self._ind = itertools.count()
        self.int_inputs: dict = {}  # placeholder position -> specialized value (int or size expression)
        self._inlined: list = []
        self.env: dict = {}
        self._extern_args: dict = {}  # id(lazy value) -> (value, its realized buffer), see buffer_arg
        self.input_buf: dict = {}  # placeholder node -> its buffer name
        # dynamic shapes: placeholders' FakeTensor metadata (symbolic) describes the inputs, not the
        # example inputs (concrete, or fake for backward graphs)
        self.symbolic = has_symbolic_inputs(gm)
        self.sv = ir.SizeVars()
        self._fetched: dict = {}   # (buffer, offset) of another device's scalar -> its copy (_fetch_scalars)
        self._origin_of: dict = {}  # fx node -> its (op, source line) (origins)
        self._resolved: dict = {}  # Expr -> its resolve_indirect (_resolve)
        self._bufs_memo: dict = {}  # Expr -> the buffers it loads (_buffers_read)

    # -- naming and metadata ------------------------------------------------------------------
    def new_name(self, prefix="buf"):
        return f"{prefix}{next(self._names)}"

    def new_indirect(self, e: ir.Expr) -> sympy.Symbol:
        s = ir.sym(f"ind{next(self._ind)}")
        self.indirect[s] = e
        return s

    def origins(self):
        """(op, source line) of the fx node being lowered and of the lazy values it inlines."""
        n = self.current
        if n is None or n.op != "call_function":
            return list(self._inlined)
        mine = self._origin_of.get(n)
        if mine is None:  # (asked several times per node: its call, its realization, an extern)
            name = _OP_NAMES.get(n.target)
            if name is None:
                name = str(n.target).replace("aten.", "") if isinstance(n.target, torch._ops.OpOverload) \
                    else getattr(n.target, "__name__", str(n.target))
                if isinstance(n.target, torch._ops.OpOverload):
                    _OP_NAMES[n.target] = name
            mine = self._origin_of[n] = (name, stack_trace_line(n))
        return _merge_origins(self._inlined, [mine])

    def _resolve(self, e: ir.Expr) -> ir.Expr:
        """``ir.resolve_indirect`` of e, with one memo for the whole graph (an indirect symbol means
        the same Expr from its creation on, so a subtree resolves the same in every body); nothing
        to do before the graph has any indirect symbol."""
        return ir.resolve_indirect(e, self.indirect, self._resolved) if self.indirect else e

    # -- realize --------------------------------------------------------------------------------
    def realize(self, v: Value, strides=None, padded=False) -> Stored:
        """Compute v into a new buffer with the given strides, else its ``stride_hint``, else
        contiguous ones. The loops run in the buffer's memory order (stride-1 dim innermost), so
        its stores are coalesced whatever the layout. ``padded``: the strides leave gaps between
        rows on purpose (``aligned_arg``); otherwise strides that are not dense are ignored."""
        if isinstance(v, Stored):
            return v
        sizes = v.sizes
        if strides is None:
            strides = v.stride_hint
        if strides is None or not (padded or _dense_strides(sizes, strides, self.sv)):
            strides = ir.contiguous_strides(sizes)
        layout = ir.Layout(sizes, tuple(strides), v.dtype, v.device)
        ranges, idx = ordered_vars(sizes, memory_order(strides, self.sv.hint))
        body = self._resolve(v.load(idx))  # index values of gathered positions
        body = ir.simplify_expr(body, dict(zip(ir.node_vars(len(ranges)), ranges)), lower=self.sv.lower)
        store = sum((i * st for i, s, st in zip(idx, sizes, strides) if s != 1), sympy.Integer(0))
        name = self.new_name()
        origins = getattr(v, "origins", None) or self.origins()
        self.nodes.append(ir.ComputedNode(name, layout, ranges, body, store, origins=origins))
        self.layouts[name] = layout
        return Stored(self, name, sizes, strides, 0, v.dtype, v.device)

    def load_order(self, e: ir.Expr, idx) -> list | None:
        """The memory order of the biggest buffer that e reads with every loop variable of ``idx``
        at its own stride (None if there is none): a reduction loops in the order its input is
        stored, so its loads are coalesced."""
        best = None
        loops = [(d, i) for d, i in enumerate(idx) if isinstance(i, sympy.Symbol)]
        for ld in ir.loads_of(e):
            buf, index, syms = ld.attr
            if syms or not loops:
                continue
            index = sympy.expand(index)
            coeffs = [index.coeff(i) for _, i in loops]
            if not all(c.is_Integer and c > 0 for c in coeffs) or len(set(coeffs)) != len(coeffs):
                continue
            nbytes = self.sv.hint(self.layouts[buf].nbytes)
            if best is None or nbytes > best[0]:
                strides = [0] * len(idx)
                for (d, _), c in zip(loops, coeffs):
                    strides[d] = int(c)
                best = (nbytes, memory_order(strides))
        return None if best is None else best[1]

    def should_realize(self, v: Lazy, users: int) -> bool:
        ranges, idx = squeeze_vars(v.sizes)
        body = v.load(idx)
        if users < 2:  # only the read count matters: from the memo, not a walk of the whole body
            return len(self._buffers_read(body)) > self.MAX_INLINE_READS
        # one walk, one pass over it (ir.loads_of and ir.opcount would each walk the body)
        bufs, libdevice, opcount, heavy = set(), False, 0, ops.LIBDEVICE
        for e in ir.walk([body]):
            o = e.op
            if o == "load":
                bufs.add(e.attr[0])
            elif o != "const" and o != "index":
                opcount += 1
                if o in heavy:
                    libdevice = True
        if len(bufs) > self.MAX_INLINE_READS:
            return True
        if self.libdevice and libdevice and \
                self.sv.hint(math.prod(v.sizes)) <= self.REALIZE_LIBDEVICE_NUMEL:
            return True
        if len(bufs) > self.REALIZE_READS or opcount > self.REALIZE_OPCOUNT:
            return True
        if len(bufs) <= self.REALIZE_FULL_READS:
            return False
        numel = self.sv.hint(math.prod(v.sizes))
        full = sum(1 for b in bufs if b in self.layouts and self.sv.hint(self.layouts[b].numel) >= numel)
        return full > self.REALIZE_FULL_READS

    def _buffers_read(self, e: ir.Expr) -> frozenset:
        """The buffers e loads (``{x.attr[0] for x in ir.walk([e]) if x.op == "load"}``), from one
        memo per graph: a chain of single-use pointwise ops asked this of its whole inlined body at
        every node, quadratic in the chain's length (~a third of should_realize's time)."""
        memo = self._bufs_memo

        def of(x):
            hit = memo.get(x)
            if hit is None:
                out = set()
                for a in x.args:
                    out |= of(a)
                if x.op == "load":
                    out.add(x.attr[0])
                hit = memo[x] = frozenset(out)
            return hit
        try:
            return of(e)
        except RecursionError:  # (a body deeper than the recursion limit: one walk)
            return frozenset(x.attr[0] for x in ir.walk([e]) if x.op == "load")

    # -- reductions -----------------------------------------------------------------------------
    def reduce(self, x: Value, dims, keepdim: bool, rtype: str, out_dtype, acc_dtype=None,
               body_fn=None) -> Value:
        """Reduce x over dims. ``body_fn(expr) -> expr`` transforms each element before reducing."""
        nd = len(x.sizes)
        dims = sorted({d % nd for d in dims}) if nd else []
        out_sizes = [1 if i in dims else s for i, s in enumerate(x.sizes)] if keepdim else \
            [s for i, s in enumerate(x.sizes) if i not in dims]
        acc_dtype = acc_dtype or out_dtype
        if any(x.sizes[d] == 0 for d in dims):
            if rtype not in ("sum", "prod", "any", "all"):
                raise Decline(f"{rtype} over an empty dimension")  # eager raises; let it
            ident = {"sum": 0, "prod": 1, "any": False, "all": True}[rtype]
            return Lazy(out_sizes, out_dtype, x.device, lambda idx: ir.const(ident, out_dtype))
        reduced_real = [d for d in dims if x.sizes[d] != 1]
        if not reduced_real:  # only size-1 dims: the reduction is a pointwise copy
            def fn(idx, keep=keepdim):
                full = list(idx) if keep else _reinsert(idx, dims, nd)
                if rtype in ("argmax", "argmin"):
                    return ir.const(0, out_dtype)
                e = x.load(full)
                e = body_fn(e) if body_fn else e
                if rtype in ("any", "all"):
                    e = ir.op("ne", e, ir.const(0, e.dtype))
                return ir.cast(e, out_dtype)
            return Lazy(out_sizes, out_dtype, x.device, fn)
        order = list(range(nd))
        if rtype not in ("argmax", "argmin"):  # those return the position in logical order
            logical = squeeze_vars(x.sizes)[1]
            order = self.load_order(x.load(logical), logical) or order
        ranges, idx = ordered_vars(x.sizes, order)
        loop_dims = [d for d in order if x.sizes[d] != 1]
        reduced = tuple(sorted(loop_dims.index(d) for d in reduced_real))
        e = x.load(idx)
        if body_fn:
            e = body_fn(e)
        if rtype in ("any", "all"):
            e = ir.op("ne", e, ir.const(0, e.dtype))
        elif rtype not in ("argmax", "argmin"):
            e = ir.cast(e, acc_dtype)
        e = self._resolve(e)
        e = ir.simplify_expr(e, dict(zip(ir.node_vars(len(ranges)), ranges)), lower=self.sv.lower)
        strides = ir.contiguous_strides(out_sizes)
        layout = ir.Layout(tuple(out_sizes), strides, out_dtype, x.device)
        # store index: output dim j <- the loop var of the input dim it keeps
        kept_in = [i for i in range(nd) if i not in dims]
        store = sympy.Integer(0)
        for j, s in enumerate(out_sizes):
            src = j if keepdim else kept_in[j]
            if s != 1 and src not in dims:
                store = store + idx[src] * strides[j]
        name = self.new_name()
        node = ir.ComputedNode(name, layout, ranges, e, store, reduced=reduced, reduction_type=rtype,
                               origins=_merge_origins(getattr(x, "origins", []), self.origins()))
        self.nodes.append(node)
        self.layouts[name] = layout
        return Stored(self, name, out_sizes, strides, 0, out_dtype, x.device)

    # -- externs --------------------------------------------------------------------------------
    def buffer_arg(self, v: Value) -> ir.BufferArg:
        # a lazy value passed to several extern calls (the attention mask of every layer) is
        # realized once; values are immutable inside the graph (mutations happen at its end)
        hit = self._extern_args.get(id(v))
        if hit is None or hit[0] is not v:
            hit = self._extern_args[id(v)] = (v, self.realize(v))
        s = hit[1]
        return ir.BufferArg(s.buf, s.sizes, s.strides, s.offset)

    def aligned_arg(self, v: Value, align: int, meta=None) -> ir.BufferArg:
        """v as an extern argument whose strides, all but the last dim's, must be multiples of
        ``align`` elements (``EXTERN_ALIGN``): v's buffer if it is laid out so, else a copy into a
        buffer with padded rows. Dims that eager broadcasts (stride 0 in ``meta``, the argument's
        eager value) stay broadcast instead of being copied."""
        if isinstance(v, Stored) and _aligned(v.sizes, v.strides, v.offset, align):
            return ir.BufferArg(v.buf, v.sizes, v.strides, v.offset)
        eager = None
        if isinstance(meta, torch.Tensor):
            try:  # (SymInt sizes translated to this graph's size symbols)
                eager = norm_sizes(meta.stride()) if norm_sizes(meta.shape) == tuple(v.sizes) else None
            except SymbolicUnsupported:
                eager = None
        like = v.strides if isinstance(v, Stored) else eager or ir.contiguous_strides(v.sizes)
        # (a symbolic size with stride 0 is broadcast for every size: eager expanded it)
        bcast = [st == 0 and (not is_static(s) or s > 1) for s, st in zip(v.sizes, like)]
        base_sizes = tuple(1 if b else s for s, b in zip(v.sizes, bcast))
        strides = _padded_strides(base_sizes, memory_order(like, self.sv.hint), align)
        base = Lazy(base_sizes, v.dtype, v.device, v.load)
        base.origins = getattr(v, "origins", [])
        s = self.realize(base, strides, padded=True)
        return ir.BufferArg(s.buf, v.sizes, tuple(0 if b else st for b, st in zip(bcast, strides)), 0)

    def extern(self, node: torch.fx.Node, args, kwargs, reason="") -> object:
        """Call node.target at run time on realized arguments; returns its value(s) as Stored."""
        if node.meta.get("ember_rewrite"):  # what a graph pass made it from (the output code's comment)
            reason = f"{reason} [{node.meta['ember_rewrite']}]".strip()
        align = EXTERN_ALIGN.get(node.target, {})

        def conv(a, name=None, src=None):
            if isinstance(a, Value):
                if name in align:
                    return self.aligned_arg(a, align[name], getattr(src, "meta", {}).get("val"))
                return self.buffer_arg(a)
            if isinstance(a, ir.RuntimeValue):
                return a
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a)
            if isinstance(a, (torch.fx.Node, torch.SymFloat, torch.SymBool)):
                raise Unsupported(f"extern {node.target} with argument {a}")
            if isinstance(a, (torch.SymInt, sympy.Basic)):
                return norm(a)  # a size: the wrapper computes it from the size symbols
            return a
        names = [a.name for a in node.target._schema.arguments] if align else []
        cargs = tuple(conv(a, names[i] if i < len(names) else None, node.args[i] if i < len(node.args) else None)
                      for i, a in enumerate(args))
        ckwargs = {k: conv(v, k, node.kwargs.get(k)) for k, v in kwargs.items()}
        val = node.meta.get("val")
        multi = isinstance(val, (list, tuple))
        vals = list(val) if multi else [val]
        outputs, results = [], []
        name = self.new_name()
        for i, t in enumerate(vals):
            if isinstance(t, torch.Tensor):
                oname = f"{name}_{i}" if multi else name
                layout = tensor_layout(t)
                self.layouts[oname] = layout
                outputs.append((oname, layout))
                results.append(Stored(self, oname, layout.sizes, layout.strides, 0, t.dtype, layout.device))
            elif t is None:
                outputs.append(None)
                results.append(None)
            elif isinstance(t, (int, float, bool, torch.SymInt)):
                oname = f"{name}_{i}" if multi else name
                outputs.append((oname, None))
                results.append(ir.RuntimeValue(oname))
            else:
                raise Unsupported(f"extern {node.target} returns a {type(t).__name__}")
        self.nodes.append(ir.ExternNode(name, node.target, cargs, ckwargs, outputs, multi,
                                        origins=self.origins(), reason=reason))
        return results if multi else results[0]

    # -- graph walk -----------------------------------------------------------------------------
    def run(self) -> ir.GraphIR:
        with active(self.sv):  # SymInts in FakeTensor metadata translate to this graph's size symbols
            g = self._run()
        unread = set(self.sv.hints) - set(self.sv.sources)
        if unread:
            raise SymbolicUnsupported(f"size symbols {sorted(map(str, unread))} are not sizes of any input")
        g.sizevars = self.sv
        g.num_args = len(self.example_inputs)
        return g

    def _run(self) -> ir.GraphIR:
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.example_inputs):
            raise Unsupported("example inputs do not match the placeholders")
        devs = {t.device for t in self.example_inputs if isinstance(t, torch.Tensor)}
        if len(devs) > 1:
            raise Unsupported(f"inputs on several devices {sorted(map(str, devs))}")
        self.device = devs.pop() if devs else torch.device("cpu")
        complex_at = next((n for n in graph.nodes if _is_complex(n.meta.get("val"))), None)
        if complex_at is not None:  # neither renderer spells complex types (Triton has none): ATen runs it
            raise Unsupported(f"complex tensor at {complex_at.name}: the native backend compiles real dtypes only")
        for pos, (n, ex) in enumerate(zip(placeholders, self.example_inputs)):
            if self.symbolic and isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt)):
                ex = n.meta["val"]
            self.env[n] = self._placeholder(n, ex, pos)
            if isinstance(self.env[n], Stored):
                self.input_buf[n] = self.env[n].buf
        uses = {n: len(n.users) for n in graph.nodes}
        out = None
        for n in graph.nodes:
            self.current = n
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":
                self.env[n] = self._constant(n)
            elif n.op == "call_function":
                v = self._call(n)
                _hint_strides(v, n.meta.get("val"))
                if isinstance(v, Lazy) and self.should_realize(v, uses[n]):
                    v = self.realize(v)
                self.env[n] = v
            elif n.op == "output":
                out = self._outputs(n.args[0])
            else:
                raise Unsupported(f"fx node kind {n.op}")
        self.current = None
        return ir.GraphIR(self.inputs, self.nodes, out, self.mutations)

    def _placeholder(self, n, ex, pos):
        name = f"arg{pos}"
        if isinstance(ex, torch.Tensor):
            layout = tensor_layout(ex)
            for what, vals in (("size", layout.sizes), ("stride", layout.strides)):
                for i, e in enumerate(vals):
                    if isinstance(e, sympy.Symbol):
                        self.sv.bind(e, f"{name}.{what}({i})")
            if isinstance(layout.offset, sympy.Symbol):
                self.sv.bind(layout.offset, f"{name}.storage_offset()")
            self.inputs.append(ir.InputBuffer(name, layout, index=pos))
            self.layouts[name] = layout
            return Stored(self, name, layout.sizes, layout.strides, 0, ex.dtype, ex.device)
        if isinstance(ex, torch.SymInt):
            e = norm(ex)
            if isinstance(e, sympy.Symbol) and e not in self.sv.sources:
                self.sv.bind(e, name)
            else:  # read elsewhere, or an expression: the wrapper checks the value after reading the sizes
                self.int_inputs[pos] = e
            return e
        if isinstance(ex, (bool, int, float)):
            if isinstance(ex, int):
                self.int_inputs[pos] = ex  # specialized: the wrapper checks it on every call
            return ex
        if ex is None:
            return None
        raise Unsupported(f"placeholder of type {type(ex).__name__}")

    def _constant(self, n):
        t = getattr(self.gm, n.target)
        if not isinstance(t, torch.Tensor):
            return t
        if t.device != self.device:
            if t.numel() != 1:
                raise Unsupported(f"constant {n.target} on {t.device}, graph on {self.device}")
            t = t.to(self.device)  # a scalar: the backend moves it once (backend._constant)
        name = f"const{len(self.inputs)}"
        layout = tensor_layout(t)
        self.inputs.append(ir.InputBuffer(name, layout, constant=t, target=n.target))
        self.layouts[name] = layout
        return Stored(self, name, t.shape, t.stride(), 0, t.dtype, t.device)

    def _call(self, n: torch.fx.Node):
        args = torch.fx.node.map_arg(n.args, lambda a: self.env[a])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: self.env[a])
        target = n.target
        if target is operator.getitem:
            return args[0][args[1]]
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) or (target in SIZE_OPS and isinstance(val, int)):
            # size arithmetic (sym_size, operator.mul on sizes...): the traced value already is the
            # expression over the graph's size symbols
            return norm(val)
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            raise SymbolicUnsupported(f"{target} computes a symbolic {type(val).__name__}")
        if not isinstance(target, torch._ops.OpOverload):
            raise Unsupported(f"call of {target}")
        if self._elsewhere(n, args, kwargs):
            return self.extern(n, args, kwargs, reason=f"(computes off {self.device})")
        fn = LOWERINGS.get(target)
        vals = _values((args, kwargs))
        if any(isinstance(v, ir.RuntimeValue) for v in vals):
            fn = None  # a value only known at run time: only an extern call can take it
        if fn is not None:
            if any(self._elsewhere_scalar(v) for v in vals):
                args, kwargs = self._fetch_scalars((args, kwargs))
                vals = _values((args, kwargs))
            self._inlined = _merge_origins(*[v.origins for v in vals if isinstance(v, Lazy)])
            try:
                out = fn(self, n, *args, **kwargs)
            except Decline:
                out = self.extern(n, args, kwargs, reason="(lowering declined)")
            mine = self.origins()
            for v in _values(out):
                if isinstance(v, Lazy) and not v.origins:
                    v.origins = mine
            self._inlined = []
            return out
        if target._schema.is_mutable:
            return self._inplace(n, target, args, kwargs)
        if target in EXTERN_OPS:
            return self.extern(n, args, kwargs)
        return self.extern(n, args, kwargs, reason="(no lowering)")

    # -- values on another device ----------------------------------------------------------------
    def _elsewhere(self, n, args, kwargs) -> bool:
        """Does n compute on another device than the graph's (CPU index math in a CUDA graph, e.g.
        MPNet's relative position buckets, ``torch.arange(n)`` then ``.to(x.device)``)? Triton
        kernels run on the graph's device only, so n stays an ATen call, with eager's results.
        Ops on one-element constants, which ``_constant`` moved to the graph's device, are not."""
        meta = n.meta.get("val")
        devs = {m.device for m in (meta if isinstance(meta, (list, tuple)) else [meta]) if isinstance(m, torch.Tensor)}
        if not devs or devs == {self.device}:
            return False
        vals = [v for v in _values((args, kwargs)) if isinstance(v, Value)]
        return not vals or any(v.device != self.device for v in vals)

    def _elsewhere_scalar(self, v) -> bool:
        return isinstance(v, Stored) and v.device != self.device and v.numel == 1

    def _fetch_scalars(self, tree):
        """tree with every one-element value of another device (a CPU scalar tensor, which eager
        lets CUDA ops read) replaced by a copy on the graph's device, made once per buffer."""
        if isinstance(tree, (list, tuple)):
            return type(tree)(self._fetch_scalars(t) for t in tree)
        if isinstance(tree, dict):
            return {k: self._fetch_scalars(t) for k, t in tree.items()}
        if not self._elsewhere_scalar(tree):
            return tree
        key = (tree.buf, tree.offset)
        if key not in self._fetched:
            name = self.new_name()
            layout = ir.Layout(tree.sizes, ir.contiguous_strides(tree.sizes), tree.dtype, self.device)
            arg = ir.BufferArg(tree.buf, tree.sizes, tree.strides, tree.offset)
            self.nodes.append(ir.ExternNode(name, aten._to_copy.default, (arg,), {"device": self.device},
                                            [(name, layout)], origins=self.origins(), reason="(to the graph's device)"))
            self.layouts[name] = layout
            self._fetched[key] = Stored(self, name, tree.sizes, layout.strides, 0, tree.dtype, self.device)
        return self._fetched[key]

    def _inplace(self, n, target, args, kwargs):
        """``x.add_(y)``-style ops (graphs that were not functionalized): lower the functional op and
        rebind x, and every in-place result aliasing x, to the new value. Refused when a view of x
        exists (it would have to see the change too); graph inputs are written back at the end."""
        name = target._schema.name.split("::")[1]
        if not name.endswith("_") or target._schema.arguments[0].alias_info is None:
            raise Unsupported(f"mutating op {target}")
        functional = getattr(getattr(aten, name[:-1], None), target._overloadname, None)
        fn = LOWERINGS.get(functional)
        if fn is None:
            raise Unsupported(f"mutating op {target} without a functional lowering")
        chain = [n.args[0]]  # x, or an earlier in-place result that is x
        while _alias_kind(chain[-1]) == "inplace":
            chain.append(chain[-1].args[0])
        root = chain[-1]
        if _alias_kind(root) == "view":
            raise Unsupported(f"{target} mutates a view")
        for alias in chain:
            if any(_alias_kind(u) == "view" for u in alias.users):
                raise Unsupported(f"{target} mutates a tensor that has views")
        v = fn(self, n, *args, **kwargs)
        if isinstance(v, Lazy) and not v.origins:
            v.origins = self.origins()
        if root.op == "placeholder":
            self.mutations.append((self.input_buf[root], root))
        for alias in chain:
            self.env[alias] = v  # later users of x read the new value
        return v

    def _outputs(self, tree):
        final = {}  # input buffer -> the node holding its last value
        for buf, node in self.mutations:
            final[buf] = node
        self.mutations = []
        for buf, node in final.items():
            v = self.env[node]
            if isinstance(v, Stored) and not (v.buf in self.layouts and v.is_whole(self.layouts[v.buf])):
                v = Lazy(v.sizes, v.dtype, v.device, v.load)  # a view: copy it into its own buffer
            s = self.realize(v)
            self.mutations.append((buf, s.buf))

        def conv(a):
            if isinstance(a, torch.fx.Node):
                v = self.env[a]
                if isinstance(v, Value):
                    meta = a.meta.get("val")
                    strides = norm_sizes(meta.stride()) if isinstance(meta, torch.Tensor) else None
                    hit = self._extern_args.get(id(v)) if isinstance(v, Lazy) else None
                    if hit is not None and hit[0] is v and (
                            strides is None or _same_strides(v.sizes, hit[1].strides, strides)):
                        # already in a buffer as an extern's argument (autocast's bf16 copy of a weight,
                        # read by the convolution and saved for the backward): return that buffer
                        # rather than write the same values into a second one
                        v = hit[1]
                    if (isinstance(v, Stored) and strides is not None and _dense_strides(v.sizes, strides, self.sv)
                            and not _same_strides(v.sizes, v.strides, strides)):
                        # a view whose traced metadata promises other strides: the output gets
                        # the strides eager gives it
                        v = Lazy(v.sizes, v.dtype, v.device, v.load)
                    s = self.realize(v, strides)
                    return ir.OutBuf(s.buf, s.sizes, s.strides, s.offset)
                return v if isinstance(v, ir.RuntimeValue) else ir.OutConst(v)
            if isinstance(a, (list, tuple)):
                return type(a)(conv(x) for x in a)
            return ir.OutConst(a)
        return conv(tree)


def _alias_kind(node) -> str | None:
    """'view' for ops returning an alias of their first argument, 'inplace' for ops writing it."""
    t = getattr(node, "target", None)
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or not t._schema.arguments:
        return None
    info = t._schema.arguments[0].alias_info
    if info is None:
        return None
    return "inplace" if info.is_write else "view"


def _merge_origins(*lists):
    out = []
    for lst in lists:
        for o in lst:
            if o not in out:
                out.append(o)
    return out


def _values(tree, out=None) -> list:
    """The leaves of a tree of lists, tuples and dicts, in order (a list: ``_call`` looks at them
    several times; a recursive generator cost ~0.2 s of a 24-layer Llama's training compile)."""
    if out is None:
        out = []
    if isinstance(tree, (list, tuple)):
        for t in tree:
            if isinstance(t, (list, tuple, dict)):
                _values(t, out)
            else:
                out.append(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            if isinstance(t, (list, tuple, dict)):
                _values(t, out)
            else:
                out.append(t)
    else:
        out.append(tree)
    return out


def _reinsert(idx, dims, nd):
    """Index into the unreduced tensor from an index of the keepdim=False output."""
    it = iter(idx)
    return [sympy.Integer(0) if i in dims else next(it) for i in range(nd)]


def _dense_strides(sizes, strides, sv=None) -> bool:
    """True if strides describe a non-overlapping dense layout (a permutation of contiguous), for
    every value of the size symbols (ordered by their hints, then checked exactly)."""
    if len(sizes) != len(strides):
        return False
    dims = [(st, s) for s, st in zip(sizes, strides) if s != 1]
    if all(isinstance(st, int) for st, _ in dims):
        dims.sort(key=lambda d: d[0])
    elif sv is None:
        return False
    else:
        dims.sort(key=lambda d: sv.hint(d[0]))
    acc = 1
    for st, s in dims:
        if not eq(st, acc):
            return False
        acc = acc * s
    return True


def tensor_layout(t: torch.Tensor) -> ir.Layout:
    """The Layout of a (Fake)Tensor, its SymInts translated to size expressions."""
    return ir.Layout(norm_sizes(t.shape), norm_sizes(t.stride()), t.dtype, t.device, norm(t.storage_offset()))


def _aligned(sizes, strides, offset, align) -> bool:
    """Are the start and the strides of all dims but the last multiples of align, the last dim's 1?"""
    last_ok = not sizes or sizes[-1] == 1 or strides[-1] == 1
    return last_ok and offset % align == 0 and all(st % align == 0 for st in strides[:-1])


def _padded_strides(sizes, order, align) -> tuple:
    """Strides laying sizes out in order (outermost dim first), every stride but the innermost one
    rounded up to a multiple of align: rows padded for aligned vector loads."""
    strides, acc, inner = [0] * len(sizes), 1, True
    for d in reversed(order):
        if not inner:  # (a symbolic row length rounds up at run time: FloorDiv of a size >= 0)
            acc = -(-acc // align) * align if is_static(acc) else FloorDiv(acc + (align - 1), align) * align
        strides[d] = acc
        if sizes[d] != 1:  # a size-1 dim takes an aligned stride, and no room
            acc *= sizes[d]
            inner = False
    return tuple(strides)


def lower(gm: torch.fx.GraphModule, example_inputs, libdevice: bool = True) -> tuple[ir.GraphIR, GraphLowering]:
    """``libdevice``: the graph renders as Triton, whose libdevice calls are inlined code
    (``GraphLowering.REALIZE_LIBDEVICE_NUMEL``); False for the C++ renderer."""
    from ember.native import lower_ops, lower_pool, lower_views  # noqa: F401  (fill the tables)
    L = GraphLowering(gm, example_inputs, libdevice)
    return L.run(), L
