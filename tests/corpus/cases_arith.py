"""Arithmetic, comparison, bitwise, unary and augmented operators on tensors, Python numbers and
mixes of both; the math and operator modules."""
import math
import operator

import torch

from .harness import case


def t34():
    return (torch.randn(3, 4),)


def two34():
    return (torch.randn(3, 4), torch.randn(3, 4))


def ints34():
    return (torch.randint(-8, 8, (3, 4)), torch.randint(1, 5, (3, 4)))


# ---- tensor (op) tensor ------------------------------------------------------------------

@case(two34)
def tt_add(a, b):
    return a + b


@case(two34)
def tt_sub(a, b):
    return a - b


@case(two34)
def tt_mul(a, b):
    return a * b


@case(two34)
def tt_truediv(a, b):
    return a / (b.abs() + 1)


@case(ints34)
def tt_floordiv_int(a, b):
    return a // b


@case(two34)
def tt_floordiv_float(a, b):
    return a // (b.abs() + 0.5)


@case(ints34)
def tt_mod_int(a, b):
    return a % b


@case(two34)
def tt_mod_float(a, b):
    return a % (b.abs() + 0.5)


@case(two34)
def tt_pow(a, b):
    return a.abs() ** b


@case(lambda: (torch.randn(3, 4), torch.randn(4, 5)))
def tt_matmul(a, b):
    return a @ b


@case(two34)
def tt_comparisons(a, b):
    return a < b, a <= b, a > b, a >= b, a == b, a != b


@case(ints34)
def tt_bitwise(a, b):
    return a & b, a | b, a ^ b, ~a


@case(lambda: (torch.randint(0, 64, (5,)), torch.randint(0, 4, (5,))))
def tt_shifts(a, b):
    return a << b, a >> b


@case(lambda: (torch.rand(6) > 0.5, torch.rand(6) > 0.5))
def tt_bool_logic(a, b):
    return a & b, a | b, a ^ b, ~a


@case(lambda: (torch.randn(3, 1), torch.randn(1, 4)))
def tt_broadcast(a, b):
    return a + b, a * b - b / 2


@case(lambda: (torch.randn(4, dtype=torch.float64), torch.randn(4)))
def tt_type_promotion(a, b):
    return a + b, (a * b).dtype


@case(lambda: (torch.randint(0, 10, (4,)), torch.randn(4)))
def tt_int_float_promotion(a, b):
    return a + b, a / 2, a * 1.5, a // 3


# ---- unary ------------------------------------------------------------------------------

@case(t34)
def unary_neg_pos_abs(x):
    return -x, +x, abs(x)


@case(lambda: (torch.randint(-5, 5, (6,)),))
def unary_invert_int(x):
    return ~x, -x


# ---- tensor (op) python number, both orders ------------------------------------------------

@case(t34)
def ts_add_radd(x):
    return x + 2, 2 + x, x + 0.5, 0.5 + x


@case(t34)
def ts_sub_rsub(x):
    return x - 3, 3 - x, x - 1.25, 1.25 - x


@case(t34)
def ts_mul_rmul(x):
    return x * 3, 3 * x, x * -0.5, True * x


@case(t34)
def ts_div_rdiv(x):
    return x / 4, 4 / (x.abs() + 1), x / 0.25


@case(t34)
def ts_floordiv_mod(x):
    return x // 2, x % 2, 7 // (x.abs() + 1), 7 % (x.abs() + 1)


@case(t34)
def ts_pow_rpow(x):
    return x ** 2, 2 ** x, x.abs() ** 0.5, x ** -1


@case(t34)
def ts_compare(x):
    return x > 0, x <= 0.5, 0 < x, x == 1, x != 0


@case(lambda: (torch.randint(0, 16, (5,)),))
def ts_bitwise(x):
    return x & 3, x | 8, x ^ 5, 1 << x.clamp(max=8), x >> 1, 3 & x


@case(lambda: (torch.randn(3, 4), 3))
def ts_int_arg(x, n):
    return x * n + n, x / n, x ** n


@case(lambda: (torch.randn(3, 4), 0.75))
def ts_float_arg(x, s):
    return x * s - s, s / (x.abs() + 1)


@case(lambda: (torch.randn(3, 4), True))
def ts_bool_arg(x, flag):
    return x * flag, x + (not flag)


# ---- python numbers only, feeding tensors --------------------------------------------------

@case(lambda: (torch.randn(3), 7, 2))
def py_int_ops(x, a, b):
    r = (a + b, a - b, a * b, a / b, a // b, a % b, a ** b, -a, +a, abs(-a), a << b, a >> 1,
         a & b, a | b, a ^ b, ~a)
    return x * r[0] + r[3], r


