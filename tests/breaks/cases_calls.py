"""Breaks inside callees: helpers, nested helpers, ember.disable-d functions, lambdas, partials,
static/class methods, callable objects, recursion, generators consumed inside the function."""
import functools

import torch

import ember

from .harness import case, t, alt, log_setup

LOG = []


def _h_print(v):
    w = v * 2
    print("in helper", tuple(w.shape))
    return w + 1


@case(t)
def helper_prints(x):
    y = x - 1
    z = _h_print(y)
    return z * y


def _h_item(v):
    return (v * v).sum().item()


@case(t)
def helper_returns_item(x):
    y = x + 2
    s = _h_item(y)
    return y / s, s


def _h_branch(v):
    if v.sum() > 0:
        return v * 10
    return v / 10


@case(alt)
def helper_with_tensor_branch(x):
    y = x.exp() - 1
    z = _h_branch(y)
    return z + x


def _inner3(v):
    print("inner3")
    return v.sin()


def _inner2(v):
    return _inner3(v * 2) + 1


def _inner1(v):
    return _inner2(v + 1) * 3


@case(t)
def nested_helpers_break_innermost(x):
    y = x.abs()
    return _inner1(y) - y


@case(t)
def helper_called_twice(x):
    a = _h_print(x)
    b = _h_print(a)
    return a + b


def _h_pair(v):
    m = v.max().item()
    return v - m, m


@case(t)
def helper_returns_tensor_and_scalar(x):
    y = x * 3
    z, m = _h_pair(y)
    return z * 2, m


@ember.disable
def _disabled_compute(v):
    return (v * 2).sum(0)


@case(t)
def disabled_helper(x):
    y = x + 1
    z = _disabled_compute(y)
    return z * 3


@ember.disable
def _disabled_log(v, tag):
    LOG.append((tag, v.shape[0]))
    return v.clone()


@case(t, setup=log_setup)
def disabled_helper_mutates_global(x):
    y = x * 2
    z = _disabled_log(y, "first")
    w = _disabled_log(z + 1, "second")
    return w - y


@ember.disable(recursive=False)
def _disabled_nonrecursive(v):
    print("nonrecursive disabled")
    return v * 5


@case(t)
def disabled_nonrecursive_helper(x):
    y = x - 3
    return _disabled_nonrecursive(y) + y


@ember.disable
def _disabled_kw(v, *, scale=1.0, shift=0.0):
    return v * scale + shift


@case(t)
def disabled_helper_with_kwargs(x):
    y = x.relu()
    return _disabled_kw(y, scale=2.0, shift=0.5) + _disabled_kw(y)


def _disable_returns_list(v):
    return [v + k for k in range(3)]


_disabled_list = ember.disable(_disable_returns_list)


@case(t)
def disabled_function_call_form(x):
    parts = _disabled_list(x * 2)
    return torch.stack(parts).sum(0)


class _Tool:
    def __init__(self):
        self.calls = 0

    @ember.disable
    def run(self, v):
        self.calls += 1
        return v * self.calls

    @staticmethod
    def stat(v):
        print("static")
        return v + 1

    @classmethod
    def klass(cls, v):
        print("classmethod", cls.__name__)
        return v - 1


TOOL = _Tool()


def tool_setup():
    return {"TOOL": _Tool()}


@case(t, setup=tool_setup)
def disabled_method_on_global_object(x):
    y = x + 1
    a = TOOL.run(y)
    b = TOOL.run(y)
    return a + b


@case(t)
def staticmethod_breaks(x):
    return _Tool.stat(x * 2) * 3


@case(t)
def classmethod_breaks(x):
    return _Tool.klass(x * 2) * 3


@case(t)
def lambda_helper_breaks(x):
    h = lambda v: (print("lambda"), v * 2)[1]  # noqa: E731
    return h(x + 1) - 1


def _scaled_print(v, scale, tag="p"):
    print(tag, scale)
    return v * scale


_partial = functools.partial(_scaled_print, scale=3.0, tag="partial")


@case(t)
def partial_helper_breaks(x):
    return _partial(x + 1) + x


class _CallablePrinter:
    def __init__(self, k):
        self.k = k

    def __call__(self, v):
        print("callable object", self.k)
        return v * self.k


PRINTER = _CallablePrinter(4)


@case(t)
def callable_object_breaks(x):
    return PRINTER(x) + PRINTER(x * 2)


def _rec(v, k):
    if k == 0:
        print("base case")
        return v
    return _rec(v * 2, k - 1) + k


@case(t)
def recursive_helper_breaks(x):
    return _rec(x, 3)


