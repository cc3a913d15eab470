"""Python's data model under tracing: identity of objects made in the trace, ``is``/``==``/hash of
user objects, dict views, lazy iterators (one item pulled at a time), container types and their
subclasses surviving reconstruction. Every case is compared against eager Python."""
import collections
import itertools
from typing import NamedTuple

import torch

from .harness import case


def one():
    return (torch.randn(3),)


class Plain:
    pass


class ByValue:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, ByValue) and self.v == other.v

    __hash__ = None


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


class NoneAttr:
    flag = None  # a class attribute whose value is None is an attribute all the same


class BuiltInTrace(torch.nn.Module):
    def forward(self, x):
        return x * 2


# ---- class attributes whose value is None ------------------------------------------------------

@case(lambda: (torch.randn(3), NoneAttr()))
def class_attribute_none_is_present(x, obj):
    fresh = NoneAttr()
    return (x + 1 if hasattr(obj, "flag") else x - 1), obj.flag, hasattr(fresh, "flag"), fresh.flag


@case(one)
def call_module_built_in_the_trace(x):
    # nn.Module._wrapped_call_impl reads the class attribute `_compiled_call_impl = None`
    return BuiltInTrace()(x) + 1


# ---- identity of objects made in the trace -----------------------------------------------------
@case(one)
def fresh_objects_are_distinct(x):
    a, b = Plain(), Plain()
    c = a
    return x + 1, a is b, a == b, a != b, a is c, a == c, [a] == [b], [a] == [c]


@case(one)
def fresh_objects_as_keys_and_members(x):
    a, b = Plain(), Plain()
    d = {a: x, b: x * 2}
    s = {a, b, a}
    return d[a], d[b], len(d), len(s), a in s, Plain() in s


@case(one)
def user_eq_decides_equality_not_identity(x):
    p, q = ByValue(1), ByValue(1)
    return x + 1, p == q, p != q, p is q, p == ByValue(2), [p] == [q]


@case(one)
def fresh_tuples_and_namedtuples(x):
    t, u = (x, 1), (x, 1)
    n, m = Pair(x, 1), Pair(x, 1)
    d = {n: 1, m: 2}
    return x + 1, t is u, t == u, tuple(t) is t, n is m, n == m, len(d), d[n]


@case(one)
def fresh_functions_are_distinct(x):
    f, g = (lambda v: v), (lambda v: v)
    return f(x) + 1, f is g, f == g, f is f


# ---- graph input names that are Python's or the GraphModule's own ------------------------------
def two():
    return (torch.randn(3), torch.randn(3))


@case(two)
def first_parameter_named_self(self, x):
    return self * 2 + x


@case(two)
def parameters_named_like_builtins(input, getattr):
    return input.sin() + getattr.shape[0] + input.size(0)


@case(two)
def parameter_named_like_fx_globals(inf, device):
    return inf * 2 + device


def big():
    return (torch.randn(4).abs() * 10 + 5,)


@case(big, breaks="data")
def norm_after_data_dependent_while(x):
    # the loop breaks the graph on its condition; Tensor.norm (whose first parameter is ``self``)
    # is then compiled as a frame of its own
    while x.sum() > 1:
        x = x / (x.norm() + 0.5)
    return x


# ---- iterators are pulled one item at a time -----------------------------------------------------
@case(one)
def zip_stops_pulling_a_map(x):
    calls = []

    def f(v):
        calls.append(v)
        return x * v
    out = [a + b for a, b in zip([x, x], map(f, [1, 2, 3, 4]))]
    return out, calls


@case(one)
def zip_pulls_left_to_right_and_stops_at_first_exhausted(x):
    calls = []

    def f(tag):
        def g(v):
            calls.append((tag, v))
            return v
        return g
    pairs = list(zip(map(f("a"), [1, 2, 3]), map(f("b"), [1, 2])))
    return x + len(pairs), calls


@case(one)
def extend_from_a_map_that_reads_the_list(x):
    lst = [x]
    lst.extend(map(lambda v: v + len(lst), [1, 2, 3]))
    return lst


@case(one)
def deque_extend_and_extendleft_from_a_map(x):
    d = collections.deque([1])
    d.extendleft(map(lambda v: v + len(d), [1, 2, 3]))
    d.extend(map(lambda v: v * len(d), [1, 2]))
    return x + 1, list(d)


@case(one)
def dict_and_set_update_from_lazy_sources(x):
    d = {"k": 0}
    d.update(map(lambda k: (k, len(d)), ["a", "b", "c"]))
    s = {0}
    s.update(map(lambda v: v + len(s), [10, 20]))
    return x + 1, d, sorted(s)


@case(one)
def filter_and_enumerate_are_lazy(x):
    seen = []

    def keep(v):
        seen.append(v)
        return v % 2 == 0
    it = enumerate(filter(keep, range(10)), start=5)
    first = next(it)
    second = next(it)
    return x + first[0] + second[1], list(seen)


