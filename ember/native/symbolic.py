"""Index and size arithmetic of the native backend: sympy expressions, their bounds, simplification,
proofs and printing, and the size symbols of graphs traced with dynamic shapes.

Three kinds of symbols appear in index expressions:

* loop variables ``v0, v1, ...`` (a node's or a kernel's iteration space) and indirect values ``ind*``
  (a value loaded at run time), made by ``sym``;
* **size symbols** ``s0, s1, ...``: the sizes a graph traced with dynamic shapes leaves open. They are
  the ShapeEnv's symbols renamed in order of first appearance among the graph's inputs (``SizeVars``),
  so one program gives the same IR, kernels and cache key whatever numbering the frontend used.

A size is a Python int when it is static and a sympy expression over size symbols otherwise.
``FloorDiv`` and ``IMod`` are our integer division and modulo (sympy's ``floor``/``Mod`` carry sign
rules we never need and simplify slowly); ShapeEnv expressions are translated into them.

Two kinds of decisions are taken about sizes. Those that must hold for every size (removing a
modulo, leaving out a mask, reading a view without a copy) need a *proof*: ``known_nonneg`` shifts
each size symbol by its lower bound and checks that the polynomial left has no negative
coefficient. Those that only affect speed (block sizes, persistent vs looped reductions, fusion
scores) use *hints*, the sizes seen when the graph was traced.
"""
from __future__ import annotations

import math

import sympy
import torch

# --------------------------------------------------------------------------------------------------
# integer functions


class FloorDiv(sympy.Function):
    """``a // b`` for integer ``a >= 0`` and ``b > 0`` (printed as ``//``)."""
    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        return None


class IMod(sympy.Function):
    """``a % b`` for integer ``a >= 0`` and ``b > 0`` (printed as ``%``)."""
    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


# --------------------------------------------------------------------------------------------------
# symbols

_SYMBOLS: dict[str, sympy.Symbol] = {}
_SIZE_SYMBOLS: list[sympy.Symbol] = []
_SIZE_SET: set = set()


def sym(name: str) -> sympy.Symbol:
    """Interned integer symbol (loop variables, indirect values)."""
    s = _SYMBOLS.get(name)
    if s is None:
        s = _SYMBOLS[name] = sympy.Symbol(name, integer=True)
    return s


_NODE_VARS: list[sympy.Symbol] = []


def node_vars(n: int) -> list[sympy.Symbol]:
    """``[v0, ..., v{n-1}]`` (a new list: callers may change it). The symbols are kept in order:
    lowering, fusion and emission ask for them ~100,000 times in a 24-layer Llama's training compile."""
    while len(_NODE_VARS) < n:
        _NODE_VARS.append(sym(f"v{len(_NODE_VARS)}"))
    return _NODE_VARS[:n]


def is_indirect(s) -> bool:
    return isinstance(s, sympy.Symbol) and s.name.startswith("ind")


def size_symbol(i: int) -> sympy.Symbol:
    """The i-th size symbol ``s{i}``. Its sign is not an assumption (a symbolic int argument may be
    negative: proofs take lower bounds explicitly); ``finite`` only makes its assumptions differ from
    any ShapeEnv symbol's, so it is never the same sympy object as one of the same name."""
    while len(_SIZE_SYMBOLS) <= i:
        s = sympy.Symbol(f"s{len(_SIZE_SYMBOLS)}", integer=True, finite=True)
        _SIZE_SYMBOLS.append(s)
        _SIZE_SET.add(s)
    return _SIZE_SYMBOLS[i]


def is_size_symbol(s) -> bool:
    return s in _SIZE_SET


def size_symbols_of(expr) -> set:
    return {s for s in getattr(expr, "free_symbols", ()) if s in _SIZE_SET}


def is_static(x) -> bool:
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer)


def as_int_or_expr(x):
    """Normalize a sympy result: Integer -> int, anything else unchanged."""
    if isinstance(x, sympy.Basic) and x.is_Integer:
        return int(x)
    return x


