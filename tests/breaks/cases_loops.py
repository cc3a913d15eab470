"""Breaks inside ``for`` / ``while`` loops: prints per iteration, item accumulation, loop-carried
tensors, data-dependent ``break`` / ``continue`` / early ``return``, nested loops, ``else`` clauses.

A break inside a loop runs the loop's control as plain Python and compiles the straight-line code of
its body between the breaks (torch.compile skips such frames): every case also has tensor work before
and / or after its loop, which must still compile. test_loops.py checks the per-iteration graphs."""
import torch

import ember

from .harness import case, t, alt, log_setup

LOG = []
TABLE = {}


@case(t, min_graphs=4)  # the work before and after the loop, at both sizes
def for_range_print_each(x):
    y = x.sin()
    for k in range(3):
        print("iter", k)
        y = y * 2 + k
    return y.cos()


@case(t)
def for_item_accumulate(x):
    total = 0.0
    y = x * 1.5
    for k in range(x.shape[0]):
        total += y[k].sum().item()
    return y - total, total


@case(t)
def loop_carried_tensor_with_print(x):
    h = torch.zeros(3)
    for row in x:
        h = torch.tanh(h + row)
        print("h", round(h.sum().item(), 4))
    return h


@case(t, min_graphs=4)
def while_python_counter_print(x):
    i = 0
    y = x * 1.5
    while i < 4:
        y = y + i
        if i % 2 == 0:
            print("even", i)
        i += 1
    return y.tanh(), i


@case(alt)
def while_tensor_cond_with_print(x):
    y = x * 4
    n = 0
    while y.abs().max() > 0.5:
        y = y * 0.5
        n += 1
        print("halved", n)
    return y, n


@case(t)
def data_dependent_break(x):
    y = x * 10
    steps = 0
    for k in range(10):
        y = y * 0.5
        steps = k
        if y.abs().sum() < 2:
            break
    return y, steps


@case(alt)
def data_dependent_continue(x):
    acc = torch.zeros(3)
    skipped = 0
    for row in x:
        if row.sum() < 0:
            skipped += 1
            continue
        acc = acc + row
    return acc, skipped


@case(t, min_graphs=4)
def nested_loops_print_inner(x):
    y = x.exp()
    for a in range(2):
        for b in range(2):
            print("inner", a, b)
            y = y + a * b
        y = y * 2
    return y.log1p()


@case(t)
def nested_loops_break_inner(x):
    y = x.clone()
    out = []
    for a in range(3):
        for b in range(4):
            y = y + 1
            if y.sum() > (a + 1) * 20:
                out.append((a, b))
                break
    return y, out


@case(alt)
def early_return_in_loop(x):
    y = x
    for k in range(5):
        y = y * 1.5
        if y.sum() > 10:
            return y, k
    return -y, -1


@case(lambda n: ([torch.randn(3) for _ in range(n)],))
def loop_over_list_of_tensors_print(ts):
    total = torch.zeros(3)
    for idx, v in enumerate(ts):
        print("item", idx)
        total = total + v * idx
    return total


@case(lambda n: (torch.randn(n, 3), torch.randn(n, 3)))
def loop_zip_item(x, y):
    dots = []
    for a, b in zip(x, y):
        dots.append(round((a * b).sum().item(), 5))
    return dots, x + y


@case(alt)
def for_else_with_break(x):
    y = x
    for k in range(3):
        y = y + 1
        if y.mean() > 3:
            print("broke at", k)
            break
    else:
        print("no break")
        y = -y
    return y


@case(t, min_graphs=4)
def while_true_break_after_print(x):
    y = x - 1
    k = 0
    while True:
        y = y * 2
        k += 1
        print("round", k)
        if k >= 3:
            break
    return y.sigmoid()


def table_setup():
    return {"TABLE": {"a": 1.0, "b": 2.0, "c": 3.0}}


@case(t, setup=table_setup, min_graphs=4)
def loop_over_dict_items_mutating(x):
    y = x.abs()
    for key, val in list(TABLE.items()):
        print(key, val)
        y = y * val
        TABLE[key] = val + 1
    return y.sqrt()


@ember.disable
def _disabled_step(v, k):
    return v * 0.5 + k


@case(t, min_graphs=4)
def loop_calls_disabled_helper(x):
    y = x * 3
    for k in range(3):
        y = _disabled_step(y, k)
        y = y.tanh()
    return y.exp()


@case(t)
def loop_builds_python_floats(x):
    vals = []
    y = x.abs()
    for k in range(3):
        vals.append(y[:, k].sum().item())
    return vals, y / sum(vals)


@case(t)
def loop_over_tolist_indices(x):
    y = x * 3
    rows = y.tolist()
    out = torch.zeros(3)
    for i in range(len(rows)):
        if rows[i][0] > 0:
            out = out + y[i]
    return out


# the break is int(k), before the loop: torch.compile compiles the unrolled loop after it; ember
# resumes with the range on the stack and drives the loop natively, its body compiled
@case(lambda n: (torch.randn(n, 3), torch.tensor(float(n % 5 + 1))))
def loop_range_of_int_tensor(x, k):
    y = x
    for j in range(int(k)):
        y = y + j
    return y


@case(t)
def print_before_and_after_loop(x):
    print("before loop")
    y = x
    for k in range(2):
        y = y.sin() + k
    print("after loop")
    return y * 2


@case(t)
def loop_variable_used_after(x):
    y = x
    for k in range(4):
        print("k", k)
        y = y + k
    return y * k, k


@case(t)
def iterate_tensor_rows_print(x):
    s = torch.zeros(3)
    for r in x * 2:
        print(r.shape)
        s = s + r
    return s


@case(t, min_graphs=4)
def loop_continue_python_cond_print(x):
    y = x.cos()
    for k in range(5):
        if k % 2:
            continue
        print("kept", k)
        y = y * 2 + k
    return y.sin()


@case(t)
def loop_append_tensors_then_stack(x):
    parts = []
    for k in range(3):
        parts.append(x * k)
        print("len", len(parts))
    return torch.stack(parts, 0)


@case(t, min_graphs=4)
def triple_nested_break_middle(x):
    y = x * 0.5
    trace = []
    for a in range(2):
        for b in range(3):
            if b == 1:
                print("break middle", a)
                break
            for c in range(2):
                y = y + a + b + c
                trace.append((a, b, c))
    return y.tanh(), trace


@case(alt, setup=log_setup, min_graphs=4)
def loop_side_effects_per_iteration(x):
    y = x + 0.25
    for k in range(3):
        LOG.append(("start", k))
        y = y * 2
        if y.sum() > 0:
            LOG.append(("pos", k))
        else:
            LOG.append(("neg", k))
    return y.relu()


@case(t)
def while_loop_with_item_condition(x):
    y = x.abs() + 0.1
    n = 0
    while y.sum().item() < 50 and n < 20:
        y = y * 2
        n += 1
    return y, n


@case(t)
def two_loops_with_breaks(x):
    y = x
    for k in range(2):
        print("first loop", k)
        y = y + 1
    z = y * 2
    for k in range(2):
        print("second loop", k)
        z = z - k
    return z


@case(t)
def loop_print_with_work_before_and_after(x):
    y = x.sin() * 2
    for k in range(3):
        print("step", k)
        y = y + k
    return y.cos() - x


@case(alt)
def nested_loop_data_dependent_with_work_after(x):
    y = x * 0.5
    hits = 0
    for a in range(2):
        for row in y:
            if row.sum() > 0:
                hits += 1
    z = y.exp() + hits
    return z, hits
