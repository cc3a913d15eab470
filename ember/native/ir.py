"""The loop-level IR of the native backend.

Two layers:

* **index expressions** are sympy integers over loop variables (``v0, v1, ...``), indirect symbols
  (``ind*``, a value loaded at run time) and, for graphs traced with dynamic shapes, size symbols
  (``s0, s1, ...``). Sizes, strides and ranges are ints or sympy expressions over size symbols; the
  arithmetic (``FloorDiv``, ``IMod``, bounds, simplification, proofs) lives in ``symbolic.py``.
* **value expressions** (``Expr``) are small immutable trees: ``load``, ``const``, ``index``, ``cast``,
  ``masked`` and the pointwise ops of the registry (``ops.py``). They are hashed structurally, so equal
  subtrees are the same value; the emitter's CSE relies on that.

A graph is a list of nodes: ``ComputedNode`` (pointwise, or a reduction over some of its ranges) and
``ExternNode`` (a call to an ATen op that we do not generate code for). ``GraphIR.format()`` prints the
IR; ``verify`` checks it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import sympy
import torch

# index arithmetic lives in symbolic.py; re-exported here, where the IR's users look for it
from ember.native.symbolic import (FloorDiv, IMod, SizeVars, as_int_or_expr, bounds, is_indirect,  # noqa: F401
                                   is_size_symbol, node_vars, simplify_index, size_symbols_of, sym)
from ember.native.symbolic import _simplify_index

# --------------------------------------------------------------------------------------------------
# value expressions

# The pointwise ops (name, arity, result-dtype kind, renderings, ATen overloads) are declared
# once, in the op registry ops.py (imported at the end of this module: it builds Exprs).

REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


class Expr:
    """One value-level operation. ``attr`` holds the non-Expr part:

    load: ``(buffer_name, index, indirect_symbols)``; ``args`` are the Exprs of the indirect symbols.
    const: the Python value. index: a sympy expression (its integer value). cast: None.
    masked: the fill value; ``args = (mask, body)``, and loads inside ``body`` are masked by ``mask``.
    """
    __slots__ = ("op", "args", "dtype", "attr", "_hash")

    def __init__(self, op: str, args: tuple, dtype: torch.dtype, attr: Any = None):
        self.op, self.args, self.dtype, self.attr = op, tuple(args), dtype, attr
        key = attr if not isinstance(attr, float) or not math.isnan(attr) else "nan"
        self._hash = hash((op, self.args, dtype, key))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Expr) or self._hash != other._hash:
            return False
        if self.op != other.op or self.dtype != other.dtype or self.args != other.args:
            return False
        a, b = self.attr, other.attr
        if isinstance(a, float) and isinstance(b, float):
            if math.isnan(a) and math.isnan(b):
                return True
            # (-0.0 == 0.0: a value shared by both spellings turned x + -0.0, which keeps x's -0.0,
            # into x + 0.0, which does not)
            return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
        return a == b and type(a) is type(b)

    def __repr__(self):
        return format_expr(self)


def load(buf: str, index, indirect: dict, dtype) -> Expr:
    """A read of ``buf`` at ``index``; ``indirect`` maps every ``ind*`` symbol in it to its Expr."""
    index = sympy.sympify(index)
    syms = _INDIRECT_OF.get(index)
    if syms is None:  # (sympy recomputes free_symbols on every call; each layer loads the same indices)
        syms = tuple(sorted((s for s in index.free_symbols if is_indirect(s)), key=lambda s: s.name))
        if len(_INDIRECT_OF) >= 100_000:
            _INDIRECT_OF.clear()
        _INDIRECT_OF[index] = syms
    return Expr("load", tuple(indirect[s] for s in syms), dtype, (buf, index, syms))


_INDIRECT_OF: dict = {}  # index expression -> its indirect symbols, sorted by name (load)


def const(value, dtype) -> Expr:
    """A constant; a symbolic size (a sympy expression over size symbols) becomes its index value,
    read from the kernel's size arguments, cast to dtype."""
    if isinstance(value, sympy.Basic):
        if not value.is_Integer:
            return cast(index_value(value), dtype)
        value = int(value)
    if dtype == torch.bool:
        value = bool(value)
    elif dtype.is_floating_point:
        value = float(value)
    else:
        value = int(value)
    return Expr("const", (), dtype, value)


def index_value(expr, dtype=torch.int64) -> Expr:
    return Expr("index", (), dtype, sympy.sympify(expr))


def cast(x: Expr, dtype) -> Expr:
    if x.dtype == dtype:
        return x
    if x.op == "const":
        return const(x.attr, dtype)
    return Expr("cast", (x,), dtype)


