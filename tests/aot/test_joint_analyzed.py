"""trace_joint_analyzed (ember/aot/trace.py): a training graph whose outputs the frontend saw as fresh
tensors is analyzed inside its joint trace. Where the guess holds, the joint graph, metadata and
results are those of the analysis-first path; where it does not (a mutated buffer, an output that
aliases an input, an output the frontend saw without grad), the analysis-first path runs instead."""
import copy

import pytest
import torch

import ember
from ember.aot import trace as aot_trace
from ember.config import config

from aot_helpers import Recorder, assert_same_buffers, assert_same_grads, close


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.lin(x)) + x).transpose(0, 1).sum(0)


class WithBatchNorm(torch.nn.Module):  # mutates its running statistics (inputs of the graph)
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.lin(x)).relu()


def _run(model, x, analyzed: bool, unfunctionalized: bool = True):
    before = dict(aot_trace.JOINT_ANALYZED)
    old = config.aot_joint_analyzed, config.aot_cache, config.frontend_cache, config.aot_joint_unfunctionalized
    config.aot_joint_analyzed, config.aot_cache, config.frontend_cache = analyzed, False, False  # (traced here)
    config.aot_joint_unfunctionalized = unfunctionalized
    try:
        rec = Recorder()
        twin = copy.deepcopy(model)
        compiled = ember.compile(twin, backend=rec)
        out = compiled(x)
        out.sum().backward() if out.dim() else out.backward()
    finally:
        (config.aot_joint_analyzed, config.aot_cache, config.frontend_cache,
         config.aot_joint_unfunctionalized) = old
    delta = {k: v - before.get(k, 0) for k, v in aot_trace.JOINT_ANALYZED.items() if v != before.get(k, 0)}
    return twin, out, rec, delta


def _code(rec):
    return [g.code for g in rec.fw_graphs] + [g.code for g in rec.bw_graphs]


def _eager(model, x):
    ref = copy.deepcopy(model)
    out = ref(x)
    out.sum().backward() if out.dim() else out.backward()
    return ref, out


class Tied(torch.nn.Module):  # one weight used twice: its gradients are summed in the backward
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.tanh(x @ self.w) @ self.w.t()


@pytest.mark.parametrize("unfunctionalized", [True, False])
@pytest.mark.parametrize("make", [Block, WithBatchNorm, Tied])
def test_same_graphs_and_results_as_analysis_first(make, unfunctionalized):
    torch.manual_seed(0)
    model, x = make(), torch.randn(4, 8)
    ref, ref_out = _eager(model, x)
    fast, out, rec, delta = _run(model, x, analyzed=True, unfunctionalized=unfunctionalized)
    slow, out2, rec2, delta2 = _run(model, x, analyzed=False)
    assert rec.kinds() == rec2.kinds() == ["training"]
    assert _code(rec) == _code(rec2)
    assert rec.variants[0].meta.describe() == rec2.variants[0].meta.describe()
    for o, m in ((out, fast), (out2, slow)):
        close(o, ref_out, "output")
        assert_same_grads(ref, m)
        assert_same_buffers(ref, m)
    assert delta2 == {}
    if make is not WithBatchNorm:
        assert delta == {"unfunctionalized hits" if unfunctionalized else "hits": 1}
    else:  # the running statistics are mutated: the guess fails inside the trace, analysis first
        assert delta == {"misses": 1} and rec.variants[0].meta.mutated


def test_output_aliasing_an_input_goes_analysis_first():
    w = torch.nn.Parameter(torch.randn(3, 4))

    def f(x):
        return x.view(12), (x * w).sum()
    x = torch.randn(3, 4, requires_grad=True)
    before = aot_trace.JOINT_ANALYZED["hits"]
    rec = Recorder()
    view, loss = ember.compile(f, backend=rec)(x)
    loss.backward()
    assert aot_trace.JOINT_ANALYZED["hits"] == before  # (no guess: an output is an input's view)
    assert view._base is x
    close(w.grad, x.detach())
    close(x.grad, w.detach())


def test_guess_needs_example_values_of_fresh_outputs():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)  # (no frontend example values)
    assert aot_trace.guess_plain_outputs(gm, [torch.randn(2)]) is None


