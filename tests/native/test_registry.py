"""The op registry (ember/native/ops.py) drives these tests, so an op added there is tested here
without further edits: every registry op must be exercised, by a case of optable.py or by the
samples its entry declares, and every sample runs on every renderer against eager (today the
Triton renderer; on CPU in the interpreter)."""
import functools
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton")

from ember.native import DECOMPOSITIONS, compile_aten_graph, ir, ops  # noqa: E402
from ember.native.backend import DEFAULT_OPTIONS, plan  # noqa: E402
from tests.native.harness import DEVICE, compare, guarded, padded  # noqa: E402
from tests.native.optable import OPS as CASES  # noqa: E402

SHAPE = (13, 37)  # odd sizes: mask tails
# samples trace with the registry's ATen ops kept whole, so the registry's own lowering of an op
# runs even where the default table decomposes it (rsub, floor_divide, clamp_min...), and before
# dispatch, where ops with only a composite kernel (isfinite) are still one call
SAMPLE_DECOMPOSITIONS = {k: v for k, v in DECOMPOSITIONS.items() if k not in ops.ATEN}


def make_inputs(sample, dtype):
    out = []
    for spec in sample.inputs:
        if spec == "randn":
            out.append(torch.randn(SHAPE, device=DEVICE).to(dtype))
        elif spec in ("prob", "prob_nan"):
            t = torch.rand(SHAPE, device=DEVICE) * 0.98 + 0.01
            if spec == "prob_nan":
                t.view(-1)[::5] = float("nan")
            out.append(t.to(dtype))
        elif spec == "pos":
            out.append((torch.rand(SHAPE, device=DEVICE) * 3 + 0.1).to(dtype))
        elif spec == "int":
            out.append(torch.randint(-9, 9, SHAPE, device=DEVICE))
        elif spec == "bool":
            out.append(torch.rand(SHAPE, device=DEVICE) > 0.5)
        else:
            out.append(spec)  # a Python value
    return out


def trace(fn, inputs, decompositions):
    def flat(*args):
        return fn(*args)
    pre_dispatch = decompositions is SAMPLE_DECOMPOSITIONS
    return make_fx(flat, decomposition_table=decompositions, pre_dispatch=pre_dispatch)(*inputs)


SAMPLES = [(op, s, dt) for op in ops.REGISTRY for s in op.samples for dt in s.dtypes]


def _ir_ops(gm, inputs) -> set:
    g, _, _, _ = plan(gm, inputs, dict(DEFAULT_OPTIONS))
    return {e.op for n in g.nodes if isinstance(n, ir.ComputedNode) for e in ir.walk([n.body])}


@functools.lru_cache(maxsize=None)
def exercised():
    """(ATen targets, IR ops) that the op-table cases and the registry's samples lower."""
    targets, ir_ops = set(), set()
    graphs = []
    for case in CASES:
        torch.manual_seed(0)
        inputs = case.make(case.dtypes[0], DEVICE)
        graphs.append((trace(case.fn, inputs, DECOMPOSITIONS), inputs))
    for _, sample, dtype in SAMPLES:
        inputs = make_inputs(sample, dtype)
        graphs.append((trace(sample.fn, inputs, SAMPLE_DECOMPOSITIONS), inputs))
    for gm, inputs in graphs:
        targets |= {n.target for n in gm.graph.nodes if n.op == "call_function"}
        ir_ops |= _ir_ops(gm, inputs)
    return targets, ir_ops


@pytest.mark.parametrize("op", ops.REGISTRY, ids=lambda op: op.name)
def test_op_is_exercised(op):
    """Each IR op is computed, and each of its ATen lowerings runs, in some op-table case or sample:
    a new entry needs a Sample (or an optable case) to pass."""
    targets, ir_ops = exercised()
    if op.arity is not None:
        assert op.name in ir_ops, f"no op-table case or sample computes {op.name}: add a Sample to its entry"
    rules = op.aten if isinstance(op.aten, dict) else {op.aten: None}
    for packets in filter(None, rules):  # (IR ops no ATen op lowers to directly: () )
        overloads = [o for p in packets for o in ops.overloads(p)]
        assert targets & set(overloads), \
            f"{op.name}: none of {overloads} is lowered by an op-table case or sample: add a Sample to its entry"


@pytest.mark.parametrize("op", list(ops.OPS.values()), ids=lambda op: op.name)
@pytest.mark.parametrize("renderer", ops.RENDERERS)
def test_op_renders(op, renderer):
    args = [f"a{i}" for i in range(op.arity)]
    for dtype in (torch.float32, torch.float64):
        e = ir.Expr(op.name, [ir.const(1.0, dtype)] * op.arity, dtype)
        code = ops.render(renderer, e, args)
        assert isinstance(code, str) and all(a in code for a in args), code


