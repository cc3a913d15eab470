"""ember's decomposition tables answered op by op (``ember.aot.lazy_table``) give, for every op the
dispatcher knows, the answer of the same tables built whole the way ember built them before (torch's
``core_aten_decompositions()`` and ember's edits of it); a trace asks them without building them, and
the traced graphs are the ones the built tables give."""
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.aot import lazy_table, ops
from ember.aot.lazy_table import LazyTable, make_fx_lazy
from ember.config import config
from ember.native import decomp

from aot_helpers import Recorder

aten = torch.ops.aten


def _random(op) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def _built_tables() -> dict:
    """The tables as ember built them whole before they were lazy (its code then, spelled out)."""
    core = {**core_aten_decompositions(), **ops.FAST_VIEW_DECOMPOSITIONS}
    core_no_random = {op: fn for op, fn in core.items() if not _random(op)}
    native = dict(core)
    native.update(get_decompositions(decomp._EXTRA))
    for op in decomp._KEEP + decomp.ops.WHOLE:
        native.pop(op, None)
    native = {op: fn for op, fn in native.items() if not _random(op)}
    native_aot = {**native, **dict.fromkeys(decomp._KEEP + decomp.ops.WHOLE)}
    merged = {op: fn for op, fn in {**core_no_random, **native_aot}.items() if fn is not None}
    return dict(core_aten=core, core=core_no_random, default=core_no_random, native=native,
                native_aot=native_aot, merged_native_aot=merged)


def _fresh_tables(monkeypatch) -> dict:
    """ember's module-level tables replaced by new, unbuilt ones (other tests may have built them)."""
    monkeypatch.setattr(ops, "_CORE_ATEN", LazyTable("core_aten", ops._build_core_aten, ops._core_aten_lookup))
    monkeypatch.setattr(ops, "_CORE", LazyTable("aot.core", ops._build_core, ops._core_lookup))
    monkeypatch.setattr(decomp, "DECOMPOSITIONS", LazyTable("native", decomp._build, decomp._lookup))
    monkeypatch.setattr(decomp, "AOT_DECOMPOSITIONS", LazyTable(
        "native.aot", lambda: {**decomp.DECOMPOSITIONS, **dict.fromkeys(decomp._KEEP + decomp.ops.WHOLE)},
        decomp._aot_lookup))
    return dict(core_aten=ops._CORE_ATEN, core=ops._CORE, default=ops.decomposition_table(None),
                native=decomp.DECOMPOSITIONS, native_aot=decomp.AOT_DECOMPOSITIONS,
                merged_native_aot=ops.decomposition_table(decomp.AOT_DECOMPOSITIONS))


