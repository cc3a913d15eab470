"""Compile-time paths of the autograd layer (issue 29): traced and partitioned graphs generate their
Python code only when it is read or run; the compilers' ``ember_before_trace`` hook runs before a
trace (a cache miss) and not when the traced graphs come from the cache; an inference graph's
metadata is read inside its one trace (``trace_forward_analyzed``), giving what the analysis run
followed by ``trace_forward`` gives."""
import pytest
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

import ember
from aot_helpers import Recorder, close
from ember.aot import aot_autograd, run_graph_eagerly


def _f(x, w):
    return torch.relu(x @ w).sum(1) * 2


def test_traced_graphs_are_lazy_and_still_run(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    rec = Recorder()
    x, w = torch.randn(4, 8), torch.randn(8, 3, requires_grad=True)
    out = ember.compile(_f, backend=rec)(x, w)
    close(out, _f(x, w), "forward")
    out.sum().backward()
    wr = w.detach().clone().requires_grad_()
    _f(x, wr).sum().backward()
    close(w.grad, wr.grad, "grad")
    fw, bw = rec.fw_graphs[-1], rec.bw_graphs[-1]
    for g in (fw, bw):
        assert isinstance(g, _LazyGraphModule)
        g.recompile()  # (a pass changed the graph): no code is generated...
        assert type(g)._needs_recompile()
        assert "def forward" in g.code  # ...until it is read, as text (session 38: the forward is not
        assert type(g)._needs_recompile()  # compiled for a read, only for a call)


def test_code_text_is_fx_code_and_follows_graph_changes(monkeypatch, tmp_path):
    """``code`` of a traced graph is the text fx generates; a pass that changes the graph and calls
    ``recompile()`` gets the new text (never the old one kept), and a call compiles and runs the
    current graph."""
    from ember.aot.lazy_code import TextCodeGraphModule
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    rec = Recorder()
    x, w = torch.randn(4, 8), torch.randn(8, 3, requires_grad=True)
    ember.compile(_f, backend=rec)(x, w).sum().backward()
    fw = rec.fw_graphs[-1]
    assert isinstance(fw, TextCodeGraphModule)
    text = fw.code
    assert text == fw.graph.python_code(root_module="self").src
    relu = next(n for n in fw.graph.nodes if n.op == "call_function" and "relu" in str(n.target))
    relu.target = torch.ops.aten.neg.default  # a pass rewrites the graph...
    fw.recompile()
    assert fw.code != text and "neg" in fw.code  # ...the text follows
    args = [torch.randn(n.meta["val"].shape) for n in fw.graph.nodes if n.op == "placeholder"]
    xs, ws = [a for a in args if a.shape == (4, 8)], [a for a in args if a.shape == (8, 3)]
    out = fw(*args)  # a call compiles the current graph
    assert not type(fw)._needs_recompile()
    close(out[0], (-(xs[0] @ ws[0])).sum(1) * 2, "rewritten forward")


def test_inference_graph_is_lazy(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return run_graph_eagerly(gm, example_inputs)
    backend = aot_autograd(fw_compiler=keep, strict=True)
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.no_grad():
        close(ember.compile(_f, backend=backend)(x, w), _f(x, w), "inference")
    assert isinstance(graphs[-1], _LazyGraphModule)


def test_before_trace_hook_runs_on_a_miss_only(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    calls = []

    def compiler(gm, example_inputs):
        return run_graph_eagerly(gm, example_inputs)
    compiler.ember_before_trace = lambda gm, args: calls.append(len(args))

    def broken(gm, args):
        raise RuntimeError("no head start today")
    other = lambda gm, example_inputs: run_graph_eagerly(gm, example_inputs)  # noqa: E731
    other.ember_before_trace = broken  # a failing hook costs nothing but its head start

    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(5)
    backend = aot_autograd(fw_compiler=compiler, bw_compiler=other, strict=True)
    close(ember.compile(f, backend=backend)(x), f(x), "first")
    assert calls == [1]  # once (the same hook of several compilers runs once)
    # a second compile of the same graph: the aot cache has it, nothing is traced
    close(ember.compile(f, backend=aot_autograd(fw_compiler=compiler, bw_compiler=other, strict=True))(x), f(x), "again")
    assert calls == [1]


def _mutates(x, y):
    x.add_(1)
    return x * y, y.t()  # a mutated input, a plain output, a view of an input


def _aliases(x):
    b = x * 2
    return b[0], b[1], b.sum()  # two outputs viewing one intermediate


def _capture(fn, args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    ember.compile(fn, backend=backend)(*[a.clone() for a in args])
    return graphs[0]



@pytest.mark.parametrize("fn,shapes", [(_mutates, [(3, 4), (3, 4)]), (_aliases, [(2, 5)]), (_f, [(4, 8), (8, 3)])])
def test_one_run_inference_trace_equals_analysis_then_trace(fn, shapes):
    """pipeline's inference path reads the metadata inside the trace (trace_forward_analyzed): the
    same metadata and graph as analysis.collect followed by trace_forward."""
    from torch._subclasses import FakeTensorMode
    from ember.aot import analysis, trace
    from ember.aot.ops import default_decompositions
    torch.manual_seed(0)
    gm, args = _capture(fn, [torch.randn(*s) for s in shapes])
    decomps = default_decompositions()
    with torch.no_grad():
        meta, graph = trace.trace_forward_analyzed(gm, [a.clone() for a in args],
                                                   FakeTensorMode(allow_non_fake_inputs=True), decomps)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        ref_meta = analysis.collect(gm, [a.clone() for a in args], mode)
        ref = trace.trace_forward(gm, ref_meta, [a.clone() for a in args], mode, decomps)
    assert meta.describe() == ref_meta.describe() and meta.mutated == ref_meta.mutated
    assert graph.code == ref.code


def test_one_run_inference_trace_declines_what_needs_the_analysis_first():
    from torch._subclasses import FakeTensorMode
    from ember.aot import trace

    def makes_grad(x):
        with torch.enable_grad():
            w = torch.ones(3, requires_grad=True)
            return x * w  # an output needing a gradient: a joint trace
    gm, args = _capture(makes_grad, [torch.randn(3)])
    with torch.no_grad():
        assert trace.trace_forward_analyzed(gm, args, FakeTensorMode(allow_non_fake_inputs=True), {}) is None
