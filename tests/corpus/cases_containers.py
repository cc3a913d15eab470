"""Tuples, lists, dicts, sets, slices: building, indexing, unpacking, iterating, comprehensions,
in-place list ops and dict methods on locals, f-strings and string methods on constants."""
import torch

from .harness import case


def t34():
    return (torch.randn(3, 4),)


def three():
    return (torch.randn(4), torch.randn(4), torch.randn(4))


# ---- tuples ----------------------------------------------------------------------------------

@case(three)
def tuple_build_index(a, b, c):
    t = (a, b, c)
    return t[0] + t[-1], t[1:], t[::-1], len(t)


@case(three)
def tuple_unpack_swap(a, b, c):
    a, b = b, a
    x, (y, z) = a, (b, c)
    return x - y, z


@case(lambda: ((torch.randn(2), torch.randn(2), torch.randn(2), torch.randn(2)),))
def tuple_star_unpack(t):
    first, *middle, last = t
    head, *rest = t
    return first + last, len(middle), tuple(middle), rest


@case(three)
def tuple_concat_repeat(a, b, c):
    t = (a,) + (b, c)
    u = (1, 2) * 3
    return t, u, u.count(2), (a, b) + tuple([c])


@case(three)
def tuple_compare_contains(a, b, c):
    t = (1, 2, 3)
    return a * (t < (1, 2, 4)), 2 in t, 5 not in t, (1, 2) == (1, 2), t.index(3)


@case(lambda: ((torch.randn(2), 3), ))
def tuple_input_mixed(pair):
    x, n = pair
    return x * n, pair[1] + 1


# ---- lists -------------------------------------------------------------------------------

@case(three)
def list_build_index_slice(a, b, c):
    xs = [a, b, c]
    return xs[0], xs[-1] * 2, xs[1:], xs[:-1], xs[::2], xs[::-1]


@case(three)
def list_append_extend_pop_insert(a, b, c):
    xs = []
    xs.append(a)
    xs.extend([b, c])
    xs.insert(0, c * 2)
    last = xs.pop()
    first = xs.pop(0)
    xs.insert(1, last + first)
    return xs, len(xs)


@case(three)
def list_methods_misc(a, b, c):
    nums = [3, 1, 2, 5, 4]
    nums.sort()
    nums.reverse()
    nums.remove(5)
    i = nums.index(2)
    k = nums.count(1)
    cp = nums.copy()
    cp.clear()
    xs = [a, b]
    xs += [c]
    xs = xs * 2
    return xs, nums, i, k, cp


@case(three)
def list_setitem_delitem(a, b, c):
    xs = [a, b, c, a]
    xs[0] = c + 1
    xs[1:3] = [b * 2]
    del xs[-1]
    ys = [1, 2, 3, 4, 5]
    del ys[1:3]
    ys[::2] = [9, 9]
    return xs, ys


@case(lambda: ([torch.randn(3) for _ in range(4)],))
def list_input_iterate(xs):
    acc = torch.zeros(3)
    for x in xs:
        acc = acc + x
    return acc, len(xs)


@case(lambda: ([torch.randn(2, 2), torch.randn(2, 2)], [1.0, 2.0]))
def list_inputs_zip(ts, ws):
    return sum(w * t for t, w in zip(ts, ws))


@case(three)
def list_nested(a, b, c):
    grid = [[a, b], [c, a + b]]
    grid[1][0] = grid[0][1] * 3
    return grid, [row[0] for row in grid]


@case(three)
def list_comprehension(a, b, c):
    xs = [a, b, c]
    return [x * i for i, x in enumerate(xs)], [x for x in xs if x is not b]


@case(lambda: (torch.randn(5),))
def list_comprehension_nested_cond(x):
    return [x[i] * j for i in range(3) for j in range(2) if (i + j) % 2 == 0]


@case(three)
def list_compare_contains(a, b, c):
    xs = [1, 2, 3]
    ys = [1, 2, 3]
    return a * (xs == ys), 3 in xs, [1, 2] < [1, 3], xs is ys


@case(lambda: (torch.randn(4), [2, 3]))
def list_python_values_input(x, sizes):
    sizes = list(sizes)
    sizes.append(4)
    return x * sum(sizes), sizes


# ---- dicts -------------------------------------------------------------------------------

@case(three)
def dict_build_index(a, b, c):
    d = {"a": a, "b": b}
    d["c"] = c
    return d["a"] + d["c"], d, len(d), "b" in d, "z" not in d


@case(three)
def dict_methods(a, b, c):
    d = {"a": a}
    d.update({"b": b})
    d.update(c=c)
    v = d.get("a")
    w = d.get("zz", 3)
    s = d.setdefault("s", a * 0)
    s2 = d.setdefault("a", None)
    keys = list(d.keys())
    vals = list(d.values())
    return v * w + s + s2, keys, vals, list(d.items())[1]


@case(three)
def dict_pop_del_copy(a, b, c):
    d = {"a": a, "b": b, "c": c}
    x = d.pop("b")
    y = d.pop("nope", 7)
    del d["a"]
    e = d.copy()
    e["z"] = x
    return d, e, y


@case(three)
def dict_iterate(a, b, c):
    d = {"x": a, "y": b, "z": c}
    acc = 0
    names = []
    for k in d:
        names.append(k)
    for k, v in d.items():
        acc = acc + v * len(k)
    for v in d.values():
        acc = acc - v
    return acc, names


