"""Pure-Python equivalents of C callables, traced in their place (as the frontend inlines any
Python function) so that what they do becomes part of the graph.

The modules here import nothing of ember: they are ordinary Python that runs the same eagerly as
the C original (each follows the equivalent code the Python documentation gives), so tracing them is
ordinary inlining. Which C callable each replaces is in the module's ``POLYFILLS`` table.
"""

import collections
import itertools
import sys
import types

import torch

from ember.frontend.polyfills import foreach as _foreach, iterators as _iterators


def _chain_from_iterable(iterables):
    for it in iterables:
        yield from it


def _intern(string):
    return string  # interning only changes which equal str object is shared: not a value


def _dict_fromkeys(cls, iterable, value=None):
    d = cls()
    for key in iterable:
        d[key] = value
    return d


# C callable -> the Python function traced in its place
C_FUNCTIONS = {
    itertools.chain.from_iterable: _chain_from_iterable,
    sys.intern: _intern,
    torch._C._group_tensors_by_device_and_dtype: _foreach.group_tensors_by_device_and_dtype,
}
# classes whose construction is traced through a Python equivalent (see make_itertool)
CLASSES = dict(_iterators.POLYFILLS)
# called for real while tracing when every argument is a constant, the result a constant: a class
# factory whose class the compiled code then holds (``namedtuple("P", "a b")`` in the function body)
FOLD_ON_CONSTANTS = {collections.namedtuple}


def python_equivalent(value):
    """``(function, leading arguments)`` to trace in place of the C callable ``value``, or None.
    ``fromkeys`` of a dict subclass (``defaultdict.fromkeys``, a user's subclass) is the subclass's
    constructor plus item assignment, which the frontend traces."""
    try:
        fn = C_FUNCTIONS.get(value)
    except TypeError:  # unhashable
        return None
    if fn is not None:
        return fn, ()
    if not isinstance(value, types.BuiltinMethodType):  # (a probe of any other value may run its __getattr__)
        return None
    owner = getattr(value, "__self__", None)
    if getattr(value, "__name__", None) == "fromkeys" and isinstance(owner, type) and issubclass(owner, dict) \
            and owner is not dict and getattr(owner, "fromkeys", None) == value:
        return _dict_fromkeys, (owner,)
    return None
