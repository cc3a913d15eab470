"""The build table (``VariableTracker.build`` / ``.const``) and the per-class method tables.

Which tracker a value gets is decided by its type's MRO through the table each tracker module fills;
these tests pin the family of decisions the old isinstance ladder made (exact-type entries, user
subclasses, values decided before their type) and check the traced results against eager Python.
"""
import collections
import enum
import functools
import math
import types

import pytest
import torch

import ember
from ember.frontend.errors import Unsupported
from ember.frontend.variables import base, functions, iterators, objects, sequences, sets
from ember.frontend.variables.base import ConstantVariable, VariableTracker, find_method, trackers
from ember.frontend.variables.dicts import DictVariable


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


class MyList(list):
    pass


Point = collections.namedtuple("Point", "x y")


def plain(x):
    return x


@pytest.mark.parametrize("value, kind", [
    (3, ConstantVariable), (2.5, ConstantVariable), (True, ConstantVariable), (None, ConstantVariable),
    (Color.RED, ConstantVariable), (MyStr("s"), ConstantVariable), (range(3), ConstantVariable),
    (torch.float32, ConstantVariable), (torch.Size([2, 3]), ConstantVariable), (slice(1, 2), ConstantVariable),
    ((1, "a"), ConstantVariable), ((1, [2]), sequences.TupleVariable), ([1, 2], sequences.ListVariable),
    (Point(1, 2), sequences.NamedTupleVariable), ({"a": 1}, DictVariable), ({1, 2}, sets.SetVariable),
    (frozenset({1}), sets.SetVariable), (plain, functions.UserFunctionVariable), (len, functions.BuiltinVariable),
    (math.sqrt, functions.BuiltinVariable), (functools.partial(plain, 1), functions.PartialVariable),
    (staticmethod(plain), functions.UserFunctionVariable), (Point, objects.UserClassVariable),
    (types, objects.PythonModuleVariable), (torch.ops.aten.add.Tensor, functions.TorchFunctionVariable),
    (torch.finfo(torch.float32), objects.OpaqueObjectVariable),
    # made while tracing by code ember does not trace: opaque, as before the table
    (MyList([1]), objects.OpaqueObjectVariable), (collections.OrderedDict(a=1), objects.OpaqueObjectVariable),
    (torch.ones(1), objects.OpaqueObjectVariable), (object(), objects.OpaqueObjectVariable),
])
def test_const_picks_the_tracker_by_type(value, kind):
    assert type(VariableTracker.const(value)) is kind


def test_a_module_made_in_the_trace_is_refused():
    with pytest.raises(Unsupported, match="created inside the compiled function"):
        VariableTracker.const(torch.nn.Linear(1, 1))


def test_build_object_skips_constants_and_containers():
    assert type(VariableTracker.build_object(None, [1, 2])) is objects.OpaqueObjectVariable
    assert type(VariableTracker.build_object(None, KeyError)) is objects.UserClassVariable


def test_exact_entries_do_not_take_subclasses():
    seen = []

    class Base:
        pass

    class Derived(Base):
        pass

    base.register_builder(Base, exact=True, kind="object")(lambda tx, v, s: seen.append(v) or ConstantVariable(1))
    try:
        VariableTracker.const(Base())
        assert len(seen) == 1 and type(VariableTracker.const(Derived())) is objects.OpaqueObjectVariable
    finally:
        del base._OBJECT_TYPES[Base]
        base._PLAN.clear()


def test_registries_name_the_fix():
    assert trackers.ListVariable is sequences.ListVariable
    with pytest.raises(AttributeError, match="import the module that defines it"):
        trackers.NoSuchVariable


def test_method_tables_extend_along_the_mro():
    from ember.frontend.variables.deques import DequeVariable

    assert find_method(DequeVariable, "appendleft").mutates
    assert find_method(DequeVariable, "pop") is find_method(sequences.ListVariable, "pop")  # inherited
    assert find_method(DequeVariable, "copy") is not find_method(sequences.ListVariable, "copy")  # overridden
    assert find_method(iterators.ListIteratorVariable, "__next__") is not None
    assert find_method(sequences.TupleVariable, "append") is None


# -- end to end, against eager: values read from the frame go through the same table, guarded --

class Flag(enum.Enum):
    ON = "on"


class Meters(float):
    pass


def read_inputs(x, n, s, nt, od, dd, st, fl, m, r):
    out = x * n + len(s) + nt.y + od["a"] + dd["k"] + len(st) + (1 if fl is Flag.ON else 0) + m + sum(r)
    dd["new"].append(1)  # a defaultdict's factory runs on a missing key
    return out, sorted(st), list(od), type(m).__name__


def test_inputs_of_every_kind_match_eager():
    def args():
        dd = collections.defaultdict(list, k=3)
        return (torch.ones(3), 2, "abc", Point(1, 2), collections.OrderedDict(a=4, b=5), dd, {3, 1, 2}, Flag.ON,
                Meters(1.5), range(4))

    ref_args, got_args = args(), args()
    ref = read_inputs(*ref_args)
    got = ember.compile(read_inputs, backend="eager")(*got_args)
    torch.testing.assert_close(got[0], ref[0])
    assert got[1:] == ref[1:]
    assert got_args[5] == ref_args[5]  # the defaultdict's new key is replayed on the caller's object


def list_and_dict_methods(x, lst, d):
    lst.append(x)
    lst.extend([x + 1, x + 2])
    lst.insert(0, x * 0)
    last = lst.pop()
    lst.reverse()
    d.update(z=x)
    d.setdefault("w", x + 3)
    d.move_to_end("a") if hasattr(d, "move_to_end") else None
    q = collections.deque([1, 2, 3], maxlen=3)
    q.appendleft(0)
    q.rotate(1)
    s = {1, 2}
    s.add(3)
    s.discard(1)
    return last + len(lst) + len(q) + q.popleft(), list(q), sorted(s), list(d)


@pytest.mark.parametrize("dict_type", [dict, collections.OrderedDict])
def test_methods_dispatched_by_table_match_eager(dict_type):
    ref_lst, got_lst = [1.0], [1.0]
    ref_d, got_d = dict_type(a=1), dict_type(a=1)
    x = torch.ones(2)
    ref = list_and_dict_methods(x, ref_lst, ref_d)
    got = ember.compile(list_and_dict_methods, backend="eager")(x, got_lst, got_d)
    torch.testing.assert_close(got[0], ref[0])
    assert got[1:] == ref[1:]
    assert len(got_lst) == len(ref_lst) and list(got_d) == list(ref_d)  # mutations reach the caller's objects
