"""Decomposition tables answered one op at a time (``LazyTable``), torch's core ATen table answered that
way (``core_aten_lookup``), and make_fx handed such a table without copying it (``make_fx_lazy``).

torch builds its core ATen table (``torch._decomp.core_aten_decompositions()``) by listing every
CompositeImplicitAutograd op the dispatcher knows and checking each one: 0.1-0.35 s of the first
trace of every cold process (0.22-0.33 s of a one-kernel function's cold compile on the H100), for a
trace that asks the table about a few dozen ops. A ``LazyTable`` answers ``op in t``, ``t[op]`` and
``t.get(op)`` for the ops asked about, from a per-op rule giving the full table's answer, and builds
the full table (torch's way, as before) only when iterated: ``len``, ``items()``, ``dict(t)``.
(``tests/aot/test_lazy_table.py`` checks every op's answer against the full tables, and traced graphs.)
"""
from __future__ import annotations

import collections.abc
import functools
import threading

import torch

ABSENT = object()   # a lookup's answer for an op the table does not hold
_UNSEEN = object()
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd


class LazyTable(collections.abc.Mapping):
    """A decomposition table built at its first iteration; single ops are answered before that by
    ``lookup(op) -> function | ABSENT`` (remembered), which must give the built table's answer.
    Without a ``lookup``, the first use of any kind builds it.

    ``ember_key`` names the table in the autograd layer's cache key: a warm process, whose traced
    graphs come from that cache, needs the table for nothing else (its contents follow from ember's
    sources and torch's version, both in the key)."""

    def __init__(self, ember_key: str, build, lookup=None):
        self.ember_key = ember_key
        self._build = build
        self._lookup = lookup
        self._table = None
        self._seen: dict = {}
        self._lock = threading.Lock()

    def _get(self) -> dict:
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    self._table = self._build()
                table = self._table
        return table

    def resolve(self, op):
        """``op``'s entry, or ``ABSENT``."""
        table = self._table
        if table is not None:
            return table.get(op, ABSENT)
        got = self._seen.get(op, _UNSEEN)
        if got is _UNSEEN:
            got = self._lookup(op) if self._lookup is not None else self._get().get(op, ABSENT)
            self._seen[op] = got  # (two threads may both look an op up: equal answers)
        return got

    def __getitem__(self, op):
        got = self.resolve(op)
        if got is ABSENT:
            raise KeyError(op)
        return got

    def __contains__(self, op) -> bool:
        return self.resolve(op) is not ABSENT

    def __bool__(self) -> bool:
        # make_fx's proxy mode takes ``table or {}``: without this, len() would build the table.
        # (ember's tables are never empty.)
        return True if self._lookup is not None else bool(self._get())

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def with_defaults(self, defaults: dict) -> LazyTable:
        """This table, plus ``defaults``' entries for ops it lacks (``dict.setdefault`` of each)."""
        def lookup(op):
            got = self.resolve(op)
            return defaults.get(op, ABSENT) if got is ABSENT else got
        return LazyTable(self.ember_key, lambda: {**defaults, **self._get()}, lookup)

    def __repr__(self) -> str:
        return f"<ember decomposition table {self.ember_key}{' (not built yet)' if self._table is None else ''}>"


# ------------------------------------------------------------------------------- torch's core ATen table

# torch.export.decomp_utils.PRESERVED_ATEN_CIA_OPS, by name: composite ops torch's core table leaves
# whole (tests/aot/test_lazy_table.py checks the copy against torch's set)
_PRESERVED = ("upsample_bilinear2d.vec", "upsample_nearest2d.vec", "silu_backward.default",
              "mish_backward.default", "_fused_rms_norm.default")