def op(name: str, *args: Expr, dtype=None) -> Expr:
    arity, kind = _ops.SIGNATURE[name]
    assert len(args) == arity, (name, args)
    if dtype is None:
        dtype = torch.bool if kind == "cmp" else args[-1].dtype
    return Expr(name, args, dtype)


def masked(mask: Expr, body: Expr, other) -> Expr:
    return Expr("masked", (mask, body), body.dtype, other)


def walk(roots: Iterable[Expr]):
    """Every distinct Expr reachable from roots, children before parents (a depth-first post-order,
    the last argument first). Recursive, which takes ~40% less time than the explicit stack (walks
    were ~10% of a 24-layer Llama's native compile); a body too deep for Python's recursion limit
    takes the iterative walk, which visits in the same order."""
    roots = roots if isinstance(roots, (list, tuple)) else list(roots)
    seen, order = set(), []
    add, append = seen.add, order.append

    def visit(e):
        add(e)
        for a in reversed(e.args):
            if a not in seen:
                visit(a)
        append(e)
    try:
        for r in reversed(roots):
            if r not in seen:
                visit(r)
        return order
    except RecursionError:
        return _walk_iterative(roots)


def _walk_iterative(roots):
    seen, order = set(), []
    stack = [(r, False) for r in roots]
    while stack:
        e, done = stack.pop()
        if done:
            order.append(e)
            continue
        if e in seen:
            continue
        seen.add(e)
        stack.append((e, True))
        stack.extend((a, False) for a in e.args if a not in seen)
    return order


def rename(e: Expr, mapping: dict, memo: dict | None = None) -> Expr:
    """Substitute index symbols (``xreplace``) everywhere in e: loads and index values."""
    if memo is None:
        memo = {}
    hit = memo.get(e)
    if hit is not None:
        return hit
    args = tuple(rename(a, mapping, memo) for a in e.args)
    attr = e.attr
    if e.op == "load":
        attr = (attr[0], attr[1].xreplace(mapping), attr[2])
    elif e.op == "index":
        attr = attr.xreplace(mapping)
    out = Expr(e.op, args, e.dtype, attr)
    memo[e] = out
    return out


def resolve_indirect(e: Expr, indirect: dict, memo: dict | None = None) -> Expr:
    """Rewrite the ``index`` values of e that use indirect symbols (``ind*``) as value Exprs.

    An indirect symbol is bound only inside the load whose index uses it (``load``'s args); a
    lowering that also turns such an index into a value (a pad's or a cat's bounds mask, an arange
    read at a gathered position) would leave it unbound there. Here each such symbol becomes the
    Expr it stands for, so the value is computed in the kernel like any other."""
    if memo is None:
        memo = {}
    hit = memo.get(e)
    if hit is not None:
        return hit
    if e.op == "index" and any(is_indirect(s) for s in e.attr.free_symbols):
        out = cast(_index_expr(e.attr, indirect), e.dtype)
        out = resolve_indirect(out, indirect, memo)  # the symbols' Exprs may use other symbols
    else:
        args = tuple(resolve_indirect(a, indirect, memo) for a in e.args)
        out = e if all(a is b for a, b in zip(args, e.args)) else Expr(e.op, args, e.dtype, e.attr)
    memo[e] = out
    return out


def _index_expr(x, indirect: dict) -> Expr:
    """The int64 value Expr of the index expression x (a sympy expression over loop variables,
    size symbols and indirect symbols)."""
    if not any(is_indirect(s) for s in x.free_symbols):
        return Expr("index", (), torch.int64, x)
    if is_indirect(x):
        return cast(indirect[x], torch.int64)
    if isinstance(x, (sympy.Add, sympy.Mul)):
        name = "add" if isinstance(x, sympy.Add) else "mul"
        plain = [a for a in x.args if not any(is_indirect(s) for s in a.free_symbols)]
        rest = [a for a in x.args if any(is_indirect(s) for s in a.free_symbols)]
        parts = [_index_expr(a, indirect) for a in rest]
        if plain:  # the terms without indirect symbols stay one index value
            parts.append(_index_expr(x.func(*plain), indirect))
        out = parts[0]
        for p in parts[1:]:
            out = op(name, out, p)
        return out
    if isinstance(x, FloorDiv):
        return op("floordiv", _index_expr(x.args[0], indirect), _index_expr(x.args[1], indirect))
    if isinstance(x, IMod):
        return op("remainder", _index_expr(x.args[0], indirect), _index_expr(x.args[1], indirect))
    if isinstance(x, sympy.Pow) and x.exp.is_Integer and x.exp > 0:
        base = _index_expr(x.base, indirect)
        out = base
        for _ in range(int(x.exp) - 1):
            out = op("mul", out, base)
        return out
    if isinstance(x, (sympy.Max, sympy.Min)):
        name = "maximum" if isinstance(x, sympy.Max) else "minimum"
        parts = [_index_expr(a, indirect) for a in x.args]
        out = parts[0]
        for p in parts[1:]:
            out = op(name, out, p)
        return out
    raise IRError(f"cannot compute index value {x} with indirect symbols")


