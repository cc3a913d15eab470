"""How the C++ renderer spells things (``cpp_emit``, ``cpp_reduce``): C types of dtypes, literals,
integer index expressions, reduction identities and combines, and the OpenMP pragma of a parallel
loop. No kernel structure here: that is cpp_emit (loops, loads, stores) and cpp_reduce (reductions)."""
from __future__ import annotations

import math

import sympy
import torch

from ember.native.scope import Scope
from ember.native.symbolic import FloorDiv, IMod

# the C type of a buffer's elements, and the type values of that dtype are computed in
STORAGE = {torch.float32: "float", torch.float64: "double", torch.float16: "_Float16", torch.bfloat16: "uint16_t",
           torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
           torch.uint8: "uint8_t", torch.bool: "bool"}
LOW_PRECISION = (torch.float16, torch.bfloat16)

# points per thread of a kernel's parallel region (kernels under two of these run on one thread: a
# parallel region costs a few microseconds, and far more when the machine is oversubscribed)
PARALLEL_NUMEL = 1 << 15


class CppUnsupported(Exception):
    """Something the C++ renderer cannot spell: the graph runs its ATen code instead."""


def compute_dtype(dt):
    return torch.float32 if dt in LOW_PRECISION else dt


def ctype(dt) -> str:
    if dt not in STORAGE:
        raise CppUnsupported(f"dtype {dt} has no C++ spelling")
    return "float" if dt in LOW_PRECISION else STORAGE[dt]


class CScope(Scope):
    """A block of C++ code; a loop body or an ``if`` gets a child scope (``scope.Scope``)."""


def indent(lines, n=1):
    return ["  " * n + l for l in lines]


def parallel_for(clause, numel) -> str:
    """OpenMP over the outer loops with at most one thread per PARALLEL_NUMEL points (ATen's grain:
    eager runs an op of 32K elements on one thread, and so do we), none below two grains."""
    return (f"#pragma omp parallel for{clause} num_threads(e_threads({numel}, {PARALLEL_NUMEL})) "
            f"if(({numel}) >= {2 * PARALLEL_NUMEL})")


SIMD_REDUCTION = {"sum": "+", "prod": "*", "max": "e_max", "min": "e_min"}


def combine(rt, a, v) -> str:
    return {"sum": f"{a} + {v}", "prod": f"{a} * {v}", "max": f"e_maximum({a}, {v})",
            "min": f"e_minimum({a}, {v})", "any": f"{a} || ({v} != 0)", "all": f"{a} && ({v} != 0)"}[rt]


def linear(vars_, ranges, positions):
    """The row-major position of the point among the ranges at ``positions`` (an argmax's index)."""
    out, stride = sympy.Integer(0), sympy.Integer(1)
    for i in reversed(positions):
        out, stride = out + vars_[i] * stride, stride * ranges[i]
    return out


def identity(rt, dt) -> str:
    if rt in ("sum", "any"):
        return "0"
    if rt in ("prod", "all"):
        return "1"
    if dt.is_floating_point:
        inf = f"em::numeric_limits<{ctype(dt)}>::infinity()"
        return f"-{inf}" if rt == "max" else inf
    if dt == torch.bool:
        return "false" if rt == "max" else "true"
    return f"em::numeric_limits<{ctype(dt)}>::{'lowest' if rt == 'max' else 'max'}()"


def literal(value, dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        t = ctype(dtype)
        if math.isnan(value):
            return f"em::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}em::numeric_limits<{t}>::infinity()"
        return repr(value) + ("f" if t == "float" else "")
    value = int(value)
    if value == -(2 ** 63):
        return "(-9223372036854775807LL - 1)"
    return f"{value}LL" if ctype(dtype) == "int64_t" else str(value)


def print_c(expr, name_of) -> str:
    """C source of an integer index expression (int64 math, Python's floor division and modulo)."""
    if expr.is_Integer:
        return f"{int(expr)}LL" if abs(int(expr)) >= 2 ** 31 else str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return name_of(expr)
    if expr.is_Add:
        terms = sorted(expr.args, key=sympy.default_sort_key)
        return "(" + " + ".join(print_c(t, name_of) for t in terms) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(print_c(a, name_of) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return "(" + " * ".join([print_c(expr.base, name_of)] * int(expr.exp)) + ")"
    if isinstance(expr, FloorDiv):
        return f"e_idiv({print_c(expr.args[0], name_of)}, {print_c(expr.args[1], name_of)})"
    if isinstance(expr, IMod):
        return f"e_imod({print_c(expr.args[0], name_of)}, {print_c(expr.args[1], name_of)})"
    if isinstance(expr, (sympy.Max, sympy.Min)):
        fn = "em::max" if isinstance(expr, sympy.Max) else "em::min"
        out = print_c(expr.args[0], name_of)
        for a in expr.args[1:]:
            out = f"{fn}<int64_t>({out}, {print_c(a, name_of)})"
        return out
    raise CppUnsupported(f"index expression {expr}")
