"""Breaks in functions with *args / **kwargs, keyword-only and default arguments, Python scalars
and strings as arguments (recompiles on a new scalar), closures reading outer variables, nested
function definitions, argument forwarding."""
import torch

from .harness import case, t

OUTER_SCALE = 3.0


@case(lambda n: (torch.randn(n, 3), torch.randn(n, 3), torch.randn(n, 3)))
def star_args_print(*xs):
    print("got", len(xs), "tensors")
    total = xs[0]
    for v in xs[1:]:
        total = total + v
    return total * 2


@case(t, kwargs=lambda n: {"scale": 2.0, "shift": 1.0, "tag": "kw"})
def star_kwargs_print(x, **kw):
    y = x * kw["scale"]
    print("kwargs", sorted(kw.items()))
    return y + kw["shift"]


@case(t, kwargs=lambda n: {"alpha": 0.5})
def keyword_only_args(x, *, alpha, beta=2.0):
    y = x * alpha
    print("alpha beta", alpha, beta)
    return y + beta


@case(t)
def defaults_not_passed(x, scale=3.0, bias=None, label="default"):
    y = x * scale
    print(label)
    if bias is not None:
        y = y + bias
    return y


@case(t, kwargs=lambda n: {"scale": -1.0, "label": "given"})
def defaults_overridden_by_kwargs(x, scale=3.0, label="default"):
    y = x * scale
    print(label, scale)
    return y.relu()


@case(t, kwargs=lambda n: {"mode": "sum"})
def mixed_positional_kwargs_item(x, k=2, *, mode="mean"):
    y = x * k
    v = (y.sum() if mode == "sum" else y.mean()).item()
    return y - v, v


@case(lambda n: ((torch.randn(n, 3), torch.randn(n, 3)),))
def tuple_arg_iterated_with_print(pair):
    out = []
    for idx, v in enumerate(pair):
        print("element", idx)
        out.append(v * (idx + 1))
    return out[0] + out[1]


# the loop runs as plain Python; the work before and after it compiles, at both sizes
@case(t, kwargs=lambda n: {"b": torch.ones(3), "a": torch.full((3,), 2.0)}, min_graphs=4)
def kwargs_iteration_order_print(x, **tensors):
    y = x.exp()
    for name, v in tensors.items():
        print("applying", name)
        y = y * v
    return y.log()


@case(lambda n: (torch.randn(4, 3), n))
def python_int_arg_recompiles(x, k):
    y = x * k
    print("k =", k)
    return y + k


@case(lambda n: (torch.randn(4, 3), n / 2))
def python_float_arg_recompiles(x, f):
    y = x * f
    print(f"f={f:.2f}")
    return y - f


@case(lambda n: (torch.randn(4, 3), "add" if n == 4 else "mul"))
def python_str_arg_dispatch(x, op):
    print("op", op)
    if op == "add":
        return x + 1
    return x * 2


@case(lambda n: (torch.randn(n, 3), n % 2 == 0))
def python_bool_flag(x, verbose):
    y = x.sin()
    if verbose:
        print("verbose on")
    return y * 2


@case(lambda n: (torch.randn(n, 3), (1, (2.0, "s"))))
def nested_tuple_arg(x, cfg):
    a, (b, s) = cfg
    print(s, a, b)
    return x * a + b


_OUTER_T = torch.arange(3.0)


def make_closure_over_tensor():
    w = _OUTER_T * 2

    def f(x):
        y = x * w
        print("closure tensor")
        return y + w

    return f


case(t, name="closure_over_tensor")(make_closure_over_tensor())


def make_closure_over_list():
    seen = []

    def f(x):
        seen.append(x.shape[0])
        print("closure list", len(seen) > 0)
        return x * len(seen), list(seen)

    f.seen = seen
    return f


_closure_list_fn = make_closure_over_list()


def _reset_closure_list():
    _closure_list_fn.seen.clear()
    return {}


case(t, name="closure_over_list", setup=_reset_closure_list,
     state=lambda _: list(_closure_list_fn.seen))(_closure_list_fn)


def make_closure_over_scalar(scale):
    def f(x):
        y = x * scale
        print("scale", scale)
        return y - scale

    return f


case(t, name="closure_over_scalar")(make_closure_over_scalar(2.5))


@case(t)
def global_scalar_read(x):
    y = x * OUTER_SCALE
    print("outer", OUTER_SCALE)
    return y


@case(t)
def nested_def_breaking(x):
    def inner(v, k):
        print("inner def", k)
        return v * k

    y = inner(x, 2)
    return inner(y, 3) + 1


@case(t)
def nested_def_closure_over_local(x):
    base = x.mean()

    def inner(v):
        print("inner closure")
        return v - base

    return inner(x * 2)


def _forward_kwargs(**kw):
    print("forwarded", sorted(kw))
    return kw["a"] * 2 + kw.get("b", 0)


@case(t)
def kwargs_forwarding_to_breaking_callee(x):
    opts = {"a": x, "b": 1.0}
    return _forward_kwargs(**opts)


def _forward_args(*args):
    print("args", len(args))
    return sum(args[1:], args[0])


@case(lambda n: (torch.randn(n, 3), torch.randn(n, 3)))
def star_call_forwarding(x, y):
    parts = [x, y, x * y]
    return _forward_args(*parts)


@case(t, kwargs=lambda n: {"y": torch.ones(n, 3)})
def positional_and_tensor_kwarg(x, y=None):
    z = x + (y if y is not None else 0)
    print("kw tensor")
    return z


@case(lambda n: (torch.randn(n, 3), [1.0, 2.0, 3.0]))
def list_arg_read_after_break(x, coeffs):
    y = x * coeffs[0]
    print("coeffs", len(coeffs))
    return y + coeffs[1] * coeffs[2]


@case(lambda n: (torch.randn(n, 3), None))
def none_arg_default_tensor(x, bias):
    print("bias is None", bias is None)
    if bias is None:
        bias = torch.zeros(3)
    return x + bias


@case(lambda n: (torch.randn(n, 3), n))
def python_int_arg_used_in_loop(x, k):
    y = x
    print("loops", k)
    for j in range(k % 3 + 1):
        y = y + j
    return y
