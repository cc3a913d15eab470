"""Builtins: len, isinstance, range, enumerate, zip, reversed, min, max, abs, sum, any, all,
getattr, hasattr, setattr, type, constructors, sorted, map, filter, round, divmod, pow, iter/next."""
import collections
import inspect

import torch

from .harness import case


def three():
    return (torch.randn(4), torch.randn(4), torch.randn(4))


class Box:
    def __init__(self, v):
        self.v = v


class Empty:
    pass


PairNT = collections.namedtuple("PairNT", "a b")


@case(three)
def builtin_len(a, b, c):
    return a * len([a, b]) + len((1, 2, 3)) + len({"k": 1}) + len("abcd") + len(range(5)), len(a)


@case(lambda: (torch.randn(3), 2, 2.5, [1], (1,), {"a": 1}, None))
def builtin_isinstance(x, i, f, lst, tup, dct, none):
    r = (isinstance(x, torch.Tensor), isinstance(i, int), isinstance(f, (int, float)),
         isinstance(lst, list), isinstance(tup, tuple), isinstance(dct, dict), isinstance(none, type(None)),
         isinstance(True, int), isinstance(x, (list, tuple)), isinstance(i, bool),
         isinstance(x.shape, tuple), isinstance(x, object))
    return x * sum(r), r


@case(lambda: (torch.randn(3),))
def builtin_range(x):
    r = range(2, 11, 3)
    return x * len(r), list(r), r[1], r[-1], 5 in r, list(range(5))[::2], tuple(range(3, 0, -1))


@case(three)
def builtin_enumerate(a, b, c):
    out = []
    for i, t in enumerate([a, b, c]):
        out.append(t * i)
    for i, t in enumerate((a, b), start=10):
        out.append(t + i)
    return out, list(enumerate("ab"))


@case(three)
def builtin_zip(a, b, c):
    out = [x * y for x, y in zip([a, b], [c, a])]
    pairs = list(zip([1, 2, 3], "ab"))
    unzipped = list(zip(*[(1, "x"), (2, "y")]))
    return out, pairs, unzipped, dict(zip("ab", [b, c]))


@case(three)
def builtin_reversed(a, b, c):
    out = [t * i for i, t in enumerate(reversed([a, b, c]))]
    return out, list(reversed(range(4))), tuple(reversed((1, 2, 3)))


@case(lambda: (torch.randn(4), 3, 7.5))
def builtin_min_max(x, n, f):
    return (min(n, f), max(n, f), min([4, 2, 8]), max(1, 9, 3), max([1, 5], key=lambda v: -v),
            min((3, "a"), (1, "b")), x * max(n, 2), max(x.shape), min(x.size(0), 2))


@case(lambda: (torch.randn(4), torch.randn(4)))
def builtin_min_max_tensors(a, b):
    return torch.max(a, b), min(a.shape[0], 10), max(a, b, key=lambda t: t.shape[0]) is a


@case(lambda: (torch.randn(4), -3, -2.5))
def builtin_abs(x, n, f):
    return abs(x), abs(n), abs(f), abs(True), x * abs(n)


@case(three)
def builtin_sum(a, b, c):
    return sum([a, b, c]), sum([1, 2, 3]), sum((a, b), torch.zeros(4)), sum([0.5, 1.5], 10), sum(range(4))


@case(three)
def builtin_any_all(a, b, c):
    return a * any([False, True]), all([1, 2, 0]), any([]), all(()), any(x > 1 for x in [0, 2]), all([a is a, b is b])


@case(lambda: (torch.randn(4), Box(2.0)))
def builtin_getattr_hasattr(x, box):
    return (x * getattr(box, "v"), getattr(box, "missing", 5), hasattr(box, "v"), hasattr(box, "w"),
            getattr(x, "shape"), hasattr(x, "dtype"), getattr(torch, "relu")(x))


@case(lambda: (torch.randn(4),))
def builtin_setattr_new_object(x):
    b = Empty()
    setattr(b, "weight", x * 2)
    b.bias = x + 1
    setattr(b, "n", 3)
    b.n += 1
    return b.weight + b.bias, b.n, hasattr(b, "weight"), getattr(b, "bias")


@case(lambda: (torch.randn(4),))
def builtin_new_object_returned(x):
    b = Box(x * 3)
    b.extra = "tag"
    return b


@case(lambda: (torch.randn(4), 3, 2.0))
def builtin_type(x, n, f):
    r = (type(n) is int, type(f) == float, type(x) is torch.Tensor, type(n).__name__, type([]) is list,
         type(x).__name__)
    return x * type(f)(n), r


@case(lambda: (torch.randn(4), 3.7, "12", True))
def builtin_scalar_constructors(x, f, s, flag):
    r = (int(f), int(s), int(-2.9), float(s), float(3), bool(0), bool([1]), bool(flag), int(flag),
         str(12), float("inf"), int("ff", 16), complex(1, 2).real)
    return x * int(f) + float(flag), r