def eq(a, b) -> bool:
    """a == b for every value of the symbols (exact, after expansion)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


# --------------------------------------------------------------------------------------------------
# proofs


def known_nonneg(expr, lower: dict | None = None) -> bool:
    """Is ``expr >= 0`` for all sizes? ``lower``: size symbol -> lower bound (0 when absent, None
    when unbounded: a symbolic int argument).
    Sound, not complete; two tries. (1) Each size symbol s becomes ``lower[s] + t`` with ``t >= 0``
    and the expanded polynomial must have no negative coefficient (FloorDiv terms replaced by a
    bound on the side that helps). (2) Every non-constant term is non-decreasing in every size
    (positive coefficient, products of sizes and of ``m // c``): the minimum is at the lower bounds.
    Loop variables and indirect symbols make it False (their value is not a size)."""
    if isinstance(expr, int):
        return expr >= 0
    e = sympy.expand(sympy.sympify(expr))
    if e.is_Number:
        return bool(e >= 0)
    if not e.free_symbols <= _SIZE_SET:
        return False
    lower = lower or {}
    if any(lower.get(s, 0) is None for s in e.free_symbols):
        return False
    return _shifted_nonneg(e, lower) or _monotone_nonneg(e, lower)


def _shifted_nonneg(e, lower) -> bool:
    atoms = {}
    for f in e.atoms(FloorDiv, IMod):
        # a // c (c a positive int) lies in [(a - c + 1)/c, a/c]: where it only adds, its lower bound
        # proves more; where it only subtracts, its upper bound; otherwise it is just >= 0
        terms = [t for t in sympy.Add.make_args(e) if t.has(f)]
        coeffs = {t.as_coeff_Mul()[0] for t in terms}
        linear = all(t.as_coeff_Mul()[1] == f for t in terms)
        if isinstance(f, FloorDiv) and f.args[1].is_Integer and linear and not f.args[0].has(FloorDiv, IMod):
            a, c = f.args
            if all(k < 0 for k in coeffs):
                atoms[f] = a / c
                continue
            if all(k > 0 for k in coeffs):
                atoms[f] = (a - c + 1) / c
                continue
        atoms[f] = sympy.Dummy(nonnegative=True, integer=True)
    if atoms:
        e = sympy.expand(e.xreplace(atoms))
    shift = {s: lower.get(s, 0) + sympy.Dummy(nonnegative=True, integer=True)
             for s in e.free_symbols if s in _SIZE_SET}
    if shift:
        e = sympy.expand(e.xreplace(shift))
    return all(t.as_coeff_Mul()[0].is_Number and t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(e))


def _monotone(e) -> bool:
    """Non-decreasing in every size symbol (sizes are >= 0)?"""
    if e.is_Number or e in _SIZE_SET:
        return True
    if e.is_Add:
        return all(t.is_Number or (t.as_coeff_Mul()[0] > 0 and _monotone(t.as_coeff_Mul()[1]))
                   for t in e.args)
    if e.is_Mul:
        return all((f.is_Number and f > 0) or (not f.is_Number and _monotone(f)) for f in e.args)
    if e.is_Pow:
        return e.exp.is_Integer and e.exp > 0 and _monotone(e.base)
    if isinstance(e, FloorDiv):
        return e.args[1].is_Integer and e.args[1] > 0 and _monotone(e.args[0])
    return False


def _monotone_nonneg(e, lower) -> bool:
    if not _monotone(e - e.as_coeff_Add()[0]):
        return False
    at = e.xreplace({s: sympy.Integer(lower.get(s, 0)) for s in e.free_symbols})
    return at.is_Number and at >= 0


def known_lt(a, b, lower: dict | None = None) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return known_nonneg(sympy.sympify(b) - sympy.sympify(a) - 1, lower)


# --------------------------------------------------------------------------------------------------
# bounds and simplification of index expressions


def bounds(expr, ranges: dict, lower: dict | None = None):
    """Inclusive (lo, hi) of an index expression given ``{loop variable: size}``; None if unknown.
    Ints when everything is static; sympy expressions over size symbols otherwise."""
    if isinstance(expr, int):
        return expr, expr
    if expr.is_Integer:
        return int(expr), int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr in ranges:
            r = ranges[expr]
            return 0, (r - 1 if isinstance(r, int) else as_int_or_expr(r - 1))
        if expr in _SIZE_SET:
            return expr, expr
        return None
    if expr.is_Add:
        lo = hi = 0
        for t in expr.args:
            b = bounds(t, ranges, lower)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if expr.is_Mul:
        lo, hi = 1, 1
        for t in expr.args:
            b = bounds(t, ranges, lower)
            if b is None:
                return None
            res = _mul_bounds((lo, hi), b, lower)
            if res is None:
                return None
            lo, hi = res
        return lo, hi
    if isinstance(expr, FloorDiv):
        b = bounds(expr.args[0], ranges, lower)
        d = expr.args[1]
        if b is None:
            return None
        if d.is_Integer:
            if isinstance(b[0], int) and isinstance(b[1], int):
                return b[0] // int(d), b[1] // int(d)
            if known_nonneg(b[0], lower):
                return FloorDiv(b[0], d), FloorDiv(b[1], d)
            return None
        if known_nonneg(b[0], lower) and size_symbols_of(d) == d.free_symbols:
            return FloorDiv(b[0], d), FloorDiv(b[1], d)
        return None
    if isinstance(expr, IMod):
        b = bounds(expr.args[0], ranges, lower)
        m = expr.args[1]
        if m.is_Integer:
            m = int(m)
            if b is not None and isinstance(b[0], int) and isinstance(b[1], int):
                return b if b[0] >= 0 and b[1] < m else (0, m - 1)
        if b is not None and known_nonneg(b[0], lower) and known_lt(b[1], m, lower):
            return b
        return 0, as_int_or_expr(m - 1)
    return None


def _mul_bounds(a, b, lower):
    if all(isinstance(x, int) for x in (*a, *b)):
        cands = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
        return min(cands), max(cands)
    for p, q in ((a, b), (b, a)):
        if p[0] is p[1] or eq(p[0], p[1]):  # a point: a constant or a size
            c = p[0]
            if known_nonneg(c, lower):
                return c * q[0], c * q[1]
            if known_nonneg(-c, lower):
                return c * q[1], c * q[0]
    if known_nonneg(a[0], lower) and known_nonneg(b[0], lower):
        return a[0] * b[0], a[1] * b[1]
    return None


def _quotient(term, d):
    """term / d if it is a monomial with an integer coefficient and no negative power, else None."""
    if isinstance(d, int) or d.is_Integer:
        coeff, rest = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % int(d) == 0:
            return sympy.Integer(int(coeff) // int(d)) * rest
        return None
    q = term / d
    coeff, rest = q.as_coeff_Mul()
    if not coeff.is_Integer:
        return None
    for f in sympy.Mul.make_args(rest):
        if f.is_Pow and (not f.exp.is_Integer or f.exp < 0):
            return None
        if f.is_Rational and not f.is_Integer:
            return None
    return q


def _split_terms(expr, d):
    """Split a sum into (terms divisible by d, divided by d) and the remaining terms."""
    q, rem = [], []
    for t in sympy.Add.make_args(expr):
        r = _quotient(t, d)
        if r is None:
            rem.append(t)
        else:
            q.append(r)
    return sympy.Add(*q), sympy.Add(*rem)


def _factors(d):
    """Ways to write d = c * rest with c a proper factor (for FloorDiv(a, c*rest) = FloorDiv(a // c, rest))."""
    if isinstance(d, int) or d.is_Integer or not d.is_Mul:
        return []
    args = sympy.Mul.make_args(d)
    return [(f, d / f) for f in args] + [(d / f, f) for f in args if len(args) > 2]


# simplify_index's results: (expr, ranges, lower) -> simplified. The answer depends on nothing else
# (a symbol is a size symbol or not for good), and the same index expressions come back in every
# layer of a deep model (a 24-layer Llama's kernels are 24 copies of a few): memoized, lowering and
# scheduling simplify each once. Bounded: cleared when it holds _SIMPLIFIED_MAX entries.
_SIMPLIFIED: dict = {}
_SIMPLIFIED_MAX = 200_000


def simplify_index(expr, ranges: dict, lower: dict | None = None):
    """Remove FloorDiv/IMod that the variable ranges make redundant (flatten-then-unflatten from
    reshapes is the common case: ``(8*v0 + v1) // 8 -> v0`` when ``v1 < 8``), and join digits of one
    number back into it (``d*(x // d) + x % d -> x``, ``_join_divmod``)."""
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    context = (tuple(ranges.items()), tuple(lower.items()) if lower else None)
    return _simplify_index(expr, ranges, lower, context)


def _simplify_index(expr, ranges, lower, context):
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    key = (expr, context)
    hit = _SIMPLIFIED.get(key)
    if hit is not None:
        return hit
    if expr.is_Add and expr.has(IMod):
        joined = _join_divmod(expr)
        if joined is not None:  # before the terms are simplified apart (see _join_divmod)
            out = _simplify_index(joined, ranges, lower, context)
            return _remember(key, out)
    args = [_simplify_index(a, ranges, lower, context) for a in expr.args]
    if isinstance(expr, (FloorDiv, IMod)):
        return _remember(key, _simplify_divmod(type(expr), args[0], args[1], ranges, lower))
    out = expr.func(*args)
    if out.is_Add and out.has(IMod):
        out = _join_divmod(out) or out
    return _remember(key, out)


def _remember(key, out):
    if len(_SIMPLIFIED) >= _SIMPLIFIED_MAX:
        _SIMPLIFIED.clear()
    _SIMPLIFIED[key] = out
    return out


def _simplify_divmod(kind, a, d, ranges, lower):
    static = d.is_Integer
    a = sympy.expand(a)
    q, rem = _split_terms(a, d)
    b = bounds(rem, ranges, lower)
    fits = b is not None and known_nonneg(b[0], lower) and known_lt(b[1], d, lower)
    nonneg = b is not None and known_nonneg(b[0], lower)
    if kind is FloorDiv:
        if fits:
            return q
        if nonneg and q != 0:
            return q + FloorDiv(rem, d)
        if not static:  # d = c * rest and a = c*q' + r with 0 <= r < c: a // d = q' // rest
            for c, rest in _factors(d):
                q2, rem2 = _split_terms(a, c)
                b2 = bounds(rem2, ranges, lower)
                if q2 != 0 and b2 is not None and known_nonneg(b2[0], lower) and known_lt(b2[1], c, lower):
                    return FloorDiv(q2, rest)
    elif fits:
        return rem
    elif nonneg and q != 0:
        return IMod(rem, d)
    if static:
        out = _divmod_by_common_factor(kind, a, int(d), ranges, lower)
        if out is not None:
            return out
    return kind(a, d)


def _divmod_by_common_factor(kind, a, d: int, ranges, lower):
    """``a = g*x + r`` with ``g`` a proper factor of ``d`` and ``0 <= r < g``: then ``a // d = x // (d/g)``
    and ``a % d = g*(x % (d/g)) + r``. Reshapes of reshapes give these: GPT-2's ``[B*T, C] -> [B, T, C]
    -> [B*T, C]`` reads ``(C*v0 + v1) // (T*C)``, which is ``v0 // T``; without this the two views of
    one buffer index differently and the scheduler cannot see that a layer norm's two passes read
    the same element."""
    factors = set()
    for t in sympy.Add.make_args(a):
        c = t.as_coeff_Mul()[0]
        if c.is_Integer:
            g = math.gcd(int(c), d)
            if 1 < g < d:
                factors.add(g)
    for g in sorted(factors, reverse=True):
        x, r = _split_terms(a, g)
        if x == 0:
            continue
        bx, br = bounds(x, ranges, lower), bounds(r, ranges, lower)
        if bx is None or br is None or not (known_nonneg(bx[0], lower) and known_nonneg(br[0], lower)
                                            and known_lt(br[1], g, lower)):
            continue
        inner = _simplify_divmod(kind, x, sympy.Integer(d // g), ranges, lower)
        return inner if kind is FloorDiv else g * inner + r
    return None


def _divmod_term(t):
    """t as (c, x, p, m) with t = c * ((x // p) % m), m None for ``c * (x // p)``; None if t is not a
    multiple of one FloorDiv or IMod (c, p, m may be sizes)."""
    atoms = [f for f in sympy.Mul.make_args(t) if isinstance(f, (FloorDiv, IMod))]
    if len(atoms) != 1:
        return None
    atom = atoms[0]
    c = t / atom
    if isinstance(atom, FloorDiv):
        return c, atom.args[0], atom.args[1], None
    inner, m = atom.args
    if isinstance(inner, FloorDiv):
        return c, inner.args[0], inner.args[1], m
    return c, inner, sympy.Integer(1), m


def _same(a, b) -> bool:
    return a == b or sympy.expand(a - b) == 0


def _join_divmod(e):
    """Join the digits of one number: ``c*((x//p) % m) + c*m*((x//(p*m)) % m2)`` is
    ``c*((x//p) % (m*m2))`` (``m2`` absent: ``c*(x//p)``; ``p = 1``: ``c*d*(x//d) + c*(x % d)`` is
    ``c*x``), repeatedly, so that ``802816*(x//802816) + 14336*((x//14336) % 56) + 256*((x//256) % 56)
    + x % 256`` is ``x``. A node fused through ``reshape_map`` into a kernel of another shape indexes
    its buffer this way (the position of each of its dims, recomputed from the kernel's flat
    position). Simplified term by term instead, the digits lose their common ``x`` and the address
    stays a chain of divisions: ResNet-50's batch-norm backward loaded every element twice, through
    two address forms. None if nothing joins."""
    terms = {i: (t, _divmod_term(t)) for i, t in enumerate(sympy.Add.make_args(e))}

    def join_one() -> bool:
        for i, (_, a) in terms.items():
            if a is None or a[3] is None:
                continue
            c, x, p, m = a
            for j, (_, b) in terms.items():
                if j != i and b is not None and b[1] == x and _same(b[2], p * m) and _same(b[0], c * m):
                    mm = None if b[3] is None else m * b[3]
                    q = FloorDiv(x, p)
                    joined = c * (q if mm is None else IMod(q, mm))
                    terms[i] = (joined, (c, x, p, mm))
                    del terms[j]
                    return True
        return False

    if not join_one():
        return None
    while join_one():
        pass
    return sympy.expand(sympy.Add(*[t for t, _ in terms.values()]))


# --------------------------------------------------------------------------------------------------
# printing (Triton kernels and the Python wrapper share it: integer arithmetic on non-negative values)


def print_expr(expr, name_of) -> str:
    """Python/Triton source of an integer expression; ``name_of(symbol) -> str``."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return name_of(expr)
    if expr.is_Add:
        terms = sorted(expr.args, key=sympy.default_sort_key)
        out = print_expr(terms[0], name_of)
        for t in terms[1:]:
            s = print_expr(t, name_of)
            out += f" - {s[1:]}" if s.startswith("-") else f" + {s}"
        return out
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            raise NotImplementedError(f"index expression with a fractional coefficient: {expr}")
        body = "*".join(_paren(print_expr(a, name_of)) for a in sympy.Mul.make_args(rest))
        if coeff == 1:
            return body
        if coeff == -1:
            return f"-{body}"
        return f"{int(coeff)}*{body}"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "*".join([_paren(print_expr(expr.base, name_of))] * int(expr.exp))
    if isinstance(expr, FloorDiv):
        return f"({print_expr(expr.args[0], name_of)}) // {_paren(print_expr(expr.args[1], name_of))}"
    if isinstance(expr, IMod):
        return f"({print_expr(expr.args[0], name_of)}) % {_paren(print_expr(expr.args[1], name_of))}"
    raise NotImplementedError(f"index expression {expr}")


def _paren(s):
    return s if s.replace("_", "").isalnum() else f"({s})"


# --------------------------------------------------------------------------------------------------
# size symbols of a graph

# ShapeEnv's integer functions, by class name (their module is internal to torch): ours -> ours
_TORCH_FUNCS = {"FloorDiv": FloorDiv, "CleanDiv": FloorDiv, "IntTrueDiv": None, "Mod": IMod, "PythonMod": IMod}


class SymbolicUnsupported(Exception):
    """A size expression the backend cannot make symbolic (the graph is compiled per size instead)."""


class SizeVars:
    """The size symbols of one graph: ShapeEnv symbol -> ``s{i}``, each one's hint, range and the
    wrapper expression that reads it from the call's arguments (``arg0.size(1)``, ``arg2``)."""

    def __init__(self):
        self.canon: dict = {}        # ShapeEnv symbol -> size symbol
        self.hints: dict = {}        # size symbol -> int
        self.lower: dict = {}        # size symbol -> int, or None when unbounded below
        self.upper: dict = {}        # size symbol -> int | None (unbounded)
        self.sources: dict = {}      # size symbol -> wrapper expression reading it

    @property
    def symbolic(self) -> bool:
        return bool(self.canon)

    def expr(self, x):
        """An int, SymInt or ShapeEnv sympy expression as an int or a sympy expression over s{i}."""
        if isinstance(x, bool):
            return int(x)
        if isinstance(x, int):
            return x
        if isinstance(x, torch.SymInt):
            node = x.node
            e = node.expr
            if not e.free_symbols:
                return int(e)
            return self._convert(e, node.shape_env)
        if isinstance(x, sympy.Basic):
            if x.is_Integer:
                return int(x)
            if size_symbols_of(x) == x.free_symbols:  # already ours
                return x
        raise SymbolicUnsupported(f"size {x!r} of type {type(x).__name__}")

    def _convert(self, e, env):
        if e.is_Integer:
            return sympy.Integer(int(e))
        if isinstance(e, sympy.Symbol):
            s = self.canon.get(e)
            if s is None:
                s = self._new(e, env)
            return s
        args = [self._convert(a, env) for a in e.args]
        if e.is_Add:
            return sympy.Add(*args)
        if e.is_Mul:
            return sympy.Mul(*args)
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return sympy.Pow(args[0], e.exp)
        fn = _TORCH_FUNCS.get(type(e).__name__)
        if fn is not None and len(args) == 2:
            return fn(*args)
        kind = type(e).__name__
        if kind in ("Max", "Min"):  # sympy's or torch's: resolved when the ranges decide it
            for a in args:
                if all(self.nonneg(a - b if kind == "Max" else b - a) for b in args):
                    return a
        raise SymbolicUnsupported(f"size expression {e} ({type(e).__name__})")

    def _new(self, e, env):
        vals = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
        if e not in vals:
            raise SymbolicUnsupported(f"size symbol {e} has no hint (a data-dependent size)")
        s = size_symbol(len(self.canon))
        self.canon[e] = s
        self.hints[s] = int(vals[e])
        vr = getattr(env, "var_to_range", {}).get(e)
        lo = getattr(vr, "lower", 0) if vr is not None else 0
        hi = getattr(vr, "upper", None) if vr is not None else None
        self.lower[s] = int(lo) if lo is not None and sympy.sympify(lo).is_Integer else None
        self.upper[s] = int(hi) if hi is not None and sympy.sympify(hi).is_Integer else None
        return s

    def bind(self, s, source: str) -> None:
        """The wrapper reads size symbol s with ``source`` (the first source found wins)."""
        self.sources.setdefault(s, source)

    # -- questions --------------------------------------------------------------------------------
    def hint(self, x) -> int:
        if isinstance(x, int):
            return x
        return int(sympy.sympify(x).xreplace(self.hints))

    def upper_bound(self, x) -> int | None:
        """A proven upper bound of x (from bounds given to mark_dynamic), or None."""
        if isinstance(x, int):
            return x
        e = sympy.expand(sympy.sympify(x))
        if e.has(FloorDiv, IMod):
            return None
        subs = {}
        for s in e.free_symbols:
            lo = self.lower.get(s)
            if self.upper.get(s) is None or lo is None or lo < 0:
                return None
            subs[s] = self.upper[s]
        # a polynomial of non-negative values with no negative coefficient grows with each of them
        if any(t.as_coeff_Mul()[0] < 0 for t in sympy.Add.make_args(e)):
            return None
        return int(e.xreplace(subs))

    def nonneg(self, x) -> bool:
        return known_nonneg(x, self.lower)

    def lt(self, a, b) -> bool:
        return known_lt(a, b, self.lower)

    def describe(self) -> str:
        """One line per size symbol: where it is read, its hint and range."""
        out = []
        for s in sorted(self.hints, key=lambda s: int(s.name[1:])):
            hi = self.upper.get(s)
            lo = self.lower.get(s, 0)
            rng = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            out.append(f"{s} = {self.sources.get(s, '?')}  # hint {self.hints[s]}, range {rng}")
        return "\n".join(out)


_ACTIVE: list = []  # the SizeVars of the lowering in progress (a stack: lowerings do not nest, tests may)


class active:
    """``with active(sv):`` makes ``norm`` translate SymInts with ``sv`` (set by the lowering)."""

    def __init__(self, sv: SizeVars):
        self.sv = sv

    def __enter__(self):
        _ACTIVE.append(self.sv)
        return self.sv

    def __exit__(self, *exc):
        _ACTIVE.pop()


def norm(x):
    """A size as the IR holds it: an int, or a sympy expression over size symbols. SymInts (from
    FakeTensor metadata) are translated by the active ``SizeVars``."""
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, sympy.Basic):
        if x.is_Integer:
            return int(x)
        if x.free_symbols <= _SIZE_SET:
            return x
    if isinstance(x, (torch.SymInt, sympy.Basic)):
        if not _ACTIVE:
            raise SymbolicUnsupported(f"symbolic size {x} outside a lowering")
        return _ACTIVE[-1].expr(x)
    return int(x)


def norm_sizes(xs) -> tuple:
    xs = tuple(xs)
    for x in xs:  # (plain ints, the common case, stay as they are)
        if type(x) is not int:
            return tuple(norm(x) for x in xs)
    return xs


def has_symbolic_inputs(gm) -> bool:
    """Does a placeholder of gm carry a SymInt with free symbols (in its value or sizes/strides)?"""
    from ember.aot.deferred import placeholder_vals  # (a graph from the aot cache answers without its nodes)
    for v in placeholder_vals(gm):
        vals = [v] if isinstance(v, torch.SymInt) else \
            [*v.shape, *v.stride(), v.storage_offset()] if isinstance(v, torch.Tensor) else []
        if any(isinstance(s, torch.SymInt) and s.node.expr.free_symbols for s in vals):
            return True
    return False


def prod(xs):
    out = 1
    for x in xs:
        out = out * x
    return as_int_or_expr(out) if not isinstance(out, int) else out


def hint_numel(sizes, sv: SizeVars | None) -> int:
    n = prod(sizes)
    return n if isinstance(n, int) or sv is None else sv.hint(n)


__all__ = ["FloorDiv", "IMod", "sym", "node_vars", "is_indirect", "size_symbol", "is_size_symbol",
           "size_symbols_of", "is_static", "as_int_or_expr", "eq", "known_nonneg", "known_lt", "bounds",
           "simplify_index", "print_expr", "SizeVars", "SymbolicUnsupported", "prod", "hint_numel", "active",
           "norm", "norm_sizes", "has_symbolic_inputs"]