def loads_of(e: Expr) -> list[Expr]:
    return [x for x in walk([e]) if x.op == "load"]


def opcount(e: Expr) -> int:
    return sum(1 for x in walk([e]) if x.op not in ("load", "const", "index"))


_DT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
       torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
       torch.bool: "b8"}


def dtype_str(dt) -> str:
    return _DT.get(dt, str(dt).replace("torch.", ""))


def format_expr(e: Expr) -> str:
    if e.op == "load":
        buf, index, syms = e.attr
        ind = "".join(f", {s}={format_expr(a)}" for s, a in zip(syms, e.args))
        return f"load({buf}, {index}{ind})"
    if e.op == "const":
        return f"{e.attr!r}:{dtype_str(e.dtype)}"
    if e.op == "index":
        return f"index({e.attr})"
    if e.op == "cast":
        return f"to_{dtype_str(e.dtype)}({format_expr(e.args[0])})"
    if e.op == "masked":
        return f"masked({format_expr(e.args[0])}, {format_expr(e.args[1])}, other={e.attr!r})"
    return f"{e.op}({', '.join(format_expr(a) for a in e.args)})"


# --------------------------------------------------------------------------------------------------
# buffers and nodes


def contiguous_strides(sizes) -> tuple:
    """Row-major strides; symbolic sizes give symbolic strides (a symbolic size is never 0 here:
    dynamic dimensions are >= 2)."""
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc = acc * max(s, 1) if isinstance(s, int) else acc * s
    return tuple(reversed(strides))


@dataclasses.dataclass(frozen=True)
class Layout:
    """``offset`` is the tensor's storage offset (for ``as_strided`` in the wrapper); indexing is
    relative to the tensor's first element, which is what a kernel pointer points at."""
    sizes: tuple
    strides: tuple
    dtype: torch.dtype
    device: torch.device
    offset: int = 0

    @property
    def numel(self):
        return math.prod(self.sizes)

    @property
    def storage_numel(self):
        """Elements the layout spans (from offset 0), for allocation and bounds checks."""
        if self.numel == 0:
            return 0
        n = 1 + sum((s - 1) * st for s, st in zip(self.sizes, self.strides))
        return n if isinstance(n, int) else as_int_or_expr(sympy.expand(n))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self):
        return f"{dtype_str(self.dtype)}{list(self.sizes)} strides {tuple(self.strides)}"


@dataclasses.dataclass
class InputBuffer:
    """A graph placeholder (index = its position) or a constant tensor of the GraphModule."""
    name: str
    layout: Layout
    index: int | None = None
    constant: torch.Tensor | None = None
    target: str | None = None  # the GraphModule attribute of a constant


@dataclasses.dataclass
class ComputedNode:
    """``ranges`` are the loop sizes (no size-1 loops). A pointwise node stores ``body`` at
    ``store_index`` for every point. A reduction reduces ``body`` over the loops named in
    ``reduced`` and stores at ``store_index``, which then only uses the kept loop variables."""
    name: str
    layout: Layout
    ranges: tuple
    body: Expr
    store_index: Any
    reduced: tuple = ()
    reduction_type: str | None = None
    origins: list = dataclasses.field(default_factory=list)  # (aten op name, stack trace or None)

    @property
    def is_reduction(self) -> bool:
        return self.reduction_type is not None

    @property
    def kept(self) -> tuple:
        return tuple(i for i in range(len(self.ranges)) if i not in self.reduced)

    @property
    def var_ranges(self) -> dict:
        return dict(zip(node_vars(len(self.ranges)), self.ranges))


@dataclasses.dataclass
class ExternNode:
    """A call of an ATen op. ``args``/``kwargs`` hold ``BufferArg``s where tensors go; ``outputs``
    names the buffers of its tensor results (a flat list, following ``out_spec``)."""
    name: str
    target: Any
    args: tuple
    kwargs: dict
    outputs: list          # list[(buffer name, Layout) | (value name, None) for non-tensors | None]
    multi: bool = False    # the op returns a tuple/list
    origins: list = dataclasses.field(default_factory=list)
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class BufferArg:
    """A tensor argument of an extern call: a strided view of a buffer."""
    name: str
    sizes: tuple
    strides: tuple
    offset: int