def _all_ops() -> list:
    """Every overload the dispatcher has registered, of every namespace."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        ns, _, rest = name.partition("::")
        packet_name, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(getattr(torch.ops, ns), packet_name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        found.append(op)
    return found


def _same(ours, theirs) -> bool:
    if ours is theirs:
        return True
    if isinstance(ours, functools.partial) and isinstance(theirs, functools.partial):
        # a composite kernel: torch makes its _special_op_to_decompose_cia per op, ember its own copy
        return (ours.func is lazy_table._composite_kernel and theirs.func.__name__ == "_special_op_to_decompose_cia"
                and ours.args == theirs.args == () and ours.keywords == theirs.keywords
                and set(ours.keywords) == {"kernel"})
    code = getattr(ours, "__code__", None)
    return code is not None and code is getattr(theirs, "__code__", None) and ours.__qualname__ == theirs.__qualname__


def test_every_op_gets_the_built_tables_answer(monkeypatch):
    lazy = _fresh_tables(monkeypatch)
    every = _all_ops()
    assert len(every) > 3000
    answers = {name: {op: t.resolve(op) for op in every} for name, t in lazy.items()}
    assert all(t._table is None for t in lazy.values()), "an op's lookup built a whole table"
    built = _built_tables()
    assert all(isinstance(op, torch._ops.OpOverload) for t in built.values() for op in t)
    for name, t in lazy.items():
        want = built[name]
        ops_ = set(every) | set(want)
        for op in set(want) - set(every):  # (none expected: every key is a registered op)
            answers[name][op] = t.resolve(op)
        got = answers[name]
        assert {op for op in ops_ if got[op] is not lazy_table.ABSENT} == set(want), name
        assert [op for op in want if not _same(got[op], want[op])] == [], name
        # the Mapping face: membership, item, get; iteration builds the table whole, as before
        op = aten.native_layer_norm.default
        assert (op in t) == (op in want) and t.get(op, "no") == want.get(op, "no")
    assert len(built["core_aten"]) > 800 and ops.is_random_op(aten.bernoulli.default)
    assert aten.bernoulli.default in lazy["core_aten"] and aten.bernoulli.default not in lazy["core"]
    for name, t in lazy.items():
        assert set(t) == set(built[name]), name


def test_a_composite_op_registered_after_the_first_lookup_stays_out(monkeypatch):
    """As the table built at the first lookup (the first trace) left out custom composite ops
    defined after it, so does the lazy one; those defined before are in (every-op test above)."""
    lazy = _fresh_tables(monkeypatch)
    assert aten.silu.default in lazy["core_aten"]
    lib = torch.library.Library("ember_lazy_table_test", "DEF")
    try:
        lib.define("comp(Tensor x) -> Tensor")
        lib.impl("comp", lambda x: x * 2, "CompositeImplicitAutograd")
        op = torch.ops.ember_lazy_table_test.comp.default
        assert op in core_aten_decompositions()  # (torch's table built now has it)
        assert op not in lazy["core_aten"] and op not in lazy["merged_native_aot"]
    finally:
        lib._destroy()


def test_preserved_composites_are_torchs():
    from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS
    assert lazy_table._core_state()[1] == set(PRESERVED_ATEN_CIA_OPS)


def _mlp_grad(x, w1, b1, w2):
    y = F.linear(F.gelu(F.linear(x, w1, b1)), w2).softmax(-1)
    loss = F.mse_loss(y, torch.zeros_like(y)) + F.layer_norm(x, (x.shape[-1],)).sum()
    return torch.autograd.grad(loss, (x, w1, b1, w2))


def test_a_trace_asks_the_table_without_building_it(monkeypatch):
    lazy = _fresh_tables(monkeypatch)
    args = [torch.randn(4, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True),
            torch.randn(16, requires_grad=True), torch.randn(8, 16, requires_grad=True)]
    gm = make_fx_lazy(_mlp_grad, lazy["merged_native_aot"])(*args)
    assert all(t._table is None for t in lazy.values())
    assert len(lazy["native"]._seen) > 10  # (it was asked)
    want = make_fx(_mlp_grad, decomposition_table=_built_tables()["merged_native_aot"])(*args)
    assert gm.code == want.code
    assert not any(n.target in (aten._softmax.default, aten.native_layer_norm.default) for n in gm.graph.nodes)


def _tracer_table(traced):
    code = traced.__code__
    return traced.__closure__[code.co_freevars.index("make_fx_tracer")].cell_contents.decomposition_table


def test_make_fx_defaults_stay_and_the_tables_entries_win():
    """make_fx adds sym_numel's decomposition where its table has none: so does the lazy table handed over."""
    from torch._decomp.decompositions import sym_numel
    mine = lambda x, *rest, **kwargs: aten.mul.Tensor(x, 2)  # noqa: E731
    without = LazyTable("t", lambda: {aten.add.Tensor: mine}, {aten.add.Tensor: mine}.get)
    with_it = LazyTable("t", lambda: {aten.sym_numel.default: mine}, {aten.sym_numel.default: mine}.get)
    for t in (without, with_it):
        t._lookup = functools.partial(lambda d, op: d.get(op, lazy_table.ABSENT), t._build())
    got = _tracer_table(make_fx_lazy(lambda x: x + 1, without))
    assert isinstance(got, LazyTable) and got[aten.sym_numel.default] is sym_numel and got[aten.add.Tensor] is mine
    assert aten.mul.Tensor not in got and without._table is None
    assert _tracer_table(make_fx_lazy(lambda x: x + 1, with_it))[aten.sym_numel.default] is mine
    whole = dict(_tracer_table(make_fx_lazy(lambda x: x, without)))  # (iterated: built whole)
    assert whole == {aten.add.Tensor: mine, aten.sym_numel.default: sym_numel}
    gm = make_fx_lazy(lambda x: x + 1, without)(torch.randn(3))
    assert "aten.add" not in gm.code and "aten.mul.Tensor" in gm.code


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, img, ids):
        h = F.interpolate(self.bn(self.conv(img)).relu(), scale_factor=2, mode="nearest")
        h = F.dropout(F.max_pool2d(h, 2), 0.1, self.training).flatten(1)[:, :16]
        q = self.ln(self.emb(ids)) + h[:, None, :]
        a = F.scaled_dot_product_attention(q[:, None], q[:, None], q[:, None], is_causal=True)[:, 0]
        logits = self.fc(F.gelu(a)) @ self.emb.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten()) + torch.einsum("bsd,bsd->", a, q).tanh()


def _graphs(monkeypatch, decompositions, table) -> list:
    """The forward and backward graphs ember traces for _Net and a softmax MLP: ``table`` None gives
    fresh lazy tables, else the built table (dict) stands for ember's."""
    with monkeypatch.context() as m:
        if table is not None:
            m.setattr(ember.aot, "decomposition_table", lambda extra: table)
        rec = Recorder(decompositions=decompositions)
    torch.manual_seed(0)
    net = _Net()
    img, ids = torch.randn(2, 3, 8, 8), torch.randint(0, 50, (2, 5))
    ember.compile(net, backend=rec)(img, ids).backward()
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8), nn.Softmax(-1))
    ember.compile(mlp, backend=rec)(torch.randn(4, 8)).sum().backward()
    with torch.no_grad():
        ember.compile(net.eval(), backend=rec)(img, ids)
    return [gm.code for gm in rec.fw_graphs + rec.bw_graphs]


@pytest.mark.parametrize("native", [False, True], ids=["aot_default", "native"])
def test_traced_graphs_equal_the_built_tables(monkeypatch, native):
    monkeypatch.setattr(config, "aot_cache", False)
    monkeypatch.setattr(config, "frontend_cache", False)
    built = _built_tables()
    old = _graphs(monkeypatch, None, built["merged_native_aot" if native else "default"])
    lazy = _fresh_tables(monkeypatch)
    new = _graphs(monkeypatch, lazy["native_aot"] if native else None, None)
    assert len(new) == len(old) == 5
    assert new == old
    assert all(t._table is None for t in lazy.values())
