"""Python-semantics traps a symbolic interpreter must get right: aliasing of lists under +=,
tuples under +=, shared closure cells, default values bound at definition time, sort stability,
del/rebind, chained comparisons, iterator exhaustion, dict order on overwrite."""
import torch

from .harness import case

_LIMIT = 3


def two():
    return (torch.randn(3), torch.randn(3))


@case(two)
def list_iadd_mutates_alias(x, y):
    a = [x]
    b = a
    b += [y]
    c = a + [x]   # a new list
    c.append(y)
    return a, len(b), len(c), a is b


@case(two)
def tuple_iadd_rebinds(x, y):
    a = (x,)
    b = a
    b += (y,)
    return a, b, a is b


@case(two)
def tensor_alias_then_rebind(x, y):
    z = x * 1
    w = z
    w = w + y      # rebinding: z unchanged
    v = z
    v += y         # in place: z changed
    return z, w, v is z


@case(two)
def shared_cell_between_inner_functions(x, y):
    k = 1

    def get():
        return k

    def put(v):
        nonlocal k
        k = v
    put(5)
    first = x * get()
    put(7)
    return first, y * get(), k


@case(two)
def default_bound_at_definition_time(x, y):
    k = 2

    def f(v, k=k):
        return v * k
    k = 100
    return f(x), k


@case(two)
def sort_is_stable(x, y):
    items = [("b", 1, x), ("a", 1, y), ("c", 0, x + y), ("d", 1, x - y)]
    ordered = sorted(items, key=lambda it: it[1])
    return [name for name, _, _ in ordered], ordered[-1][2]


@case(two)
def del_and_rebind(x, y):
    a = x + 1
    b = a
    del a
    a = y * 2
    return a, b


@case(lambda: (torch.randn(3), 3))
def chained_comparisons_python(x, n):
    r = (1 < n <= 5, 0 <= n < 3, n == 3 == _LIMIT, 1 < 2 > 0, not 1 < n < 2)
    return x * sum(r), r


@case(two)
def iterator_exhaustion(x, y):
    it = iter([x, y])
    first = list(it)
    second = list(it)
    gen = (t * 2 for t in [x, y])
    a = sum(gen)
    b = sum(gen, torch.zeros(3))
    return first, second, a, b


@case(two)
def dict_order_on_overwrite_and_reinsert(x, y):
    d = {"a": x, "b": y, "c": x + y}
    d["a"] = y          # keeps position
    v = d.pop("b")
    d["b"] = v * 2      # goes to the end
    return list(d), d


@case(two)
def list_of_lists_shared_reference(x, y):
    row = [x]
    grid = [row, row]
    grid[0].append(y)
    return len(grid[1]), grid[1][1], [r is row for r in grid]


@case(two)
def comprehension_scope_does_not_leak(x, y):
    i = 10
    ys = [x * i for i in range(2)]
    return ys, i, y * i


@case(two)
def augmented_subscript_and_attribute(x, y):
    d = {"k": x}
    d["k"] += y           # in place on the tensor stored in d, i.e. on the input x
    lst = [1, 2]
    lst[0] += 5
    return d["k"], lst


@case(two)
def boolean_operators_return_operands(x, y):
    a = [] or [x]
    b = [y] and "s"
    c = 0 or None or 3
    d = (1, 2) and () or {"z": 1}
    return a, b, c, d


@case(two)
def nested_unpacking_with_star_and_swap(x, y):
    (a, *b), c = (x, y, x + y), y * 2
    a, c = c, a
    [p, q], *_ = [[1, 2], 3, 4]
    return a, b, c, p + q


@case(two)
def int_float_bool_identity_and_equality(x, y):
    r = (1 == 1.0, True == 1, hash(1) == hash(1.0), 0.1 + 0.2 == 0.3, round(0.1 + 0.2, 10) == 0.3,
         float("nan") != float("nan"), -0.0 == 0.0, 7 // -2, -7 % 3, 2 ** -1, 10 ** 20 // 3)
    return x * r[1], r


@case(two)
def string_keys_with_fstring_and_format_spec(x, y):
    stats = {}
    for i, t in enumerate((x, y)):
        stats[f"mean_{i:03d}"] = t.mean()
        stats["max_{}".format(i)] = t.max()
    return stats, sorted(stats)