@functools.lru_cache(maxsize=1)
def _core_state():
    """What torch's table is built from, read at the first lookup, when torch's build would run: its
    explicit decompositions (3 ms), the ops it keeps whole, and the dispatcher's composite ops by name
    (torch lists other namespaces' composite ops when building its table; one registered later is
    not in it)."""
    from torch._decomp import _core_aten_decompositions_post_autograd
    preserved = set()
    for name in _PRESERVED:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        if op is not None:
            preserved.add(op)
    composite = frozenset(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
    return _core_aten_decompositions_post_autograd(), preserved, composite


def core_aten_lookup_supported() -> bool:
    """Has this torch the pieces ``core_aten_lookup`` reads? (Otherwise tables are built whole.)"""
    import torch._decomp as decomp
    from torch._subclasses.functional_tensor import FunctionalTensor
    return (hasattr(decomp, "_core_aten_decompositions_post_autograd") and hasattr(FunctionalTensor, "metadata_fns")
            and hasattr(decomp, "_should_decompose_because_unsafe_op"))


def core_aten_lookup(op):
    """``torch._decomp.core_aten_decompositions()``'s entry for ``op`` (or ``ABSENT``), without building
    it. That table (torch/export/decomp_utils.py ``CustomDecompTable``) is torch's explicit core ATen
    decompositions, then every functional CompositeImplicitAutograd op (``_is_preservable_cia_op``)
    that has none, mapped to its composite kernel: of the aten namespace less ``PRESERVED_ATEN_CIA_OPS``,
    and of the other namespaces."""
    registry, preserved, composite = _core_state()
    fn = registry.get(op, ABSENT)
    if fn is not ABSENT or not isinstance(op, torch._ops.OpOverload):
        return fn
    name = op.name()
    if name.split("::")[0] == "aten":
        if op in preserved:
            return ABSENT
    elif name not in composite and _CIA not in op.py_kernels:
        return ABSENT
    if not _functional_composite(op):
        return ABSENT
    kernel = op.py_kernels.get(_CIA)
    if kernel is not None and not isinstance(kernel, torch._C.DispatchKey):
        return kernel  # a composite kernel written in Python (upsample_nearest*)
    return functools.partial(_composite_kernel, kernel=op)


def _functional_composite(op) -> bool:
    """torch's ``_is_preservable_cia_op`` (its export utilities): a CompositeImplicitAutograd op that
    neither mutates nor aliases, and is no metadata query."""
    from torch._decomp import _should_decompose_because_unsafe_op
    from torch._subclasses.functional_tensor import FunctionalTensor
    if _should_decompose_because_unsafe_op(op) or op in FunctionalTensor.metadata_fns:
        return False
    schema = getattr(op, "_schema", None)
    if schema is None or schema.is_mutable or any(a.alias_info is not None for a in schema.arguments):
        return False
    name = op.name()
    if not torch._C._dispatch_has_kernel(name):
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, _CIA) or _CIA in op.py_kernels


def _composite_kernel(*args, kernel, **kwargs):
    """The op's C++ CompositeImplicitAutograd kernel (torch's ``_special_op_to_decompose_cia``)."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(kernel.name(), _CIA):
        return kernel._op_dk(_CIA, *args, **kwargs)
    raise AssertionError(f"Expected {kernel} to have CompositeImplicitAutograd kernel")


# ------------------------------------------------------------------------------------------------ make_fx

def make_fx_lazy(fn, table, **kwargs):
    """``make_fx(fn, decomposition_table=table, **kwargs)``, a ``LazyTable`` asked op by op rather than
    copied. make_fx copies its table into a dict (reading every key: the whole table built) and adds
    default entries (``sym_numel``'s) where the table has none; its tracer is given the table with
    those defaults instead (``with_defaults``). Should make_fx be built otherwise (another torch), the
    table is copied as before. A nested trace (a higher-order op's subgraph) copies it all the same."""
    from torch.fx.experimental.proxy_tensor import make_fx
    if not isinstance(table, LazyTable):
        return make_fx(fn, decomposition_table=table, **kwargs)
    traced = make_fx(fn, decomposition_table=None, **kwargs)
    code, cells = getattr(traced, "__code__", None), getattr(traced, "__closure__", None) or ()
    names = code.co_freevars if code is not None else ()
    tracer = cells[names.index("make_fx_tracer")].cell_contents if "make_fx_tracer" in names else None
    defaults = getattr(tracer, "decomposition_table", None)
    if type(defaults) is not dict:
        return make_fx(fn, decomposition_table=table, **kwargs)
    tracer.decomposition_table = table.with_defaults(defaults)
    return traced
