"""The frame's state at a break: values left on the stack mid-expression (call arguments, list /
dict / f-string displays, binary operands), locals that alias each other or are views of inputs,
deleted / conditionally-bound locals, cell variables of the compiled frame written by inner
functions, walrus, star-unpacking, match statements, code after a try block."""
import torch

from .harness import case, t, alt, log_setup

LOG = []


def _p(v, tag="p"):
    print("called", tag)
    return v * 2


@case(t)
def break_in_binary_operand(x):
    return (x * 3) + _p(x)


@case(t)
def break_in_call_argument_list(x):
    return torch.cat([x + 1, _p(x, "arg"), x - 1], 0)


@case(t)
def break_in_list_display(x):
    parts = [x.sum(), print("mid display"), x.mean()]
    return parts[0] + parts[2], parts[1]


@case(t)
def break_in_dict_display(x):
    d = {"a": x * 2, "b": _p(x, "dict"), "c": x.shape[0]}
    return d


@case(t)
def break_in_fstring(x):
    y = x * 2
    s = f"{y.shape[0]}-{_p(y, 'fstr').shape[1]}-{y.dim()}"
    return s, y


@case(t)
def break_in_method_call_chain(x):
    return (x + 1).mul(_p(x, "chain")).sum(0)


@case(t)
def tensor_format_spec(x):
    y = x.sum()
    return f"{y:.3f}", x * 2


@case(t)
def aliased_locals_across_break(x):
    a = x * 2
    b = a
    print("aliases")
    a.add_(1)
    return b, a is b


@case(t)
def view_of_input_sees_later_mutation(x):
    v = x[0]
    print("view taken")
    x.add_(1)
    return v.clone(), x.sum()


@case(t)
def view_mutation_updates_base(x):
    flat = x.view(-1)
    print("flat view")
    flat.mul_(2)
    return x


@case(t)
def view_returned_then_base_mutated(x):
    y = x * 1
    v = y[:, 0]
    print("after view")
    y.zero_()
    return v


@case(t)
def deleted_local_across_break(x):
    y = x * 2
    z = y + 1
    del y
    print("deleted y")
    y_exists = "y" in locals()
    return z, y_exists


@case(alt)
def conditionally_bound_local(x):
    if x.sum() > 0:
        extra = x * 10
    print("after branch")
    try:
        return x + extra
    except UnboundLocalError:
        return x - 1


# torch.compile compiles the work before and after the break
@case(t, xfail="known limit (docs/graph-breaks.md): a frame with cell variables cannot resume after a "
               "break and runs eagerly (tests/breaks/FAILURES.md section 2): 0 graphs")