@case(three)
def builtin_container_constructors(a, b, c):
    t = tuple([a, b])
    lst = list((a, b, c))
    d = dict(k=a)
    s = set([1, 2, 2, 3])
    return t, lst, d, sorted(s), list("ab"), tuple(range(2)), list({"x": 1, "y": 2}), list(), dict(), tuple()


@case(three)
def builtin_sorted(a, b, c):
    ks = sorted([3, 1, 2])
    ks2 = sorted([3, 1, 2], reverse=True)
    by = sorted([("b", a), ("a", b), ("c", c)], key=lambda kv: kv[0])
    return ks, ks2, [v for _, v in by], sorted({"z": 1, "m": 2}), sorted("bca")


@case(three)
def builtin_map_filter(a, b, c):
    m = list(map(lambda t: t * 2, [a, b, c]))
    m2 = list(map(torch.add, [a, b], [c, c]))
    f = list(filter(lambda v: v % 2 == 0, range(7)))
    f2 = list(filter(None, [0, 1, 2, 0]))
    return m, m2, f, f2, tuple(map(str, [1, 2]))


@case(lambda: (torch.randn(4), 2.567, 7))
def builtin_round_divmod_pow(x, f, n):
    r = (round(f), round(f, 2), round(2.5), round(-1.5), round(n, -1), divmod(n, 3), divmod(7.5, 2),
         pow(n, 2), pow(2, -1), pow(n, 2, 5), pow(2.0, 0.5))
    return x * round(f, 1) + pow(n, 2), r


@case(lambda: (torch.randn(4),))
def builtin_round_pow_tensor(x):
    return torch.round(x), pow(x, 2), pow(2, x), pow(x.abs(), 0.5), abs(x)


@case(three)
def builtin_iter_next(a, b, c):
    it = iter([a, b, c])
    first = next(it)
    second = next(it)
    rest = list(it)
    d = next(iter({"k": 1}))
    e = next(iter([]), "default")
    return first + second, rest, d, e


@case(three)
def builtin_iter_zip_with_iterators(a, b, c):
    it = iter([a, b, c])
    pairs = list(zip(it, it))
    return pairs, next(it, None)


@case(lambda: (torch.randn(4),))
def builtin_callable_id_hash(x):
    return x * callable(len), callable(3), hash(3) == hash(3), hash("a") == hash("a"), callable(x.add)


@case(lambda: (torch.randn(4),))
def builtin_chr_ord_bin_hex(x):
    return x + ord("a"), chr(98), bin(5), hex(255), oct(8), repr(3), ascii("a"), format(3.14159, ".2f")


@case(lambda: (torch.randn(4), [3, 1, 2]))
def builtin_slice_and_sum_on_list_input(x, xs):
    return x * sum(xs[1:]), max(xs), min(xs), sorted(xs), len(xs), list(reversed(xs))


@case(lambda: (torch.randn(2, 3),))
def builtin_all_any_on_shapes(x):
    ok = all(s > 0 for s in x.shape)
    big = any(s > 2 for s in x.size())
    return x * ok + big, isinstance(x.shape, tuple), isinstance(x.shape, torch.Size)


@case(lambda: (torch.randn(4),))
def builtin_print_free_and_vars_of_object(x):
    b = Box(1)
    return x * vars(b)["v"], dict(vars(b))


@case(lambda: (torch.randn(4),))
def builtin_issubclass_super(x):
    return x + issubclass(bool, int), issubclass(torch.nn.Linear, torch.nn.Module), issubclass(Box, object)


@case(lambda: (torch.randn(4),))
def builtin_min_max_default_key(x):
    return x * max([], default=2), min([5, 3], key=lambda v: v % 3), max({"a": 3, "b": 1}, key=lambda k: k)


@case(lambda: (torch.randn(4),))
def builtin_isinstance_user_types(x):
    p = PairNT(x, 2)
    return x * isinstance(p, tuple), isinstance(p, PairNT), isinstance(Box(1), Box), isinstance(Empty(), Box), p


class _Processor:  # diffusers' attention processors: Attention.forward reads their call signature
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, scale: float = 1.0):
        return hidden_states


@case(lambda: (torch.randn(4),), kwargs=lambda: {"kw": {"scale": 2.0, "other": 1}})
def builtin_signature_parameters_mapping(x, kw):
    params = inspect.signature(_Processor().__call__).parameters  # a mappingproxy made while tracing
    names = set(params.keys())
    unused = [k for k, _ in kw.items() if k not in names]
    defaults = [p.default for p in params.values() if p.default is not inspect.Parameter.empty]
    kinds = [name for name, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    return x * len(names) + len(params), unused, defaults, kinds, "scale" in params, params.get("missing", 3)