@case(three)
def dict_comprehension(a, b, c):
    d = {f"t{i}": t * i for i, t in enumerate([a, b, c])}
    inv = {v: k for k, v in {"one": 1, "two": 2}.items()}
    return d, inv


@case(lambda: ({"w": torch.randn(3), "b": torch.randn(3), "scale": 2.0},))
def dict_input(params):
    return params["w"] * params["scale"] + params["b"], sorted(params.keys())


@case(lambda: ({"x": torch.randn(2)}, ))
def dict_int_keys_and_tuple_keys(d):
    e = {1: d["x"], (2, "a"): d["x"] * 2}
    return e[1] + e[(2, "a")], list(e)


@case(three)
def dict_merge_operators(a, b, c):
    d1 = {"a": a, "b": b}
    d2 = {"b": c, "c": a}
    m = d1 | d2
    d1 |= {"z": c}
    return m, d1


@case(three)
def dict_constructor_forms(a, b, c):
    d1 = dict(a=a, b=b)
    d2 = dict([("x", c), ("y", a)])
    d3 = dict(zip(["p", "q"], [b, c]))
    d4 = dict(d1, extra=c)
    d5 = dict.fromkeys(["k1", "k2"], 0)
    return d1, d2, d3, d4, d5


# ---- sets --------------------------------------------------------------------------------

@case(lambda: (torch.randn(3),))
def set_ops_python(x):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    u = s | {9}
    i = s & {2, 3, 10}
    d = s - {4}
    return x * len(u), sorted(u), sorted(i), sorted(d), 3 in s


@case(lambda: (torch.randn(3),))
def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x + len(s), sorted(s), frozenset([1, 2]) == {1, 2}


@case(lambda: (torch.randn(3),))
def frozenset_has_no_set_mutators(x):
    # eager raises AttributeError for set-only methods on a frozenset: traced, it must too
    s = frozenset((1, 2, 3))
    try:
        s.add(4)
    except AttributeError:
        x = x + 10
    try:
        s.discard(1)
    except AttributeError:
        x = x + 100
    return x + len(s), hasattr(s, "update"), hasattr(s, "union")


# ---- slices ------------------------------------------------------------------------------

@case(lambda: (torch.randn(6, 5),))
def slice_objects(x):
    s = slice(1, 4)
    s2 = slice(None, None, 2)
    return x[s], x[s, s2], x[s][s2], s.start, s.stop


@case(lambda: (torch.randn(10),))
def slice_negative_steps(x):
    seq = list(range(10))
    return x[-3:], x[:-2], x[2:8:3], seq[::-1], seq[-4:-1], seq[8:2:-2]


@case(lambda: (torch.randn(6), 2, 5))
def slice_with_python_args(x, lo, hi):
    return x[lo:hi], x[lo:], x[:hi], list(range(10))[lo:hi]


# ---- generator expressions and friends --------------------------------------------------

@case(three)
def genexpr_into_sum(a, b, c):
    return sum(t * 2 for t in (a, b, c)), sum(i * i for i in range(5))


@case(three)
def genexpr_into_tuple_list(a, b, c):
    return tuple(t + 1 for t in [a, b, c]), list(x.sum() for x in (a, b))


@case(three)
def genexpr_any_all_max(a, b, c):
    xs = [1, 5, 3]
    return a * any(v > 4 for v in xs), all(v > 0 for v in xs), max(v * 2 for v in xs)


@case(three)
def comprehension_over_zip_enumerate(a, b, c):
    names = ["a", "b", "c"]
    return {n: t * i for i, (n, t) in enumerate(zip(names, [a, b, c]))}


@case(lambda: (torch.randn(2, 3),))
def comprehension_captures_outer(x):
    k = 3
    return [x * k + j for j in range(k)]


# ---- strings and f-strings ---------------------------------------------------------------

@case(three)
def fstring_dict_keys(a, b, c):
    out = {}
    for i, t in enumerate([a, b, c]):
        out[f"layer_{i}"] = t * i
    out[f"{'total'}_{len(out):02d}"] = a + b + c
    return out


@case(lambda: (torch.randn(3),))
def string_methods(x):
    name = "Encoder.Layer_1"
    parts = name.lower().split(".")
    r = (name.upper(), parts, name.startswith("Enc"), name.endswith("_1"), name.replace("_", "-"),
         "-".join(parts), name.strip("E1"), name.find("L"), "  pad ".strip(), "ab" * 2,
         name[:3], "x" in name.lower(), "{}:{}".format("k", 3), "%s=%d" % ("n", 4))
    return x * len(r[0]), r


@case(lambda: (torch.randn(3), "relu"))
def string_arg_dispatch(x, act):
    if act == "relu":
        return torch.relu(x), act.capitalize()
    return torch.tanh(x), act


@case(lambda: (torch.randn(3), 7))
def fstring_of_ints(x, n):
    key = f"n={n}, half={n / 2:.2f}, hex={n:x}, repr={'q'!r}"
    return x + n, key


@case(three)
def zip_strict_and_nested_unpack_in_for(a, b, c):
    out = []
    for (i, t), k in zip(enumerate([a, b]), ["p", "q"], strict=True):
        out.append((k, t * i))
    return out


@case(three)
def list_sort_with_key_and_index(a, b, c):
    xs = [c, a, b]
    order = sorted(range(len(xs)), key=lambda i: [2, 0, 1][i])
    return [xs[i] for i in order], [1, 5, 7].index(5)
