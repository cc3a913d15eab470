"""The native backend's op registry: every pointwise op declared once.

An ``Op`` with an ``arity`` is an op of the IR (``ir.op(name, ...)``): its result-dtype rule
(``kind``), its cost class (``heavy``), how each renderer spells it (``render``, keyed by renderer:
"triton" and "cpp"), and which ATen overloads lower to
it (``aten``). An ``Op`` without an arity is an ATen op lowered to a composition of IR ops (relu,
clamp, elu...): it only declares ``aten``. Everything else reads this table: ``ir.op`` and the
verifier (arity, kind), ``lower_ops`` (registers the ATen lowerings), ``triton_emit`` (templates,
heavy ops), ``decomp`` (ops lowered whole instead of decomposed), and tests/native/test_registry.py,
which runs every op on every renderer against eager.

``aten`` maps ATen packets/overloads to how they lower. A bare packet (``(aten.exp,)``) lowers each
of its tensor/scalar overloads to ``ir.op(name, *operands)`` with eager's type promotion (``kind``
"float": integer inputs compute in the default float dtype). A dict maps them to a function
``lower(P, *args, **kwargs)`` that gets ATen's arguments (defaults as in the schema) and builds the
value with ``P.pointwise(fn, operands, promotion)``, ``fn`` mapping operand Exprs to the result
Expr (see ``lower_ops.PointwiseLowering``); ``P.decline()`` leaves the call to ATen.

Templates are ``str.format`` patterns over the argument variables (``{0}``, ``{1}``...), or a
function ``(args, expr) -> str`` where the spelling depends on the dtype.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND

from ember.native import ir

aten = torch.ops.aten
prims = torch.ops.prims

RENDERERS = ("triton", "cpp")  # cpp: C++ helpers e_* live in cpp_emit.PRELUDE
KINDS = ("float", "any", "cmp")  # result dtype: computed in floating point / the operands' / bool


@dataclasses.dataclass(frozen=True)
class Sample:
    """A call exercising an op that no case of tests/native/optable.py covers. ``inputs`` per
    argument: "randn", "prob" (in (0, 1)), "prob_nan" (every 5th a NaN), "pos" (> 0), "int" (int64
    in [-9, 9)), "bool", or a Python value passed as is. ``grad``: also compare gradients through ``ember.compile``."""
    fn: Callable
    inputs: tuple = ("randn",)
    dtypes: tuple = (torch.float32,)
    grad: bool = False
    atol: float | None = None
    rtol: float | None = None


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    arity: int | None = None             # None: an ATen composite, no IR op of its own
    kind: str = "any"
    render: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # a cheaper spelling for kernels whose every node computing the op rounds its result to
    # fp16/bf16, where a few fp32 ulps are far below one rounding step (erf; see
    # TritonKernelEmitter.lowp_ops)
    render_lowp: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    heavy: bool = False                  # tens of instructions per element: fewer warps (choose_config)
    aten: Any = ()                       # packets lowered to ir.op(name, ...), or {packets: lower}
    whole: bool = False                  # lower the ATen op itself: drop it from DECOMPOSITIONS
    samples: tuple = ()
    # on the C++ path (CPU tensors), a graph computing this op runs its ATen code instead, for this
    # reason (a spelling known to differ from eager); None: rendered in C++ (``render["cpp"]``)
    cpp_aten: str | None = None

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        assert self.arity is None or set(self.render) == set(RENDERERS), \
            f"op {self.name}: give a spelling for every renderer {RENDERERS}"

    @property
    def promotion(self):
        return KIND.INT_TO_FLOAT if self.kind == "float" else KIND.DEFAULT


def overloads(packet, names=("default", "Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor", "self")):
    """The tensor/scalar overloads of a packet a graph can call (not ``out``, not the int/float ones
    of Python arithmetic); an OpOverload stands for itself."""
    if isinstance(packet, torch._ops.OpOverload):
        return [packet]
    return [getattr(packet, n) for n in names if n in packet.overloads()]


def c(value, like: ir.Expr) -> ir.Expr:
    return ir.const(value, like.dtype)


# --------------------------------------------------------------------------------------------------
# lowerings of more than one IR op call, or with arguments


def _direct(name, promotion):
    def lower(P, *operands):
        return P.pointwise(lambda *es: ir.op(name, *es), list(operands), promotion)
    return lower


def _not(P, x):
    return P.pointwise(lambda a: ir.op("logical_not", ir.op("ne", a, c(0, a))), [x])


def _bitwise_not(P, x):
    return _not(P, x) if x.dtype == torch.bool else P.pointwise(lambda a: ir.op("bitwise_not", a), [x])


def _rounding(name):
    def lower(P, x, decimals=0):
        if not x.dtype.is_floating_point:
            return P.pointwise(lambda a: a, [x])
        if decimals:
            s = 10.0 ** decimals
            return P.pointwise(lambda a: ir.op("truediv", ir.op(name, ir.op("mul", a, c(s, a))), c(s, a)), [x])
        return P.pointwise(lambda a: ir.op(name, a), [x])
    return {tuple(overloads(getattr(aten, name), ("default", "decimals"))): lower}


def _arith(name):
    def lower(P, a, b, alpha=None):
        def fn(x, y):
            if alpha is not None and alpha != 1:
                y = ir.op("mul", y, c(alpha, y))
            return ir.op(name, x, y)
        return P.pointwise(fn, [a, b])
    return lower


def _rsub(P, a, b, alpha=1):
    return _arith("sub")(P, b, a, alpha)


def _logical(name):
    def lower(P, a, b):
        return P.pointwise(lambda x, y: ir.op(name, ir.op("ne", x, c(0, x)), ir.op("ne", y, c(0, y))), [a, b])
    return lower


def _div(P, a, b):
    if P.target is prims.div.default and not P.out.dtype.is_floating_point:
        return P.pointwise(lambda x, y: ir.op("truncdiv", x, y), [a, b])
    return P.pointwise(lambda x, y: ir.op("truediv", x, y), [a, b], KIND.INT_TO_FLOAT)


def _div_mode(P, a, b, rounding_mode=None):
    if rounding_mode is None:
        return _div(P, a, b)
    if P.out.dtype.is_floating_point:
        rnd = "trunc" if rounding_mode == "trunc" else "floor"
        return P.pointwise(lambda x, y: ir.op(rnd, ir.op("truediv", x, y)), [a, b])
    return P.pointwise(lambda x, y: ir.op("truncdiv" if rounding_mode == "trunc" else "floordiv", x, y), [a, b])


def _floor_divide(P, a, b):
    return _div_mode(P, a, b, "floor")


_POW_SMALL = {2: lambda x: ir.op("mul", x, x), 1: lambda x: x, 3: lambda x: ir.op("mul", ir.op("mul", x, x), x),
              0: lambda x: c(1, x)}
_POW_FLOAT = {0.5: lambda x: ir.op("sqrt", x), -0.5: lambda x: ir.op("rsqrt", x),
              -1: lambda x: ir.op("reciprocal", x), -2: lambda x: ir.op("reciprocal", ir.op("mul", x, x))}


def _pow(P, a, b):
    """Small constant exponents as multiplications/roots; integer powers are left to ATen."""
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b in _POW_SMALL:
            return P.pointwise(_POW_SMALL[b], [a])
        if P.out.dtype.is_floating_point and b in _POW_FLOAT:
            return P.pointwise(_POW_FLOAT[b], [a])
    if not P.out.dtype.is_floating_point:
        P.decline()
    return P.pointwise(lambda x, y: ir.op("pow", x, y), [a, b])


def _where(P, cond, a, b):
    compute = P.compute_dtype([a, b])

    def fn(cnd, x, y):
        return ir.op("where", ir.op("ne", cnd, c(0, cnd)) if cnd.dtype != torch.bool else cnd,
                     ir.cast(x, compute), ir.cast(y, compute))
    return P.pointwise(fn, [cond, a, b], raw=True, const_dtypes=(torch.bool, compute, compute))


def _clamp(P, x, lo=None, hi=None):
    if P.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    if P.target is aten.hardtanh.default:
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi

    def fn(v, *bounds):
        it = iter(bounds)
        if lo is not None:
            v = ir.op("maximum", v, next(it))
        if hi is not None:
            v = ir.op("minimum", v, next(it))
        return v
    return P.pointwise(fn, [x] + [v for v in (lo, hi) if v is not None])


def _nan_test(name):
    def lower(P, x):
        return P.pointwise(lambda a: ir.op(name, a) if a.dtype.is_floating_point else ir.const(False, torch.bool), [x])
    return lower


def _isfinite(P, x):
    def fn(a):
        if not a.dtype.is_floating_point:
            return ir.const(True, torch.bool)
        return ir.op("logical_not", ir.op("logical_or", ir.op("isnan", a), ir.op("isinf", a)))
    return P.pointwise(fn, [x])


def _leaky_relu(P, x, slope=0.01):
    return P.pointwise(lambda a: ir.op("where", ir.op("gt", a, c(0, a)), a, ir.op("mul", a, c(slope, a))), [x])


def _elu(P, x, alpha=1.0, scale=1.0, input_scale=1.0):
    def fn(a):
        neg = ir.op("mul", ir.op("expm1", ir.op("mul", a, c(input_scale, a))), c(alpha * scale, a))
        return ir.op("where", ir.op("gt", a, c(0, a)), ir.op("mul", a, c(scale, a)), neg)
    return P.pointwise(fn, [x])


def _logit(P, x, eps=None):
    """``log(x / (1 - x))``, x first clamped to [eps, 1 - eps] when eps is given, the way eager's
    kernel does it: ``x < lo ? lo : (x > hi ? hi : x)`` (NaN stays NaN; eps > 0.5, where lo > hi,
    gives lo below lo, unlike a max/min clamp; a negative eps clamps nothing that matters)."""
    def fn(a):
        if eps is not None:
            lo, hi = c(eps, a), c(1 - eps, a)
            a = ir.op("where", ir.op("lt", a, lo), lo, ir.op("where", ir.op("gt", a, hi), hi, a))
        return ir.op("logit", a)
    return P.pointwise(fn, [x], KIND.INT_TO_FLOAT)


def _tl_reciprocal(args, e):
    # ``1.0`` is a float32 literal: other dtypes (float64) divide a one of their own dtype
    if e.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return f"1.0 / {args[0]}"
    return f"tl.full([], 1, tl.{str(e.dtype).removeprefix('torch.')}) / {args[0]}"


def _tl(template):
    return {"triton": template}


def _r(triton, cpp):
    """An op's spellings: Triton, and C++ over scalars (``em::`` math: <cmath>'s functions as builtins,
    cpp_prelude.EM_NAMESPACE, whose float/double overloads keep the operand's precision; ``e_*`` helpers
    in cpp_prelude.PRELUDE where eager's semantics differ from C's: NaN-propagating max/min,
    Python-style floor division and remainder)."""
    return {"triton": triton, "cpp": cpp}


# --------------------------------------------------------------------------------------------------
# the table

F, A, B = "float", "any", "cmp"
_U = ("prob",)

REGISTRY: list[Op] = [
    # ---- arithmetic
    Op("add", 2, A, _r("{0} + {1}", "{0} + {1}"), aten={(aten.add, prims.add.default): _arith("add")}),
    Op("sub", 2, A, _r("{0} - {1}", "{0} - {1}"), aten={(aten.sub, prims.sub.default): _arith("sub")}),
    Op("mul", 2, A, _r("{0} * {1}", "{0} * {1}"), aten={(aten.mul, prims.mul.default): _arith("mul")}),
    Op("truediv", 2, F, _r("{0} / {1}", "{0} / {1}"), aten={(aten.div.Tensor, aten.div.Scalar, prims.div.default): _div}),
    Op("floordiv", 2, A, _r("floordiv({0}, {1})", "e_floordiv({0}, {1})")),
    Op("truncdiv", 2, A, _r("{0} // {1}", "e_truncdiv({0}, {1})")),
    Op("remainder", 2, A, _r("remainder({0}, {1})", "e_remainder({0}, {1})"), aten=(aten.remainder,)),
    Op("fmod", 2, A, _r("{0} % {1}", "e_fmod({0}, {1})"), aten=(aten.fmod,)),
    Op("maximum", 2, A, _r("maximum({0}, {1})", "e_maximum({0}, {1})"), aten=(aten.maximum,)),
    Op("minimum", 2, A, _r("minimum({0}, {1})", "e_minimum({0}, {1})"), aten=(aten.minimum,)),
    Op("pow", 2, F, _r("pow({0}, {1})", "em::pow({0}, {1})"), heavy=True,
       aten={(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar): _pow}),
    Op("atan2", 2, F, _r("atan2({0}, {1})", "em::atan2({0}, {1})"), heavy=True, aten=(aten.atan2.default,)),
    Op("neg", 1, A, _r("-{0}", "-{0}"), aten=(aten.neg,)),
    Op("abs", 1, A, _r("tl.abs({0})", "e_abs({0})"), aten=(aten.abs,)),
    Op("sign", 1, A, _r("sign({0})", "e_sign({0})"), aten=(aten.sign,)),
    Op("reciprocal", 1, F, {"triton": _tl_reciprocal, "cpp": "e_reciprocal({0})"}, aten=(aten.reciprocal,)),
    # ---- transcendental
    Op("exp", 1, F, _r("tl.exp({0})", "e_exp({0})"), aten=(aten.exp,)),
    Op("exp2", 1, F, _r("tl.exp2({0})", "em::exp2({0})"), aten=(aten.exp2,)),
    Op("expm1", 1, F, _r("expm1({0})", "em::expm1({0})"), heavy=True, aten=(aten.expm1,)),
    Op("log", 1, F, _r("tl.log({0})", "em::log({0})"), aten=(aten.log,)),
    Op("log2", 1, F, _r("tl.log2({0})", "em::log2({0})"), aten=(aten.log2,)),
    Op("log1p", 1, F, _r("log1p({0})", "em::log1p({0})"), heavy=True, aten=(aten.log1p,)),
    Op("sqrt", 1, F, _r("tl.sqrt({0})", "em::sqrt({0})"), aten=(aten.sqrt,)),
    Op("rsqrt", 1, F, _r("tl.rsqrt({0})", "e_rsqrt({0})"), aten=(aten.rsqrt,)),
    Op("sin", 1, F, _r("tl.sin({0})", "em::sin({0})"), aten=(aten.sin,)),
    Op("cos", 1, F, _r("tl.cos({0})", "em::cos({0})"), aten=(aten.cos,)),
    Op("tan", 1, F, _r("tan({0})", "em::tan({0})"), heavy=True, aten=(aten.tan,)),
    Op("tanh", 1, F, _r("tanh({0})", "e_tanh({0})"), heavy=True, aten=(aten.tanh,)),
    Op("sigmoid", 1, F, _r("tl.sigmoid({0})", "e_sigmoid({0})"), aten=(aten.sigmoid,)),
    Op("erf", 1, F, _r("tl.math.erf({0})", "e_erf({0})"), render_lowp=_tl("erf_rational({0})"), heavy=True, aten=(aten.erf,)),
    Op("atan", 1, F, _r("atan({0})", "em::atan({0})"), heavy=True, aten=(aten.atan,)),
    Op("sinh", 1, F, _r("sinh({0})", "em::sinh({0})"), heavy=True, aten=(aten.sinh,)),
    Op("cosh", 1, F, _r("cosh({0})", "em::cosh({0})"), heavy=True, aten=(aten.cosh,)),
    Op("asin", 1, F, _r("asin({0})", "em::asin({0})"), heavy=True, aten=(aten.asin,)),
    Op("acos", 1, F, _r("acos({0})", "em::acos({0})"), heavy=True, aten=(aten.acos,)),
    Op("logit", 1, F, _r("tl.log({0} / (1.0 - {0}))", "e_logit({0})"), aten={(aten.logit,): _logit}, whole=True,
       samples=(Sample(torch.logit, _U, (torch.float32, torch.float16, torch.bfloat16), grad=True),
                Sample(lambda x: torch.logit(x, eps=0.25), _U, grad=True),
                Sample(lambda x: torch.logit(x, 1e-6), ("randn",), rtol=1e-4),
                Sample(lambda x: torch.logit(x, eps=0.7), _U),  # lo > hi: eager's order of tests
                Sample(lambda x: torch.logit(x, eps=0.25), ("prob_nan",)), Sample(lambda x: torch.logit(x, eps=-0.1)),
                Sample(torch.logit, ("int",)))),
    # ---- rounding
    Op("floor", 1, A, _r("tl.floor({0})", "e_floor({0})"), aten=_rounding("floor")),
    Op("ceil", 1, A, _r("tl.ceil({0})", "e_ceil({0})"), aten=_rounding("ceil")),
    Op("trunc", 1, A, _r("trunc({0})", "e_trunc({0})"), aten=_rounding("trunc")),
    Op("round", 1, A, _r("round_half_even({0})", "e_round({0})"), aten=_rounding("round"),
       samples=(Sample(lambda x: torch.round(x * 30, decimals=1)),)),
    # ---- comparisons and logic (bool results)
    Op("eq", 2, B, _r("{0} == {1}", "{0} == {1}"), aten=(aten.eq,)),
    Op("ne", 2, B, _r("{0} != {1}", "{0} != {1}"), aten=(aten.ne,)),
    Op("lt", 2, B, _r("{0} < {1}", "{0} < {1}"), aten=(aten.lt,)),
    Op("le", 2, B, _r("{0} <= {1}", "{0} <= {1}"), aten=(aten.le,)),
    Op("gt", 2, B, _r("{0} > {1}", "{0} > {1}"), aten=(aten.gt,)),
    Op("ge", 2, B, _r("{0} >= {1}", "{0} >= {1}"), aten=(aten.ge,)),
    Op("isnan", 1, B, _r("{0} != {0}", "e_isnan({0})"), aten={(aten.isnan.default,): _nan_test("isnan")}),
    Op("isinf", 1, B, _r("tl.abs({0}) == float('inf')", "e_isinf({0})"), aten={(aten.isinf.default,): _nan_test("isinf")}),
    Op("logical_and", 2, B, _r("{0} & {1}", "{0} && {1}"), aten={(aten.logical_and,): _logical("logical_and")},
       samples=(Sample(torch.logical_and, ("randn", "bool")),)),
    Op("logical_or", 2, B, _r("{0} | {1}", "{0} || {1}"), aten={(aten.logical_or,): _logical("logical_or")},
       samples=(Sample(torch.logical_or, ("randn", "bool")),)),
    Op("logical_xor", 2, B, _r("{0} ^ {1}", "{0} != {1}"), aten={(aten.logical_xor,): _logical("logical_xor")},
       samples=(Sample(torch.logical_xor, ("randn", "bool")),)),
    Op("logical_not", 1, B, _r("{0} == 0", "{0} == 0"), aten={(aten.logical_not,): _not}),
    Op("bitwise_and", 2, A, _r("{0} & {1}", "{0} & {1}"), aten=(aten.bitwise_and,)),
    Op("bitwise_or", 2, A, _r("{0} | {1}", "{0} | {1}"), aten=(aten.bitwise_or,)),
    Op("bitwise_xor", 2, A, _r("{0} ^ {1}", "{0} ^ {1}"), aten=(aten.bitwise_xor,)),
    Op("bitwise_not", 1, A, _r("~{0}", "~{0}"), aten={(aten.bitwise_not,): _bitwise_not}),
    Op("where", 3, A, _r("tl.where({0}, {1}, {2})", "{0} ? {1} : {2}"),
       aten={(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar,
              prims.where.default): _where}),
    # ---- ATen ops lowered to compositions of the ops above
    Op("rsub", aten={(aten.rsub.Tensor, aten.rsub.Scalar): _rsub},
       samples=(Sample(lambda a, b: torch.rsub(a, b, alpha=2), ("randn", "randn")),)),
    Op("div_mode", aten={(aten.div.Tensor_mode, aten.div.Scalar_mode): _div_mode}),
    Op("floor_divide", aten={(aten.floor_divide.default, aten.floor_divide.Scalar): _floor_divide},
       samples=(Sample(torch.floor_divide, ("randn", "pos")),)),
    Op("log10", aten={(aten.log10.default,): lambda P, x: P.pointwise(
        lambda a: ir.op("mul", ir.op("log", a), c(1 / math.log(10), a)), [x], KIND.INT_TO_FLOAT)}),
    Op("relu", aten={(aten.relu.default,): lambda P, x: P.pointwise(lambda a: ir.op("maximum", a, c(0, a)), [x])}),
    Op("isfinite", aten={(aten.isfinite.default,): _isfinite},
       samples=(Sample(torch.isfinite, ("randn",)), Sample(torch.isfinite, ("int",)))),
    Op("clamp", aten={(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor,
                       aten.clamp_max.default, aten.clamp_max.Tensor, aten.hardtanh.default): _clamp},
       samples=(Sample(lambda x: x.clamp_max(0.3)), Sample(lambda x, lo: x.clamp(lo), ("randn", "randn")))),
    Op("leaky_relu", aten={(aten.leaky_relu.default,): _leaky_relu}),
    Op("elu", aten={(aten.elu.default,): _elu}),
]

OPS: dict[str, Op] = {}            # IR op name -> Op
ATEN: dict[Any, Callable] = {}     # OpOverload -> lower(P, *args, **kwargs)
WHOLE: list = []                   # overloads lowered whole (taken out of the decomposition table)


def _build():
    names = [op.name for op in REGISTRY]
    assert len(names) == len(set(names)), f"ops declared twice: {sorted(n for n in names if names.count(n) > 1)}"
    for op in REGISTRY:
        if op.arity is not None:
            OPS[op.name] = op
        rules = op.aten if isinstance(op.aten, Mapping) else {op.aten: _direct(op.name, op.promotion)}
        for packets, lower in rules.items():
            for packet in packets:
                for o in overloads(packet):
                    assert o not in ATEN, f"{o} lowered by two registry entries"
                    ATEN[o] = lower
                    if op.whole:
                        WHOLE.append(o)


_build()
# ops the C++ path leaves to ATen (tests/native/test_cpp_default.py proves every other op in C++)
CPP_ATEN = {name: op.cpp_aten for name, op in OPS.items() if op.cpp_aten}
HEAVY = frozenset(name for name, op in OPS.items() if op.heavy)
# ops whose Triton spelling calls libdevice, whose code is inlined at every element of a block: each
# call costs the kernel's build ~1000 lines of PTX and ~0.1 s on an sm_90 target (tl.sin, built on
# a CPU by benchmarks/probes/cpu_kernel_builds.py's method). Every heavy op, and sin/cos (cheap enough
# at run time not to count as heavy). lowering.should_realize stores a small value computing one
# once, rather than rebuilding it in every kernel that reads it (a Llama's rotary cos/sin table).
LIBDEVICE = HEAVY | {"sin", "cos"}
LOWP_RENDERED = frozenset(name for name, op in OPS.items() if op.render_lowp)
SIGNATURE = {name: (op.arity, op.kind) for name, op in OPS.items()}  # for ir.op, which runs often


def render(renderer: str, e: ir.Expr, args: list, lowp: bool = False) -> str:
    """The code computing e from its argument variables; ``lowp``: the cheaper spelling where the op
    has one (the caller checked every result is rounded to fp16/bf16)."""
    op = OPS[e.op]
    spelling = (op.render_lowp.get(renderer) if lowp else None) or op.render[renderer]
    return spelling(args, e) if callable(spelling) else spelling.format(*args)
