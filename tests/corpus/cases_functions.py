"""Locals, globals, closures and cells; inlining of user functions, methods, lambdas, nested
functions, *args/**kwargs, defaults, keyword-only arguments and bounded recursion."""
import functools

import torch
import torch.nn.functional as F

from .harness import case

SCALE = 3.0
OFFSETS = (1, 2, 3)
TABLE = {"gain": 2.5, "names": ["a", "b"]}
GLOBAL_TENSOR = torch.arange(4.0)
_counter_base = 10


def t4():
    return (torch.randn(4),)


def two4():
    return (torch.randn(4), torch.randn(4))


# ---- helpers that get inlined ----------------------------------------------------------------

def helper_affine(x, w=2.0, b=1.0):
    return x * w + b


def helper_kwonly(x, *, scale, shift=0.0):
    return x * scale + shift


def helper_varargs(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out, len(xs)


def helper_kwargs(x, **opts):
    if "scale" in opts:
        x = x * opts["scale"]
    if opts.get("neg", False):
        x = -x
    return x, sorted(opts)


def helper_everything(a, b=2, *rest, c, d=4, **kw):
    return a * b + sum(rest) + c + d + sum(kw.values()), len(rest), tuple(kw)


def helper_multi_return(x):
    return x.max(), x.min(), x.mean()


def helper_calls_helper(x):
    return helper_affine(helper_affine(x), w=0.5)


def helper_uses_global(x):
    return x * SCALE + OFFSETS[1] + TABLE["gain"]


def factorial(n):
    return 1 if n <= 1 else n * factorial(n - 1)


def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def apply_n(fn, x, n):
    if n == 0:
        return x
    return apply_n(fn, fn(x), n - 1)


def make_adder(k):
    def add(x):
        return x + k
    return add


def make_counter():
    count = 0

    def bump():
        nonlocal count
        count += 1
        return count
    return bump


# ---- globals, locals, closures, cells -----------------------------------------------------

@case(t4)
def read_globals(x):
    return x * SCALE + sum(OFFSETS) + TABLE["gain"], TABLE["names"][1]


@case(t4)
def read_global_tensor(x):
    return x + GLOBAL_TENSOR


@case(t4)
def read_global_module_attr(x):
    return F.relu(x) + torch.pi


@case(t4)
def many_locals(x):
    a = x + 1
    b = a * 2
    c = b - a
    d = c / 2
    e = d + a + b + c
    del a
    return e, b


@case(t4)
def closure_over_local(x):
    k = 5

    def inner(y):
        return y * k
    return inner(x)


@case(t4)
def closure_over_tensor(x):
    w = x * 2

    def inner(y):
        return y + w
    return inner(x) + inner(w)


@case(t4)
def closure_nonlocal_write(x):
    total = 0

    def add(v):
        nonlocal total
        total = total + v
    add(1)
    add(2)
    return x * total, total


@case(t4)
def closure_nonlocal_tensor(x):
    acc = torch.zeros(4)

    def add(v):
        nonlocal acc
        acc = acc + v
    add(x)
    add(x * 2)
    return acc


@case(t4)
def closure_factory_from_module_level(x):
    add3 = make_adder(3)
    addx = make_adder(x)
    return add3(x), addx(x)


@case(t4)
def closure_counter_state(x):
    bump = make_counter()
    bump()
    bump()
    return x * bump()


@case(t4)
def closure_cell_modified_after_creation(x):
    k = 1

    def f(y):
        return y * k
    k = 10
    return f(x)


@case(t4)
def closure_nested_three_levels(x):
    a = 2

    def outer(y):
        b = 3

        def inner(z):
            return z * a + b
        return inner(y) + a
    return outer(x)


# ---- inlining ------------------------------------------------------------------------------

@case(t4)
def call_defaults(x):
    return helper_affine(x), helper_affine(x, 3.0), helper_affine(x, b=-1.0), helper_affine(x, b=0, w=1)


@case(t4)
def call_kwonly(x):
    return helper_kwonly(x, scale=2.0), helper_kwonly(x, shift=1.0, scale=0.5)


@case(two4)
def call_varargs(a, b):
    xs = (a, b, a * b)
    return helper_varargs(a), helper_varargs(a, b), helper_varargs(*xs)


@case(t4)
def call_kwargs(x):
    opts = {"scale": 2.0}
    return helper_kwargs(x), helper_kwargs(x, scale=3.0, neg=True), helper_kwargs(x, **opts)


@case(t4)
def call_everything(x):
    r1 = helper_everything(1, c=3)
    r2 = helper_everything(1, 2, 3, 4, c=5, d=6, e=7, f=8)
    args = (1, 2, 5)
    kw = {"c": 1, "z": 2}
    r3 = helper_everything(*args, **kw)
    return x * r1[0] + r2[0], r1, r2, r3


@case(t4)
def call_multi_return_unpack(x):
    mx, mn, mean = helper_multi_return(x)
    return mx - mn + mean


@case(t4)
def call_chain(x):
    return helper_calls_helper(x), helper_uses_global(x)


@case(t4)
def recursion_python_int(x):
    return x * factorial(5) + fib(7), factorial(6)


@case(t4)
def recursion_on_tensor_bounded(x):
    return apply_n(torch.sin, x, 3), apply_n(lambda v: v * 2, x, 4)


@case(t4)
def lambdas(x):
    sq = lambda v: v * v  # noqa: E731
    add = lambda a, b=1: a + b  # noqa: E731
    return sq(x), add(x), add(x, b=x), (lambda: 42)()


@case(two4)
def lambda_in_sorted_and_map(a, b):
    pairs = [(3, a), (1, b), (2, a + b)]
    ordered = sorted(pairs, key=lambda p: p[0])
    return [t for _, t in ordered], list(map(lambda p: p[0] * 2, pairs))


@case(t4)
def nested_def_with_defaults(x):
    def scaled(v, s=2.0, *, off=0.0):
        return v * s + off
    return scaled(x), scaled(x, 3.0, off=1.0)


@case(t4)
def higher_order_functions(x):
    def compose(f, g):
        return lambda v: f(g(v))
    h = compose(torch.relu, lambda v: v - 0.5)
    return h(x), compose(h, h)(x)


@case(t4)
def functools_partial(x):
    p = functools.partial(helper_affine, w=4.0)
    q = functools.partial(torch.clamp, min=-0.5)
    return p(x), q(x, max=0.5)


@case(t4)
def decorated_function(x):
    def twice(fn):
        @functools.wraps(fn)
        def wrapper(v):
            return fn(fn(v))
        return wrapper

    @twice
    def inc(v):
        return v + 1
    return inc(x), inc.__name__


@case(t4)
def function_attributes(x):
    return x + len(helper_affine.__name__), helper_affine.__defaults__


@case(t4)
def pass_function_as_arg(x):
    def apply(fn, v, *args, **kwargs):
        return fn(v, *args, **kwargs)
    return apply(torch.add, x, 1), apply(helper_kwonly, x, scale=2.0), apply(F.softmax, x, dim=0)


@case(lambda: (torch.randn(4), helper_affine))
def function_as_input(x, fn):
    return fn(x)


@case(lambda: (torch.randn(4), torch.tanh))
def torch_function_as_input(x, fn):
    return fn(x) * 2


# ---- user classes and methods -----------------------------------------------------------

class Scaler:
    factor = 2.0

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias

    def __call__(self, x):
        return self.apply(x) - 1

    @staticmethod
    def static_sq(x):
        return x * x

    @classmethod
    def make(cls, bias):
        return cls(bias)

    @property
    def doubled_bias(self):
        return self.bias * 2


class ShiftedScaler(Scaler):
    factor = 3.0

    def apply(self, x):
        return super().apply(x) + 0.5


@case(lambda: (torch.randn(4), Scaler(1.5)))
def method_on_input_object(x, s):
    return s.apply(x), s(x), s.doubled_bias, s.factor


@case(t4)
def object_created_inside(x):
    s = Scaler(0.25)
    return s.apply(x), Scaler.static_sq(x), Scaler.make(2.0).bias


@case(t4)
def inheritance_and_super(x):
    s = ShiftedScaler(1.0)
    return s.apply(x), s(x), isinstance(s, Scaler), type(s).factor


@case(lambda: (torch.randn(4), ShiftedScaler(torch.ones(4))))
def method_with_tensor_attribute(x, s):
    return s.apply(x), s.doubled_bias


@case(t4)
def bound_method_as_value(x):
    s = Scaler(1.0)
    f = s.apply
    g = x.add
    return f(x), g(2)


@case(t4)
def closures_late_binding_in_loop(x):
    fs = [lambda v: v * i for i in range(3)]
    gs = [lambda v, i=i: v * i for i in range(3)]
    return [f(x) for f in fs], [g(x) for g in gs]


@case(t4)
def walrus_operator(x):
    if (n := x.shape[0]) > 2:
        x = x * n
    ys = [y for i in range(3) if (y := i * 2) > 0]
    return x, ys, n


@torch.no_grad()
def _no_grad_helper(x):
    return x * 2


@case(lambda: (torch.randn(4, requires_grad=True),))
def no_grad_decorated_helper(x):
    y = _no_grad_helper(x)
    return y, x * 3, y.requires_grad


@case(t4)
def global_function_table(x):
    ops = {"affine": helper_affine, "kw": lambda v: helper_kwonly(v, scale=3.0)}
    return {k: fn(x) for k, fn in ops.items()}


@case(t4)
def star_unpack_into_call_and_literals(x):
    dims = (2, 2)
    parts = [x[:2], x[2:]]
    return x.view(*dims), torch.cat([*parts, x]), [*dims, 1], (*dims, *dims), {**{"a": 1}, "b": x}


@case(t4)
def inner_function_recursion(x):
    def power(v, n):
        if n == 0:
            return torch.ones_like(v)
        return v * power(v, n - 1)
    return power(x, 3)


@case(lambda: (torch.randn(3, 4),))
def unbound_tensor_methods_and_dynamic_getattr(x):
    return (torch.Tensor.add(x, 1), torch.Tensor.sum(x, dim=0), getattr(x, "mean")(), getattr(x, "relu")(),
            getattr(torch, "tanh")(x), getattr(F, "gelu")(x))


@case(t4)
def deep_bounded_recursion_and_long_unroll(x):
    def tree(v, depth):
        if depth == 0:
            return v
        return tree(v * 0.5, depth - 1) + tree(v + 1, depth - 1)
    y = tree(x, 4)
    for i in range(40):
        y = y + (i % 3)
    return y