@pytest.mark.parametrize("op,sample,dtype", [pytest.param(*s, id=f"{s[0].name}{i}-{str(s[2])[6:]}")
                                             for i, s in enumerate(SAMPLES)])
def test_sample(op, sample, dtype, native_cache):
    """The sample compiled (its ops lowered by the registry, not decomposed) matches eager."""
    torch.manual_seed(0)
    inputs = [padded(x) for x in make_inputs(sample, dtype)]
    ref = sample.fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    gm = trace(sample.fn, inputs, SAMPLE_DECOMPOSITIONS)
    compiled = compile_aten_graph(gm, inputs, force_triton=True, options={"cache_dir": native_cache})
    assert compiled.ember_native["reason"] is None, compiled.ember_native["reason"]
    with guarded(compiled) as alloc:
        out = compiled(*inputs)
    if alloc is not None:
        alloc.check()
    tol = {"atol": sample.atol, "rtol": sample.rtol} if dtype == torch.float32 else {}
    compare(out, ref, **tol)


@pytest.mark.parametrize("op,sample", [pytest.param(op, s, id=f"{op.name}{i}")
                                       for i, (op, s, dt) in enumerate(SAMPLES) if s.grad and dt == torch.float32])
def test_sample_gradients(op, sample):
    """Values and gradients through ember.compile (forward and backward graphs on the native
    backend) against eager."""
    import ember
    from ember.config import config
    torch.manual_seed(0)
    inputs = make_inputs(sample, torch.float32)
    mine = [x.clone().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    ref = [x.clone().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    old = config.native_force_triton
    config.native_force_triton = True
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = ember.compile(sample.fn)(*mine)
            (out * torch.linspace(-1, 1, out.numel(), device=out.device).view(out.shape)).sum().backward()
    finally:
        config.native_force_triton = old
    fallbacks = [str(w.message) for w in caught if "eagerly" in str(w.message)]
    assert not fallbacks, fallbacks  # the graphs must reach the native backend, not run as they are
    expected = sample.fn(*ref)
    (expected * torch.linspace(-1, 1, expected.numel(), device=expected.device).view(expected.shape)).sum().backward()
    compare(out, expected, sample.atol, sample.rtol)
    for a, b in zip(mine, ref):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            compare(a.grad, b.grad, sample.atol, sample.rtol)


@pytest.mark.parametrize("eps", [None, 0.25])
def test_logit_lowers_whole(eps):
    """aten.logit (with or without eps) is one registry op: not decomposed, one kernel computing it."""
    x = torch.rand(SHAPE, device=DEVICE) * 0.98 + 0.01
    gm = trace(lambda x: torch.logit(x, eps), [x], DECOMPOSITIONS)
    assert torch.ops.aten.logit.default in {n.target for n in gm.graph.nodes}
    assert "logit" in _ir_ops(gm, [x])
    _, _, _, emitted = plan(gm, [x], dict(DEFAULT_OPTIONS))
    assert len(emitted) == 1 and "tl.log(" in emitted[0][1].source


def test_whole_ops_stay_whole_through_the_autograd_layer():
    """ember.compile traces with ember.aot's table, which starts from core ATen (where logit
    decomposes): the ops the native backend lowers whole must be taken out of it too."""
    from ember.aot.ops import decomposition_table
    from ember.native.decomp import AOT_DECOMPOSITIONS
    table = decomposition_table(AOT_DECOMPOSITIONS)
    assert ops.WHOLE and not [o for o in ops.WHOLE if o in table]
    assert all(table[o] is fn for o, fn in DECOMPOSITIONS.items())


@pytest.mark.parametrize("op", list(ops.OPS.values()), ids=lambda op: op.name)
def test_verifier_checks_registry_arity(op):
    """The IR verifier knows every registry op's arity, and no op outside the registry."""
    from ember.native import lowering
    x = torch.randn(4, 6)
    g, _ = lowering.lower(trace(lambda x: x * 2, [x], DECOMPOSITIONS), [x])
    node = g.nodes[0]
    x = node.body
    for body, ok in ((ir.Expr(op.name, [x] * op.arity, x.dtype), True),
                     (ir.Expr(op.name, [x] * (op.arity + 1), x.dtype), False),
                     (ir.Expr(op.name + "_unknown", [x] * op.arity, x.dtype), False)):
        g.nodes[0] = ir.ComputedNode(node.name, node.layout, node.ranges, body, node.store_index)
        if ok:
            ir.verify(g)
        else:
            with pytest.raises(ir.IRError, match="arity|unknown op"):
                ir.verify(g)