def cell_variable_written_by_inner(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    bump()
    print("bumped once")
    bump()
    return x * count, count


@case(t, xfail="known limit: see cell_variable_written_by_inner: 0 graphs")
def cell_variable_read_by_inner_after_break(x):
    scale = x.shape[0]

    def apply(v):
        return v * scale

    print("defined apply")
    scale = scale + 1
    return apply(x)


@case(t)
def walrus_across_break(x):
    if (n := x.shape[0]) > 2:
        print("walrus", n)
    return x * n


@case(t)
def star_unpacking_across_break(x):
    first, *rest = x.unbind(0)
    print("rest", len(rest))
    return first + sum(rest)


@case(lambda n: (torch.randn(n, 3), "scale" if n == 4 else "shift"))
def match_statement_after_break(x, op):
    y = x * 2
    print("matching", op)
    match op:
        case "scale":
            return y * 3
        case "shift":
            return y + 3
        case _:
            return y


@case(t)
def work_after_try_block(x):
    try:
        print("in try")
    except RuntimeError:
        pass
    y = x.exp()
    return y.log() * 2


@case(t, setup=log_setup)
def many_live_locals_of_many_types(x):
    a = x + 1
    b = [a, 2]
    c = {"k": a}
    d = (a, "s")
    e = 3.5
    f = None
    g = torch.float32
    h = slice(1, 3)
    print("live locals")
    LOG.append((type(b).__name__, type(c).__name__, e, f, str(g)))
    return a[h] * e, b[0] is a, c["k"] is a, d[0] is a


@case(t)
def break_in_comprehension_over_tensor_rows(x):
    ys = [_p(r, "row") for r in (x * 2)[:2]]
    return torch.stack(ys) + 1


@case(t)
def super_forward_breaks(x):
    return _Child()(x)


class _Base(torch.nn.Module):
    def forward(self, x):
        print("base forward")
        return x * 2


class _Child(_Base):
    def forward(self, x):
        y = super().forward(x + 1)
        return y - 1


@case(t)
def isinstance_checks_after_break(x):
    y = x.double()
    print("checking")
    return isinstance(y, torch.Tensor), y.dtype == torch.float64, y * 2


@case(t)
def returned_leafness(x):
    y = x * 2
    print("leafness")
    return x, y, y.is_leaf, x.is_leaf


@case(lambda n: (torch.randn(n, 3, requires_grad=True),))
def requires_grad_input_returned_after_break(x):
    y = x * 2
    print("grad_fn set", y.grad_fn is not None)
    return x, y


# A generator runs lazily, up to each yield as it is pulled; one suspended at a yield cannot be
# rebuilt at the break (its frame lives inside the trace), so the frame runs eagerly (logged); the
# results equal eager, but nothing compiles (torch.compile resumes such frames).
@case(t, xfail="a generator suspended at a yield cannot cross a graph break: the frame runs eagerly")
def generator_object_live_across_break(x):
    g = (r * 2 for r in x)
    first = next(g)
    print("generator started")
    rest = list(g)
    return first, torch.stack(rest)


@case(lambda n: ([torch.randn(3) for _ in range(n)],))
def iterator_live_across_break(ts):
    it = iter(ts)
    a = next(it)
    print("iterator advanced")
    b = next(it)
    return a + b, len(list(it))


@case(t)
def print_partial_lines(x):
    y = x * 2
    print("partial", end="")
    print(" line", end=" ")
    z = y + 1
    print("done")
    return z


@case(t)
def lambda_closing_over_local(x):
    s = x.shape[0] * 0.5
    f = lambda v: v * s  # noqa: E731
    print("lambda made")
    return f(x) + 1


@case(t)
def inner_function_defined_after_break(x):
    y = x * 2
    print("before def")

    def inner(v):
        return v + y

    return inner(x)


@case(t)
def dict_comprehension_with_print_and_work_around(x):
    y = x * 2
    d = {k: (print("key", k), y[k])[1] for k in range(2)}
    return d[0] + d[1] + y.sum(0)


@case(t)
def set_comprehension_with_item(x):
    y = (x * 2).round()
    vals = {round(v.item()) for v in y[:, 0]}
    return sorted(vals), y + 1


@case(t)
def item_value_becomes_shape(x):
    k = int(x.abs().sum().item()) % 3 + 1
    return torch.ones(k, 2) * x.sum(), k


@case(t)
def tolist_becomes_shape(x):
    dims = (x.abs() * 0 + torch.tensor([2.0, 1.0, 3.0])).int()[0].tolist()
    return torch.zeros(*dims) + x.mean()


@case(t)
def size_dtype_device_locals_across_break(x):
    s = x.shape
    dt = x.dtype
    dev = x.device
    print("metadata", s, dt, dev)
    return torch.zeros(s, dtype=dt, device=dev) + x * 2


@case(t)
def module_created_inside_frame(x):
    lin = torch.nn.Linear(3, 2)
    print("module made")
    return lin(x)


@case(t)
def generator_object_seeded_inside(x):
    g = torch.Generator().manual_seed(11)
    a = torch.randn(3, generator=g)
    print("drew a")
    b = torch.randn(3, generator=g)
    return x * a + b


@case(lambda n: (torch.randn(n, 3, requires_grad=True),),
      xfail="known limit: a grad-mode context object held in a local cannot be rebuilt at the break, "
            "so the frame runs eagerly (tests/breaks/FAILURES.md section 3): 0 graphs")
def context_object_stored_in_local(x):
    ctx = torch.no_grad()
    y = x * 2
    with ctx:
        print("inside stored ctx")
        z = y * 3
    return y, z


@case(t)
def data_attribute_mutation(x):
    y = x * 1
    y.data.add_(1)
    print("data mutated")
    return y


@case(t)
def while_else_with_break_inside_loop(x):
    y = x
    i = 0
    while i < 3:
        y = y + 1
        i += 1
    else:
        print("while else")
        y = y * 2
    return y