def test_a_mutation_the_captured_graph_hides_goes_functionalized():
    """Traced unfunctionalized on purpose: the in-place op on an intermediate is recorded as it is,
    so the graph is refused and the functionalized trace of the same guess runs (same graph as
    with functionalization from the start)."""
    from torch._subclasses import FakeTensorMode
    from ember.aot.ops import default_decompositions
    w = torch.randn(3, 3, requires_grad=True)

    def f(x, w):
        h = x @ w
        h.mul_(2)  # (an fx graph with an in-place call: may_skip_functionalization says no)
        return (h.sin(),)
    gm = torch.fx.symbolic_trace(f)
    assert not aot_trace.may_skip_functionalization(gm)
    args = [torch.randn(2, 3), w]
    guess = ([True], [((2, 3), torch.float32, torch.device("cpu"))])
    before = dict(aot_trace.JOINT_ANALYZED)
    got = [aot_trace.trace_joint_analyzed(gm, args, FakeTensorMode(allow_non_fake_inputs=True),
                                          default_decompositions(), guess, functional=fn) for fn in (False, True)]
    assert aot_trace.JOINT_ANALYZED["unfunctionalized misses"] == before.get("unfunctionalized misses", 0) + 1
    assert aot_trace.JOINT_ANALYZED["hits"] == before.get("hits", 0) + 2
    (meta0, j0), (meta1, j1) = got
    assert j0.gm.code == j1.gm.code and "aten.mul_" not in j0.gm.code
    assert all(map(aot_trace._functional_node, j0.gm.graph.nodes))


def test_functional_node_table():
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ok = g.call_function(aten.add.Tensor, (x, x))
    bad = [g.call_function(aten.add_.Tensor, (x, x)), g.call_function(aten.copy_.default, (x, x)),
           g.call_function(aten._print.default, ("hi",)), g.call_function(torch.sin, (x,))]
    assert aot_trace._functional_node(x) and aot_trace._functional_node(ok)
    assert not any(map(aot_trace._functional_node, bad))


def test_may_skip_functionalization_reads_the_captured_graph():
    F = torch.nn.functional

    def graph(fn):
        return torch.fx.symbolic_trace(fn)
    may = aot_trace.may_skip_functionalization
    assert may(graph(lambda x: torch.relu(x) * 2))
    assert may(graph(lambda x: F.dropout(x, 0.1, False)))  # (eval-mode dropout: the identity)
    assert may(graph(lambda x: F.dropout(x, p=0.0, training=True)))
    assert not may(graph(lambda x: F.dropout(x, 0.1, True)))
    assert not may(graph(lambda x: F.dropout(x, 0.1)))
    assert not may(graph(lambda x: x.add_(1)))
    assert not may(graph(lambda x: F.relu(x, inplace=True)))
    assert not may(graph(lambda x, y: torch.add(x, 1, out=y)))


@pytest.mark.parametrize("make", [Block, Tied])
def test_inference_trace_unfunctionalized_gives_the_functionalized_graph(make):
    torch.manual_seed(0)
    model, x = make().eval(), torch.randn(4, 8)
    graphs = []
    for unf in (True, False):
        old = config.aot_joint_unfunctionalized, config.aot_cache, config.frontend_cache
        config.aot_joint_unfunctionalized, config.aot_cache, config.frontend_cache = unf, False, False
        before = aot_trace.FORWARD_UNFUNCTIONALIZED["hits"]
        try:
            rec = Recorder(inference_compiler=Recorder._keep(graphs))
            with torch.no_grad():
                out = ember.compile(copy.deepcopy(model), backend=rec)(x)
        finally:
            config.aot_joint_unfunctionalized, config.aot_cache, config.frontend_cache = old
        assert aot_trace.FORWARD_UNFUNCTIONALIZED["hits"] == before + unf
        with torch.no_grad():
            close(out, model(x), "output")
    assert len(graphs) == 2 and graphs[0].code == graphs[1].code


def test_inference_mutation_goes_functionalized():
    from torch._subclasses import FakeTensorMode
    from ember.aot.ops import default_decompositions

    def f(x):
        h = x * 2
        h.mul_(3)  # (hidden from may_skip_functionalization: called with functional=False below)
        return (h.cos(),)
    gm = torch.fx.symbolic_trace(f)
    before = dict(aot_trace.FORWARD_UNFUNCTIONALIZED)
    with torch.no_grad():
        got = [aot_trace.trace_forward_analyzed(gm, [torch.randn(3)], FakeTensorMode(allow_non_fake_inputs=True),
                                                default_decompositions(), functional=fn) for fn in (False, True)]
    assert aot_trace.FORWARD_UNFUNCTIONALIZED["misses"] == before.get("misses", 0) + 1
    assert got[0][1].code == got[1][1].code and "aten.mul_" not in got[0][1].code
