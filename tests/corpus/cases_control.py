"""Control flow on Python values (constant-folded ``if``/``while``, unrolled ``for``), early
returns, loops with break/continue/else, and grad-mode / autocast context managers."""
import torch

from .harness import case


def t34():
    return (torch.randn(3, 4),)


@case(lambda: (torch.randn(3), True))
def if_on_bool_arg(x, flag):
    if flag:
        y = x + 1
    else:
        y = x - 1
    return y


@case(lambda: (torch.randn(3), False))
def if_on_bool_arg_false(x, flag):
    if flag:
        return x + 1
    return x - 1


@case(lambda: (torch.randn(3), 5))
def if_elif_else_int(x, n):
    if n < 0:
        return x * 0
    elif n < 3:
        return x * 1
    elif n == 5:
        return x * 5
    else:
        return x * 10


@case(lambda: (torch.randn(3), None))
def if_is_none(x, bias):
    if bias is None:
        bias = torch.ones(3)
    return x + bias


@case(lambda: (torch.randn(3), torch.randn(3)))
def if_is_not_none_tensor(x, bias):
    if bias is not None:
        x = x + bias
    return x


@case(lambda: (torch.randn(2, 3),))
def if_on_shape(x):
    if x.shape[0] == 2 and x.dim() == 2:
        return x.t()
    return x


@case(lambda: (torch.randn(2, 3),))
def if_on_dtype_and_grad(x):
    if x.dtype == torch.float32 and not x.requires_grad:
        x = x.double()
    if x.is_floating_point():
        x = x * 2
    return x


@case(lambda: (torch.randn(4), [1, 2]))
def if_on_container_truthiness(x, xs):
    out = x
    if xs:
        out = out + len(xs)
    if not []:
        out = out * 2
    if {}:
        out = out * 100
    if "":
        out = out - 100
    return out


@case(lambda: (torch.randn(3), 3))
def ternary_and_short_circuit(x, n):
    y = x * 2 if n > 2 else x / 2
    z = (n > 5 and x) or (n < 5 and x + 1)
    w = n or 7
    return y, z, w, (0 or None), (None and 1)


@case(lambda: (torch.randn(3), 4))
def while_loop_python_counter(x, n):
    i = 0
    while i < n:
        x = x * 0.5 + i
        i += 1
    return x, i


@case(lambda: (torch.randn(3),))
def while_with_break(x):
    k = 1
    while True:
        x = x + k
        k *= 2
        if k > 16:
            break
    return x, k


@case(lambda: (torch.randn(3),))
def while_else(x):
    i = 0
    while i < 3:
        i += 1
    else:
        x = x - 1
    return x


@case(lambda: (torch.randn(3), 5))
def for_range(x, n):
    for i in range(n):
        x = x + i
    return x


@case(lambda: (torch.randn(3),))
def for_range_step_negative(x):
    acc = []
    for i in range(10, 0, -3):
        acc.append(x * i)
    return acc


@case(lambda: (torch.randn(3),))
def for_break_continue_else(x):
    for i in range(10):
        if i % 2 == 0:
            continue
        if i > 6:
            break
        x = x + i
    else:
        x = x * 1000
    for j in range(2):
        pass
    else:
        x = x - j
    return x


@case(lambda: (torch.randn(2, 2),))
def for_nested_loops(x):
    out = []
    for i in range(2):
        for j in range(3):
            if j == 2:
                break
            out.append(x[i] * j)
    return torch.stack(out)


@case(lambda: ([torch.randn(2), torch.randn(2)], (3, 4)))
def for_over_tuple_and_list(ts, ks):
    out = torch.zeros(2)
    for t in ts:
        for k in ks:
            out = out + t * k
    return out


@case(lambda: (torch.randn(4, 3),))
def for_over_tensor_rows(x):
    rows = []
    for row in x:
        rows.append(row.sum())
    return torch.stack(rows)


@case(lambda: (torch.randn(3),))
def for_over_dict_and_string(x):
    d = {"a": 1, "b": 2}
    for k in d:
        x = x + d[k]
    for ch in "xyz":
        x = x * (ord(ch) - 119)
    return x


@case(lambda: (torch.randn(3), 3))
def early_return_in_loop(x, n):
    for i in range(10):
        if i == n:
            return x * i
        x = x + 1
    return x


@case(lambda: (torch.randn(3),))
def loop_variable_after_loop(x):
    for i in range(4):
        pass
    return x * i


@case(lambda: (torch.randn(3),))
def assert_on_python_values(x):
    assert x.dim() == 1, "expected a vector"
    assert isinstance(x, torch.Tensor)
    return x + 1


@case(lambda: (torch.randn(3), 2))
def match_like_dispatch(x, mode):
    table = {0: torch.sin, 1: torch.cos, 2: torch.exp}
    return table[mode](x)


# ---- grad mode and autocast --------------------------------------------------------------

@case(lambda: (torch.randn(3, requires_grad=True),))
def no_grad_block(x):
    y = x * 2
    with torch.no_grad():
        z = x * 3
    return y, z, z.requires_grad


@case(lambda: (torch.randn(3, requires_grad=True),))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x + 1
        with torch.enable_grad():
            b = x * 2
        c = x - 1
    return a, b, c


@case(lambda: (torch.randn(3, requires_grad=True),))
def set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x * 2
    return y, x * 3


@case(lambda: (torch.randn(3),))
def is_grad_enabled_branch(x):
    if torch.is_grad_enabled():
        x = x + 1
    with torch.no_grad():
        flag = torch.is_grad_enabled()
    return x, flag


@case(lambda: (torch.randn(4, 4), torch.randn(4, 4)))
def autocast_bf16(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
        d = torch.relu(c)
    e = a @ b
    return c, d, e


@case(lambda: (torch.randn(4, 4), torch.randn(4, 4)))
def autocast_nested_disable(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = torch.mm(a, b)
        with torch.autocast("cpu", enabled=False):
            d = torch.mm(a, b)
    return c.dtype, d.dtype, c.float() + d


@case(lambda: (torch.randn(3, requires_grad=True),))
def no_grad_then_return_outside(x):
    with torch.no_grad():
        y = x.clone()
    return y + x