@case(one)
def any_all_short_circuit(x):
    seen = []

    def look(v):
        seen.append(v)
        return v > 2
    return x + 1, any(map(look, [1, 3, 5, 7])), all(map(look, [3, 1, 9])), seen


@case(one)
def next_interleaved_with_a_loop(x):
    log = []
    it = map(lambda v: log.append(v) or v, [1, 2, 3, 4, 5])
    acc = x
    for v in it:
        acc = acc + v
        if v == 2:
            acc = acc * next(it)
    return acc, log


@case(one)
def in_consumes_an_iterator_up_to_the_match(x):
    it = iter([1, 2, 3, 4])
    found = 2 in it
    return x + 1, found, list(it)


@case(one)
def constructors_from_a_map_with_side_effects(x):
    log = []

    def f(v):
        log.append(v)
        return v
    return x + 1, list(map(f, [1, 2])), tuple(map(f, [3])), set(map(f, [4])), dict(map(lambda v: (f(v), v), [5])), log


@case(one)
def list_iterator_sees_appends(x):
    lst = [1, 2]
    out = x
    for v in lst:
        out = out + v
        if v < 3:
            lst.append(v + 2)
    return out, lst


# ---- container types survive (copies, maxlen, subclasses) ------------------------------------------
@case(one)
def deque_copy_keeps_type_and_maxlen(x):
    d = collections.deque([1, 2], maxlen=3)
    e = d.copy()
    e.extend([3, 4])
    f = collections.deque(maxlen=2)
    f.append(x)
    f.appendleft(x * 2)
    f.appendleft(x * 3)
    import copy
    g = copy.copy(d)
    return e, type(e) is collections.deque, e.maxlen, d, list(f), g.maxlen, f[0] + f[1]


@case(one)
def deque_maxlen_extendleft_and_zero(x):
    d = collections.deque(range(5), 3)
    d.extendleft([10, 11])
    z = collections.deque([1, 2], maxlen=0)
    z.append(3)
    return x + 1, list(d), len(z), d.maxlen


class TaggedPair(Pair):
    pass


@case(one)
def namedtuple_subclass_attributes_survive(x):
    p = TaggedPair(x * 2, 3)
    p.tag = "hi"
    p.extra = x + 1
    return p, p.tag, p.extra * p.b


def tagged_input():
    p = TaggedPair(torch.randn(3), 2)
    p.scale = 4
    return (p,)


@case(tagged_input)
def namedtuple_subclass_input_attributes_are_read(p):
    return p.a * p.scale + p.b


@case(one)
def copy_of_a_namedtuple_is_a_new_object(x):
    import copy
    p = TaggedPair(x, 1)
    p.tag = "t"
    q = copy.copy(p)
    return x + 1, q is p, q == p, q.tag, type(q) is TaggedPair


def defaultdict_input():
    d = collections.defaultdict(list)
    d["a"].append(torch.randn(3))
    return (d,)


@case(defaultdict_input)
def defaultdict_input_calls_its_factory(d):
    d["b"].append(d["a"][0] * 2)
    return len(d["c"]), d["b"][0] + 1, d.default_factory is list


@case(one)
def ordered_and_default_dicts_keep_type(x):
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    od.move_to_end("b")
    dd = collections.defaultdict(int)
    dd["k"] += 3
    od2 = od.copy()
    return x + 1, od, dd, od2, type(od2) is collections.OrderedDict, list(od.keys())


# ---- dict views -----------------------------------------------------------------------------------
@case(one)
def keys_views_compare_as_sets(x):
    d1, d2 = {"a": 1, "b": 2}, {"b": 3, "a": 4}
    return (x + 1, d1.keys() == d2.keys(), d1.keys() != d2.keys(), d1.keys() == {"a", "b"},
            {"b", "a"} == d1.keys(), d1.keys() == ["a", "b"], d1.keys() <= {"a", "b", "c"}, d1.keys() < d2.keys())


@case(one)
def keys_view_set_algebra(x):
    d = {"a": x, "b": x * 2, "c": 3}
    ks = d.keys()
    return (sorted(ks & {"a", "z"}), sorted(ks | {"z"}), sorted(ks - {"a"}), sorted(ks ^ {"a", "q"}),
            sorted({"b", "y"} & ks), ks.isdisjoint({"q"}), d["a"] + d["b"])


@case(one)
def items_and_values_views(x):
    d1, d2 = {"a": 1, "b": 2}, {"b": 2, "a": 1}
    v = d1.values()
    return (x + 1, d1.items() == d2.items(), d1.items() == {("a", 1), ("b", 2)}, ("a", 1) in d1.items(),
            ("a", 2) in d1.items(), 2 in d1.values(), v == v, d1.values() == d2.values(),
            sorted(d1.items() & {("a", 1), ("c", 3)}))