@dataclasses.dataclass(frozen=True)
class OutBuf:
    """A graph output: a view of a buffer (offset relative to the buffer's first element)."""
    name: str
    sizes: tuple
    strides: tuple
    offset: int


@dataclasses.dataclass(frozen=True)
class OutConst:
    value: Any


@dataclasses.dataclass(frozen=True)
class RuntimeValue:
    """A non-tensor result of an extern call (e.g. the max sequence length flash attention returns),
    known only at run time: it can be passed to other extern calls or returned, not computed on."""
    name: str


@dataclasses.dataclass
class GraphIR:
    inputs: list                 # InputBuffer, placeholders and constants
    nodes: list                  # ComputedNode | ExternNode in program order
    outputs: Any                 # pytree (lists/tuples) of OutBuf | OutConst | RuntimeValue
    mutations: list = dataclasses.field(default_factory=list)  # (input name, computed buffer name)
    sizevars: SizeVars = dataclasses.field(default_factory=SizeVars)  # size symbols (dynamic shapes)
    num_args: int = 0            # placeholders (tensors, ints, size symbols read from SymInt arguments)

    def buffers(self) -> dict:
        out = {b.name: b.layout for b in self.inputs}
        for n in self.nodes:
            if isinstance(n, ComputedNode):
                out[n.name] = n.layout
            else:
                for o in n.outputs:
                    if o is not None and o[1] is not None:
                        out[o[0]] = o[1]
        return out

    def format(self) -> str:
        lines = [f"# {line}" for line in self.sizevars.describe().splitlines()]
        for b in self.inputs:
            kind = "constant" if b.constant is not None else f"input {b.index}"
            lines.append(f"{b.name}: {b.layout}  # {kind}")
        for n in self.nodes:
            lines.append(format_node(n))
        lines.append(f"return {self.outputs}")
        for dst, src in self.mutations:
            lines.append(f"copy_({dst}, {src})")
        return "\n".join(lines)


def format_node(n) -> str:
    ops = ", ".join(sorted({o for o, _ in n.origins}))
    if isinstance(n, ExternNode):
        outs = ", ".join(o[0] if o else "_" for o in n.outputs)
        return f"{outs} = extern {n.target}(args={n.args}, kwargs={n.kwargs})  # {ops} {n.reason}".rstrip()
    head = f"{n.name}: {n.layout} = "
    if n.is_reduction:
        head += f"{n.reduction_type} over ranges {list(n.ranges)} reducing {list(n.reduced)}"
    else:
        head += f"pointwise over ranges {list(n.ranges)}"
    return f"{head}  # {ops}\n    body: {format_expr(n.body)}\n    store: {n.store_index}"


# --------------------------------------------------------------------------------------------------
# verifier


class IRError(AssertionError):
    pass