def _default_break(v, factor=2, note="default"):
    print(note, factor)
    return v * factor


@case(t)
def helper_default_args_break(x):
    return _default_break(x) + _default_break(x, 3, note="given")


def _star_helper(*vs, **opts):
    print("star", len(vs), sorted(opts))
    out = vs[0]
    for v in vs[1:]:
        out = out + v
    return out * opts.get("scale", 1)


@case(t)
def helper_star_args_break(x):
    return _star_helper(x, x * 2, x * 3, scale=2, tag="t")


def _gen_prints(v):
    for k in range(3):
        print("gen yields", k)
        yield v * k


@case(t)
def generator_consumed_by_list(x):
    parts = list(_gen_prints(x + 1))
    return torch.stack(parts)


@case(t)
def generator_consumed_by_for(x):
    acc = torch.zeros_like(x)
    for p in _gen_prints(x):
        acc = acc + p
    return acc


def _gen_plain(v):
    yield v
    yield v * 2
    yield v * 3


@case(t)
def generator_sum_with_print(x):
    total = sum(_gen_plain(x), torch.zeros_like(x))
    print("sum done")
    return total


@case(t)
def generator_expression_with_item(x):
    vals = list(r.sum().item() for r in x)
    return vals, x * 2


@case(t)
def map_with_breaking_lambda(x):
    y = x * 2
    vals = list(map(lambda r: round(r.max().item(), 4), y))
    return vals, y


@case(t)
def generator_next_calls(x):
    g = _gen_prints(x)
    a = next(g)
    print("between nexts")
    b = next(g)
    return a + b


def _mutating_helper(v, acc):
    acc.append(v.shape[0])
    print("mutating helper")
    acc.append(v.dim())
    return v * 2


@case(lambda n: (torch.randn(n, 3), [0]))
def helper_mutates_arg_list_across_break(x, acc):
    y = _mutating_helper(x, acc)
    acc.append(-1)
    return y, acc


def _helper_with_loop_print(v):
    for k in range(2):
        print("helper loop", k)
        v = v + k
    return v


@case(t)
def helper_containing_breaking_loop(x):
    y = x * 2
    z = _helper_with_loop_print(y)
    return z.exp() - y


_compiled_inner = ember.compile(_h_print)


@case(t)
def nested_ember_compiled_callee(x):
    y = x + 1
    z = _compiled_inner(y)
    print("after compiled callee")
    return z * y


def _recursive_compiled(x, k):
    if k == 0:
        return x
    print("depth", k)
    return _recursive_compiled(x * 2, k - 1) + 1


@case(lambda n: (torch.randn(n, 3), 2))
def recursion_through_break(x, k):
    return _recursive_compiled(x + 0, k) * 3


class _Made:
    def __init__(self, v):
        print("Made.__init__")
        self.v = v * 2

    @property
    def doubled(self):
        print("property getter")
        return self.v * 2


@case(t)
def breaking_init_and_property(x):
    m = _Made(x + 1)
    return m.doubled + m.v


@case(lambda n: ([torch.randn(3) for _ in range(n)],))
def sorted_with_breaking_key(ts):
    order = sorted(ts, key=lambda v: v.sum().item())
    return torch.stack(order) * 2


@case(lambda n: ([torch.randn(3) for _ in range(n)],))
def max_with_tensor_key(ts):
    best = max(ts, key=lambda v: v.sum())
    return best * 2, torch.stack(ts).sum(0)


@case(t)
def functools_reduce_breaking(x):
    def step(acc, row):
        print("reduce step")
        return acc + row

    return functools.reduce(step, (x * 2).unbind(0), torch.zeros(3))


@ember.disable
def _disabled_calls_compiled(v):
    return _compiled_inner(v) + 1


@case(t)
def disabled_helper_calling_compiled(x):
    y = x * 3
    return _disabled_calls_compiled(y) - y


class _WithHelper:
    def __init__(self):
        self.k = 3

    def helper(self, v, *, scale=1.0, shift=0.0):
        print("method kwargs", scale, shift)
        return v * scale * self.k + shift


_WH = _WithHelper()


@case(t)
def method_called_with_kwargs_breaks(x):
    y = x + 1
    return _WH.helper(y, scale=2.0) + _WH.helper(y, shift=1.0)


def _ctx_in_callee(v):
    with torch.no_grad():
        print("callee no_grad")
        w = v * 2
    return w + v


@case(lambda n: (torch.randn(n, 3, requires_grad=True),))
def callee_with_no_grad_block_breaks(x):
    y = x * 3
    z = _ctx_in_callee(y)
    return z.sum(1)