@case(one)
def views_are_live_len_reversed_in(x):
    d = {"a": x, "b": x * 2}
    ks, vs, its = d.keys(), d.values(), d.items()
    d["c"] = x * 3
    del d["a"]
    out = x
    for v in vs:
        out = out + v
    return (out, len(ks), len(vs), len(its), list(reversed(ks)), "c" in ks, "a" in ks, list(ks),
            [k for k, _ in reversed(its)], bool(ks))


# ---- generators run up to each yield when pulled -----------------------------------------------------
@case(one)
def zip_of_generators_interleaves(x):
    log = []

    def gen(tag, n):
        for i in range(n):
            log.append((tag, i))
            yield x * i
    out = [a + b for a, b in zip(gen("a", 3), gen("b", 2))]
    return out, log


@case(one)
def generator_reads_state_the_consumer_changes(x):
    lst = []

    def sizes():
        while len(lst) < 3:
            yield len(lst)
    for n in sizes():
        lst.append(x * n)
    return lst


@case(one)
def next_on_generators_and_yield_from(x):
    log = []

    def inner():
        log.append("inner start")
        yield x
        log.append("inner end")
        yield x * 2

    def outer():
        yield from inner()
        log.append("outer end")
    g = outer()
    a = next(g)
    log.append("between")
    rest = list(g)
    return a, rest, log


@case(one)
def any_stops_a_generator(x):
    log = []

    def flags():
        for i in range(5):
            log.append(i)
            yield i >= 2
    return x + 1, any(flags()), log


# ---- builtin-container subclasses made in the trace: a clear break, never a plain list/dict --------
class TaggedList(list):
    pass


class TaggedDict(dict):
    pass


@case(one, breaks="creating an instance of TaggedList")
def list_subclass_with_attributes(x):
    lst = TaggedList([x])
    lst.tag = 1
    return lst, lst.tag, type(lst) is TaggedList


@case(one)  # a plain dict subclass is modelled since issue 26 (it was a break)
def dict_subclass_with_attributes(x):
    d = TaggedDict(a=x)
    d.tag = 2
    return d, d.tag


class NeverEqual:
    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def m(self):
        return 1


@case(one)
def containers_compare_identity_first(x):
    a = NeverEqual()
    lst = [a, x]
    return x + 1, a == a, a in lst, [a] == [a], lst.index(a), lst.count(a), (a,) == (a,)


@case(one)
def bound_methods_compare_by_function_and_self(x):
    a, b = NeverEqual(), NeverEqual()
    return x + a.m(), a.m == a.m, a.m != a.m, a.m == b.m, a.m is a.m


@case(one)
def defaultdict_copy_and_merge_keep_factory(x):
    dd = collections.defaultdict(list)
    dd["a"].append(1)
    c = dd.copy()
    c["b"].append(2)
    m = dd | {"z": [3]}
    m["q"].append(4)
    return x + 1, c, m, c.default_factory is list


# ---- sets iterate in CPython's order; dicts refuse to change while iterated -------------------------
@case(one)
def set_iteration_follows_cpython_order(x):
    s = {"b", "a", "c", "zz", "q", "k", "m", "n", "p"}
    ints = set()
    for v in [9, 1, 17, 33, 2, 40, 8]:
        ints.add(v)
    ints.discard(1)
    ints.add(25)
    u = s | {"new"}
    return x + 1, list(s), list(ints), [v for v in set([64, 8, 1, 16])], list(u), list(s.copy()), list(frozenset(ints))



class Point:
    """Hashes and compares by value: as a key its hash would run user code on trace-made state."""

    def __init__(self, a):
        self.a = a

    def __eq__(self, other):
        return isinstance(other, Point) and self.a == other.a

    def __hash__(self):
        return hash(self.a)


@case(one, breaks="as a dict key or set member")
def value_hashed_objects_as_keys(x):
    d = {Point(1): x, Point(2): x * 2}
    return d[Point(1)] + d[Point(2)], len({Point(1), Point(1)})


# ---- itertools.chain / islice pull lazily -------------------------------------------------------------
@case(one)
def islice_pulls_only_what_it_yields(x):
    log = []
    m = map(lambda v: log.append(v) or x * v, range(10))
    head = list(itertools.islice(m, 2))
    mid = list(itertools.islice(m, 1, 5, 2))
    return head, mid, list(log), next(m)


@case(one)
def chain_takes_each_iterator_when_reached(x):
    log = []
    a = [x]
    c = itertools.chain(a, map(lambda v: log.append(v) or v * x, [1, 2]))
    first = next(c)
    a.append(x * 5)  # the list iterator is live: the chain sees the appended item
    return first, list(c), log