def verify(g: GraphIR) -> None:
    """Check the invariants the scheduler and emitter rely on; raises IRError. Symbolic sizes must
    be size symbols the wrapper can read; bounds are checked at the symbols' hints."""
    known: dict[str, Layout] = {b.name: b.layout for b in g.inputs}
    sv = g.sizevars
    sizes = set(sv.hints)
    unread = sizes - set(sv.sources)
    _check(not unread, lambda: f"size symbols {sorted(map(str, unread))} are read from no input")

    def at_hint(e):
        return e if isinstance(e, int) or not sizes else sympy.sympify(e).xreplace(sv.hints)

    def size_ok(r):
        return (isinstance(r, int) and r != 1 and r >= 0) or \
            (isinstance(r, sympy.Basic) and not r.is_Integer and r.free_symbols <= sizes)
    # memos: the nodes of a deep model's layers load at the same indices over the same ranges
    free_of, bounds_of, storage_of = {}, {}, {}  # index -> free symbols, (index, ranges) -> bounds, buffer -> size
    for n in g.nodes:
        if isinstance(n, ExternNode):
            for a in _buffer_args((n.args, n.kwargs)):
                _check(a.name in known, lambda: f"{n.name}: extern reads unknown buffer {a.name}")
            for o in n.outputs:
                if o is not None and o[1] is not None:
                    _check(o[0] not in known, lambda: f"{o[0]} defined twice")
                    known[o[0]] = o[1]
            continue
        _check(n.name not in known, lambda: f"{n.name} defined twice")
        _check(all(size_ok(r) for r in n.ranges),
               lambda: f"{n.name}: ranges must be ints != 1 or expressions of size symbols: {n.ranges}")
        _check(all(0 <= d < len(n.ranges) for d in n.reduced), lambda: f"{n.name}: bad reduced dims {n.reduced}")
        _check(bool(n.reduced) == n.is_reduction, lambda: f"{n.name}: reduction without reduced dims or vice versa")
        if n.is_reduction:
            _check(n.reduction_type in REDUCTION_TYPES, lambda: f"{n.name}: unknown reduction {n.reduction_type}")
        vr = n.var_ranges
        allowed = set(vr) | sizes
        vr = {v: int(at_hint(r)) for v, r in vr.items()}
        vr_key = tuple(vr.items())
        guarded = _masked_loads(n.body)  # loads under masked() may address outside when masked off
        empty = 0 in vr.values()
        for e in walk([n.body]):
            if e.op == "load":
                buf, index, syms = e.attr
                _check(buf in known, lambda: f"{n.name}: load of unknown buffer {buf}")
                free = free_of.get(index)
                if free is None:  # (sympy recomputes free_symbols per call; each layer has the same indices)
                    free = free_of[index] = index.free_symbols
                extra = {s for s in free if s not in allowed and s not in syms}
                _check(not extra, lambda: f"{n.name}: load index {index} uses unbound symbols {extra}")
                key = (index, vr_key)
                if key not in bounds_of:
                    bounds_of[key] = bounds(at_hint(index), vr)
                b = bounds_of[key]
                storage = storage_of.get(buf)
                if storage is None:
                    storage = storage_of[buf] = at_hint(known[buf].storage_numel)
                if b is not None and not syms and not empty and e not in guarded:
                    _check(b[0] >= 0 and b[1] < max(storage, 1), lambda:
                           f"{n.name}: load {buf}[{index}] out of bounds {b} (storage {storage})")
            elif e.op == "index":
                extra = e.attr.free_symbols - allowed
                _check(not extra, lambda: f"{n.name}: index value {e.attr} uses unbound symbols {extra}")
            elif e.op in _ops.SIGNATURE:
                _check(len(e.args) == _ops.SIGNATURE[e.op][0], lambda: f"{n.name}: {e.op} arity")
            else:
                _check(e.op in ("const", "cast", "masked"), lambda: f"{n.name}: unknown op {e.op}")
        store_vars = set(n.store_index.free_symbols) - sizes if isinstance(n.store_index, sympy.Basic) else set()
        kept_vars = {node_vars(len(n.ranges))[i] for i in n.kept}
        _check(store_vars <= kept_vars, lambda: f"{n.name}: store index {n.store_index} uses non-kept vars")
        b = bounds(at_hint(sympy.sympify(n.store_index)), vr)
        _check(at_hint(n.layout.numel) == 0 or b is not None and b[0] >= 0 and b[1] < at_hint(n.layout.storage_numel),
               lambda: f"{n.name}: store index {n.store_index} out of bounds {b}")
        known[n.name] = n.layout
    for dst, src in g.mutations:
        _check(dst in known and src in known, lambda: f"mutation {dst} <- {src} names unknown buffers")


def _masked_loads(body: Expr) -> set:
    out = set()
    for e in walk([body]):
        if e.op == "masked":
            out.update(x for x in walk([e.args[1]]) if x.op == "load")
    return out


def _check(cond, msg):
    """msg is a callable: formatting sympy expressions costs more than the checks themselves."""
    if not cond:
        raise IRError(msg())


def _buffer_args(tree):
    if isinstance(tree, BufferArg):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _buffer_args(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            yield from _buffer_args(t)


buffer_args = _buffer_args


def simplify_expr(e: Expr, ranges: dict, memo: dict | None = None, lower: dict | None = None) -> Expr:
    """``simplify_index`` applied to every load index and index value in e (``lower``: lower bounds
    of size symbols, for the proofs)."""
    # (simplify_index's cache context, made once here rather than for every index of the body)
    context = (tuple(ranges.items()), tuple(lower.items()) if lower else None)
    return _simplify_expr(e, ranges, {} if memo is None else memo, lower, context)


def _simplify_expr(e: Expr, ranges: dict, memo: dict, lower, context) -> Expr:
    hit = memo.get(e)
    if hit is not None:
        return hit
    args = tuple(_simplify_expr(a, ranges, memo, lower, context) for a in e.args)
    attr = e.attr
    if e.op == "load":
        attr = (attr[0], _simplify_index(attr[1], ranges, lower, context), attr[2])
    elif e.op == "index":
        attr = _simplify_index(attr, ranges, lower, context)
    out = Expr(e.op, args, e.dtype, attr) if (args != e.args or attr is not e.attr) else e
    memo[e] = out
    return out


from ember.native import ops as _ops  # noqa: E402  (the registry imports this module)