@case(lambda: (torch.randn(3), 7.5, 2.0))
def py_float_ops(x, a, b):
    r = (a + b, a - b, a * b, a / b, a // b, a % b, a ** b, -a, abs(-a))
    return x * r[2], r


@case(lambda: (torch.randn(3), -7, 3))
def py_negative_floordiv_mod(x, a, b):
    return x + a // b, a // b, a % b, -a // b, divmod(a, b)


@case(lambda: (torch.randn(3), 5, 2.5))
def py_int_float_mix(x, a, b):
    c = a * b + a / 2 - b // 1
    return x * c, c, type(c).__name__


@case(lambda: (torch.randn(3), 4, 6))
def py_comparisons(x, a, b):
    r = (a < b, a <= b, a > b, a >= b, a == b, a != b, a < b < 10, a is None, a is not None)
    return (x + 1 if r[0] else x - 1), r


@case(lambda: (torch.randn(3), True, False))
def py_bool_ops(x, p, q):
    r = (p and q, p or q, not p, p & q, p | q, p ^ q, p + p, p * 3)
    return x * r[-1], r


@case(lambda: (torch.randn(3), 3))
def py_augmented(x, n):
    a = n
    a += 2
    a -= 1
    a *= 3
    a //= 2
    a %= 5
    a **= 2
    a <<= 1
    a >>= 1
    a |= 8
    a &= 12
    a ^= 5
    f = 1.5
    f /= 2
    f += a
    return x * f, a, f


@case(lambda: (torch.randn(3), 2 ** 40))
def py_big_int(x, big):
    return x + (big % 1000), big * 3, big // 7


@case(lambda: (torch.randn(2, 3),))
def py_constants(x):
    return x * 1e-3 + 1e3, 0x1F, 0o17, 0b101, 1_000, -0.0, math.inf > 1e308


# ---- augmented assignment on tensors (rebinds a local, or mutates a fresh tensor) ----------

@case(two34)
def aug_tensor_rebind(a, b):
    c = a * 1
    c = c + b
    d = c
    d += 1          # in place on c (fresh tensor), d is c
    d *= b
    d -= 0.5
    d /= 2
    return c, d, c is d


@case(lambda: (torch.randint(1, 9, (4,)),))
def aug_tensor_int_ops(a):
    c = a.clone()
    c //= 2
    c %= 3
    c **= 2
    c |= 1
    c &= 5
    c ^= 2
    c <<= 1
    c >>= 1
    return c


@case(lambda: (torch.randn(2, 2), torch.randn(2, 2)))
def aug_matmul(a, b):
    c = a.clone()
    c @= b
    return c


@case(two34)
def aug_python_on_tensor_local(a, b):
    total = 0
    total += a.sum()
    total = total * 2
    total += b.sum()
    return total, a + total


# ---- math module -----------------------------------------------------------------------

@case(lambda: (torch.randn(3), 2.0))
def math_functions(x, v):
    r = (math.sqrt(v), math.exp(v), math.log(v), math.log2(v), math.log10(v), math.sin(v),
         math.cos(v), math.tan(v), math.atan2(v, 1.0), math.hypot(v, 3.0), math.pow(v, 3))
    return x * r[0] + r[1], r


@case(lambda: (torch.randn(3), 2.7))
def math_rounding(x, v):
    r = (math.floor(v), math.ceil(v), math.trunc(v), math.fabs(-v), math.copysign(v, -1.0))
    return x + r[0], r


@case(lambda: (torch.randn(3), 12, 18))
def math_integer(x, a, b):
    r = (math.gcd(a, b), math.factorial(5), math.comb(5, 2), math.perm(4, 2), math.isqrt(a),
         math.prod([a, b, 2]))
    return x * r[0], r


@case(lambda: (torch.randn(4),))
def math_constants(x):
    return x * math.pi + math.e, math.tau / 2, math.isinf(math.inf), math.isnan(math.nan)


@case(lambda: (torch.randn(4, 8),))
def math_in_tensor_code(x):
    d = x.shape[-1]
    return torch.softmax(x / math.sqrt(d), dim=-1), math.isclose(d / 3, 2.6666666, rel_tol=1e-3)


@case(lambda: (torch.randn(4),))
def math_gelu_formula(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# ---- operator module ----------------------------------------------------------------------

@case(two34)
def operator_binary(a, b):
    return (operator.add(a, b), operator.sub(a, b), operator.mul(a, b), operator.truediv(a, b),
            operator.neg(a), operator.pos(a), operator.abs(a), operator.lt(a, b),
            operator.eq(a, b), operator.pow(a.abs(), 2))


@case(lambda: (torch.randint(0, 8, (4,)), torch.randint(1, 8, (4,))))
def operator_int_tensor(a, b):
    return (operator.floordiv(a, b), operator.mod(a, b), operator.and_(a, b), operator.or_(a, b),
            operator.xor(a, b), operator.invert(a), operator.lshift(a, 1), operator.rshift(a, 1))


@case(lambda: (torch.randn(3, 4), torch.randn(4, 2)))
def operator_matmul_getitem(a, b):
    return operator.matmul(a, b), operator.getitem(a, 1), operator.getitem(a, (slice(None), 0))


@case(lambda: (torch.randn(3), 5, 3))
def operator_python_numbers(x, a, b):
    r = (operator.add(a, b), operator.mul(a, b), operator.floordiv(a, b), operator.mod(a, b),
         operator.truth(a), operator.not_(b), operator.index(a), operator.is_(a, a),
         operator.is_not(a, None), operator.contains([1, 2, 3], b))
    return x * r[0], r


@case(lambda: (torch.randn(3),))
def operator_inplace(x):
    y = x.clone()
    y = operator.iadd(y, 1)
    y = operator.imul(y, 2)
    n = operator.iadd(3, 4)
    return y, n


@case(lambda: ([torch.randn(2), torch.randn(2), torch.randn(2)],))
def operator_itemgetter(xs):
    g = operator.itemgetter(0, 2)
    a, c = g(xs)
    return a + c, operator.itemgetter(1)(xs)


@case(lambda: (torch.randn(2, 3),))
def operator_attrgetter_methodcaller(x):
    shape = operator.attrgetter("shape")(x)
    s = operator.methodcaller("sum", 1)(x)
    return s, shape


@case(lambda: (torch.randn(3), torch.randn(3)))
def operator_reduce_style(a, b):
    import functools
    return functools.reduce(operator.add, [a, b, a * b]), functools.reduce(operator.mul, [1, 2, 3, 4])
