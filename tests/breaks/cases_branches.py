"""Data-dependent control flow: ``if`` / ``while`` / ternaries / ``assert`` / ``and``-``or`` on
tensor values. Inputs alternate in sign across calls, so both branches are taken."""
import torch

from .harness import case, log_setup

LOG = []


def alt(n, i):
    """Shifted up on even calls, down on odd ones: ``x.sum() > 0`` alternates."""
    return (torch.randn(n, 3) * 0.1 + (1.0 if i % 2 == 0 else -1.0),)


def alt2(n, i):
    return (torch.randn(n, 3) * 0.1 + (1.0 if i % 2 == 0 else -1.0), torch.randn(n, 3))


@case(alt)
def if_sum_positive(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    else:
        y = y - 1
    return y * 3


@case(alt)
def if_returns_in_both(x):
    y = x.exp()
    if x.mean() > 0:
        return y.log()
    return -y


@case(alt)
def if_without_else(x):
    y = x + 0.5
    if y.sum() < 0:
        y = y.abs()
    return y * y


@case(alt)
def if_elif_else_tensor(x):
    y = x * 3
    s = y.sum()
    if s > 20:
        z = y - 20
    elif s > -20:
        z = y
    else:
        z = y + 20
    return z


@case(alt)
def ternary_tensor_cond(x):
    y = x.sin()
    z = y * 2 if y.sum() > 0 else y * -2
    return z + x


@case(alt)
def not_any_cond(x):
    y = x * 4
    if not (y > 0).any():
        return y.neg()
    return y


@case(alt)
def and_or_tensor_conds(x):
    y = x + 1
    if (y > 0).all() or y.sum() > 100:
        r = y * 10
    elif (y < 0).any() and y.sum() < 0:
        r = y / 10
    else:
        r = y
    return r


@case(alt)
def truthiness_of_tensor(x):
    y = (x > 0).sum()
    if y:
        return x * y
    return x - 1


@case(alt)
def bool_call_on_element(x):
    y = x * 2
    flag = bool(y[0, 0] > 0)
    return y + (1 if flag else -1), flag


@case(alt)
def assert_passing_on_tensor(x):
    y = x.abs()
    assert (y >= 0).all(), "abs must be non-negative"
    return y + 1


@case(alt)
def two_branches_in_sequence(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    z = y.cos()
    if z.mean() > 0.5:
        z = z * 10
    else:
        z = z - 10
    return z


@case(alt)
def nested_tensor_ifs(x):
    y = x.clone()
    if y.sum() > 0:
        if y.max() > 1.1:
            r = y * 2
        else:
            r = y * 3
    else:
        if y.min() < -1.1:
            r = y / 2
        else:
            r = y / 3
    return r


@case(alt)
def branch_on_item_comparison(x):
    y = x.mean()
    if y.item() > 0:
        return x - y
    return x + y


@case(alt)
def branch_returns_different_types(x):
    y = x * 5
    if y.sum() > 0:
        return y
    return (y, "negative")


@case(alt, setup=log_setup)
def branch_with_side_effect(x):
    y = x + 2
    if y.sum() > 6:
        LOG.append("big")
    else:
        LOG.append("small")
    return y


@case(lambda n, i: (torch.randint(-2, 3, (n,)) if i % 2 else torch.zeros(n, dtype=torch.int64),))
def branch_on_int_any(x):
    y = x * 2
    if y.any():
        return y + 1
    return y - 1


@case(alt2)
def branch_on_torch_equal(x, y):
    z = x * 1
    if torch.equal(z, x):
        z = z + y
    if torch.allclose(z, x):
        z = z * 100
    return z


THRESH = 0.0


@case(alt)
def branch_against_global_threshold(x):
    y = x.mean(1)
    if y.max() > THRESH:
        return y - THRESH
    return y + THRESH


@case(alt2)
def builtin_max_of_tensors(x, y):
    a = x.sum()
    b = y.sum()
    # max() over one-element tensors alone is a torch.where in the graph (issue 26); against a float,
    # the result's type (tensor or float) depends on the data, so that stays a break
    m = max(a, 0.0) + max(b, 0.0)
    return m * 2, x + y


# the comprehension is a loop (in its own function): it runs as plain Python; the work before and
# after it must still compile
@case(lambda n, i: ([torch.randn(3) + (1.0 if (i + k) % 2 else -1.0) for k in range(n)],), min_graphs=4)
def comprehension_filter_on_tensor(ts):
    total = torch.stack(ts).sum(0)
    kept = [t * 2 for t in ts if t.sum() > 0]
    return kept, len(kept), total.tanh() * len(kept)


@case(lambda n, i: ([torch.randn(3) + (1.0 if (i + k) % 3 == 0 else -1.0) for k in range(n)],))
def any_generator_on_tensor(ts):
    stacked = torch.stack(ts)
    found = any(t.sum() > 0 for t in ts)
    return stacked * (2 if found else 3), found


@case(alt)
def while_tensor_condition(x):
    y = x * 8
    steps = 0
    while y.abs().sum() > 1.0:
        y = y / 2
        steps += 1
    return y, steps


@case(alt)
def branch_then_item_then_branch(x):
    y = x + 0.1
    if y.sum() > 0:
        y = y * 2
    k = y.abs().max().item()
    if k > 1.5:
        return y / k
    return y * k


@case(alt)
def chained_comparison_tensor(x):
    s = x.sum()
    y = x * 2
    if -100 < s < 100:
        return y
    return -y


@case(alt)
def min_builtin_cond_mixed(x):
    y = x * 2
    lo = min(y.sum(), 0.0)
    return y - lo


@case(lambda n, i: ([torch.randn(3) + (1.0 if (i + k) % 2 else -1.0) for k in range(n)],))
def comprehension_filter_with_work_around(ts):
    base = torch.stack(ts) * 2
    kept = [t for t in ts if t.sum() > 0]
    return base.sum(0) + len(kept)
