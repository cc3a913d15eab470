"""Graphs loaded from the autograd layer's cache build their nodes only when read (``ember/aot/deferred.py``):
a warm start whose compiled graphs come from the native cache never builds them, answers the same
questions a built graph answers, still recompiles when a guard fails, and a stored graph that does
not rebuild to its code is an error naming the fix (or, at load, a miss traced again)."""
import copy
import io
import pickle

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import ember
from ember.aot import aot_autograd, deferred
from ember.aot import cache as aot_cache
from ember.config import config
from tests.aot.aot_helpers import Recorder, close


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(config, "aot_cache", True)
    monkeypatch.setattr(aot_cache, "STATS", dict.fromkeys(aot_cache.STATS, 0))
    monkeypatch.setattr(deferred, "STATS", dict.fromkeys(deferred.STATS, 0))
    return tmp_path


def _aten_graph():
    """An ATen graph with FakeTensor values and a constant, as the autograd layer traces them."""
    root = torch.nn.Module()
    root.scale = torch.tensor([2.0, 3.0, 4.0])
    g = torch.fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("scale")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, w))
    z = g.call_function(torch.ops.aten.relu.default, (y,))
    g.output((z,))
    gm = torch.fx.GraphModule(root, g)
    mode = FakeTensorMode()
    with mode:
        x.meta["val"] = torch.empty(5, 3)
        w.meta["val"] = torch.empty(3)
        y.meta["val"] = torch.empty(5, 3)
        z.meta["val"] = torch.empty(5, 3)
    return gm


def _round_trip(gm, fake_mode=None):
    buf = io.BytesIO()
    aot_cache._Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(aot_cache.graph_data(gm))
    data = aot_cache._Unpickler(io.BytesIO(buf.getvalue()), fake_mode or FakeTensorMode()).load()
    return data


def test_a_loaded_graph_answers_from_its_summary_and_builds_its_nodes_when_read():
    gm = _aten_graph()
    data = _round_trip(gm)
    back = aot_cache.rebuild_graph(data)
    assert deferred.is_deferred(back)
    # the warm path's questions, answered without the nodes, as the built graph answers them
    vals = deferred.placeholder_vals(back)
    assert len(vals) == 1 and isinstance(vals[0], FakeTensor) and vals[0].shape == (5, 3)
    assert deferred.value_device_types(back) == {"cpu"} == deferred.value_device_types(gm)
    assert deferred.get_attr_targets(back) == ["scale"] == deferred.get_attr_targets(gm)
    assert back.code == gm.code and torch.equal(back.scale, gm.scale)
    assert deferred.is_deferred(back)  # none of that built it
    x = torch.randn(5, 3)
    close(back(x)[0], gm(x)[0], "output")  # running its Python code reads the graph
    assert not deferred.is_deferred(back)
    assert [n.op for n in back.graph.nodes] == [n.op for n in gm.graph.nodes]
    assert deferred.placeholder_vals(back)[0].shape == (5, 3)
    # a pass that edits it is seen (the stored code no longer answers)
    for n in back.graph.nodes:
        if n.target is torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    back.recompile()
    assert "sigmoid" in back.code
    close(back(x)[0], torch.sigmoid(x * gm.scale), "edited output")


def test_a_deferred_graph_copies_and_prints_as_a_built_one():
    gm = _aten_graph()
    back = aot_cache.rebuild_graph(_round_trip(gm))
    twin = copy.deepcopy(back)
    x = torch.randn(5, 3)
    close(twin(x)[0], gm(x)[0], "deep copy")
    assert "relu" in back.print_readable(print_output=False)


def test_a_deferred_graph_that_does_not_rebuild_to_its_code_is_an_error_naming_the_fix():
    gm = _aten_graph()
    data = _round_trip(gm)
    data["code"] = data["code"].replace("relu", "tanh")  # as if the nodes were not what the key says
    back = aot_cache.rebuild_graph(data)
    with pytest.raises(deferred.StaleCacheEntry, match="EMBER_AOT_CACHE=0"):
        back.graph
    data = _round_trip(gm)
    data["nodes"] = b"not a pickle"
    with pytest.raises(deferred.StaleCacheEntry, match="do not load"):
        aot_cache.rebuild_graph(data).graph


def _f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1)


def test_a_warm_entry_is_not_built_when_the_compiler_does_not_read_it(cache_dir):
    """A compiler that reads only what a warm native-cache hit reads: the graphs are not built to
    compile them (running their Python code, as this compiler's result does, builds them), and the
    second process's results and gradients are the first's."""
    seen = []

    def compiler(gm, example_inputs):
        seen.append((gm.code, deferred.placeholder_vals(gm), deferred.value_device_types(gm),
                     deferred.is_deferred(gm)))
        return _LazyRun(gm)

    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler)
    x, w = torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)
    want = _f(x, w)
    want.sum().backward()
    for i in range(2):  # two compiles, as two processes would do them
        wi = w.detach().clone().requires_grad_()
        got = ember.compile(_f, backend=backend)(x, wi)
        if i == 1:  # (the forward has run: built; the backward has not)
            assert deferred.STATS == {"deferred": 2, "materialized": 1}, deferred.STATS
        got.sum().backward()
        close(got, want, "output")
        close(wi.grad, w.grad, "grad")
    assert aot_cache.STATS["hits"] == 1
    assert seen[0][0] == seen[2][0] and seen[1][0] == seen[3][0]  # the stored code is the traced code
    assert [tuple(v.shape) for v in seen[1][1]] == [tuple(v.shape) for v in seen[3][1]]
    assert seen[2][2] == {"cpu"}
    assert [s[3] for s in seen] == [False, False, True, True]  # compiled without building the loaded ones


class _LazyRun:
    """Runs the graph module's Python code (which builds a deferred graph) only when called."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *args):
        return self.gm(*args)


def test_a_warm_entry_whose_guard_fails_later_recompiles_correctly(cache_dir):
    x, w = torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)
    for _ in range(2):
        got = ember.compile(_f, backend=Recorder())(x, w)
    assert aot_cache.STATS["hits"] == 1
    compiled = ember.compile(_f, backend=Recorder())
    close(compiled(x, w), _f(x, w), "warm")
    for shape in ((5, 8), (4, 8)):  # other sizes: the guard fails, a trace follows; then the first again
        xs = torch.randn(*shape)
        ws = w.detach().clone().requires_grad_()
        got = compiled(xs, ws)
        want_w = w.detach().clone().requires_grad_()
        want = _f(xs, want_w)
        got.sum().backward()
        want.sum().backward()
        close(got, want, f"after a guard failure {shape}")
        close(ws.grad, want_w.grad, f"grad after a guard failure {shape}")


def test_a_tampered_entry_read_by_the_compiler_is_traced_again(cache_dir):
    """An entry whose stored nodes no longer generate its code, met when the compiler first reads the
    graph: a miss (logged), traced again and replaced, the result right."""
    x, w = torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)
    ember.compile(_f, backend=aot_autograd())(x, w)
    (path,) = cache_dir.glob("aot/*/*.pkl")
    from ember import diskcache
    key = path.stem
    data = diskcache.unpack(path.read_bytes(), "aot", key)
    assert b"aten::gelu" in data
    path.write_bytes(diskcache.pack("aot", key, data.replace(b"aten::gelu", b"aten::tanh")))
    close(ember.compile(_f, backend=aot_autograd())(x, w), _f(x, w), "after a tampered entry")
    assert aot_cache.STATS["hits"] == 0 and aot_cache.STATS["misses"] == 2, aot_cache.STATS
    assert aot_cache.STATS["stores"] == 2  # replaced
    close(ember.compile(_f, backend=aot_autograd())(x, w), _f(x, w), "from the replaced entry")
    assert aot_cache.STATS["hits"] == 1


def test_auto_cudagraphs_decides_a_deferred_graph_without_building_it(monkeypatch):
    """Default mode's automatic CUDA graphs: a loaded graph is decided from its compiled report and the
    facts stored with it (``auto.graph_facts``), replayed or not, without building its nodes, and as
    its built form is decided; an entry stored without the facts has its graph read to decide.
    (Before session 37 a graph that might replay was always built: this test asserted that.)"""
    import ember.cudagraphs as cg
    from ember.cudagraphs import auto
    from tests.cudagraphs.fake_cuda import FakeCuda
    monkeypatch.setattr(config, "auto_cudagraphs", True)
    cg.reset()
    gm = _aten_graph()
    x = torch.randn(5, 3)

    def compiler_with(report):
        def compiler(g, ex):
            def run(*args):
                return g(*args)
            run.ember_native = {"report": report}
            return run
        return compiler
    big = dict(kernels=40, externs=0, bytes=auto.RULE.max_bytes + 1)
    small = dict(kernels=40, externs=0, bytes=1000)
    for report, replays in ((big, False), (small, True)):
        auto.wrap_auto(compiler_with(report), api=FakeCuda())(gm, [x])  # the built graph's decision
        built = auto.DECISIONS[-1][1:]
        back = aot_cache.rebuild_graph(_round_trip(gm))
        fn = auto.wrap_auto(compiler_with(report), api=FakeCuda())(back, [x])
        assert deferred.is_deferred(back), "deciding built the graph"
        assert auto.DECISIONS[-1][1:] == built and built[0] is replays, (built, auto.DECISIONS[-1])
        assert isinstance(fn, cg.Runner) is replays
        with torch.no_grad():
            for _ in range(3):
                close(fn(x)[0], gm(x)[0], "output")
    # an entry without the facts (they could not be taken): read to decide, as before
    data = _round_trip(gm)
    data["auto"] = None
    back = aot_cache.rebuild_graph(data)
    fn = auto.wrap_auto(compiler_with(small), api=FakeCuda())(back, [x])
    assert not deferred.is_deferred(back) and auto.DECISIONS[-1][1] and "host-bound" in auto.DECISIONS[-1][2]
    cg.reset()


def test_a_warm_training_entry_is_decided_without_building_its_graphs(cache_dir, monkeypatch):
    """A second process's training graphs (forward and backward), through default mode's automatic
    CUDA-graph wrapper (fake graph API on CPU tensors, a compiler with a native-like report): no
    graph is built to compile or decide them (materialization is spied on), and each decision is the
    first process's."""
    import ember.cudagraphs as cg
    from ember.cudagraphs import auto
    from tests.cudagraphs.fake_cuda import FakeCuda
    monkeypatch.setattr(config, "auto_cudagraphs", True)
    cg.reset()
    materialized = []
    real = deferred.DeferredGraphModule._ember_materialize

    def spy(self):
        materialized.append(self.__dict__["_ember_deferred"][0]["name"])
        return real(self)
    monkeypatch.setattr(deferred.DeferredGraphModule, "_ember_materialize", spy)

    def compiler(gm, example_inputs):
        run = _LazyRun(gm)
        run.ember_native = {"report": dict(kernels=3, externs=1, bytes=512)}
        return run
    fake = FakeCuda()
    fw = auto.wrap_auto(compiler, api=fake, training=True)
    bw_auto = auto.wrap_auto(compiler, api=fake, training=True, finish=lambda fn: fn)
    built_when_compiled = []

    def bw(gm, example_inputs):  # (compiled after the forward: what was built by then, nothing having run)
        out = bw_auto(gm, example_inputs)
        built_when_compiled.append(list(materialized))
        return out
    backend = aot_autograd(fw_compiler=fw, bw_compiler=bw)
    x, w = torch.randn(4, 8), torch.randn(8, 6, requires_grad=True)
    decisions = []
    for i in range(2):  # two compiles, as two processes would do them
        before = len(auto.DECISIONS)
        compiled = ember.compile(_f, backend=backend)
        wi = w.detach().clone().requires_grad_()
        got = compiled(x, wi)
        decisions.append([d[1:] for d in auto.DECISIONS[before:]])
        if i == 1:
            assert aot_cache.STATS["hits"] == 1 and deferred.STATS["deferred"] == 2
            assert built_when_compiled[-1] == [], f"deciding built {built_when_compiled[-1]}"
        got.sum().backward()
        close(got, _f(x, w), "output")
    assert len(decisions[0]) == 2 and decisions[0] == decisions[1], decisions
    assert all(d[0] for d in decisions[1]), decisions  # (both replay: the facts' path to a Runner ran too)
    cg.reset()


def test_a_loaded_graph_checks_its_stored_code_when_first_read_and_not_after_a_pass():
    """``make_loaded(verify=False)`` (the frontend's captured graphs): the stored text is compared with
    the graph's own code when ``code`` is first answered from it; a stale text is an error there. A
    pass that rewrites the graph first makes the text moot: nothing compares or returns it."""
    from ember.aot.cache import make_loaded, rebuild_nodes
    gm = _aten_graph()
    nodes = rebuild_nodes(_round_trip(gm))
    good = make_loaded({"scale": gm.scale}, nodes, gm.code, verify=False)
    assert good.code == gm.code and good._needs_recompile()  # checked, answered, not compiled
    stale = make_loaded({"scale": gm.scale}, rebuild_nodes(_round_trip(gm)), gm.code.replace("relu", "tanh"),
                        verify=False)
    with pytest.raises(ValueError, match="stale"):
        stale.code
    rewritten = make_loaded({"scale": gm.scale}, rebuild_nodes(_round_trip(gm)), gm.code.replace("relu", "tanh"),
                            verify=False)
    for n in rewritten.graph.nodes:
        if n.target is torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    rewritten.recompile()
    assert "sigmoid" in rewritten.code and "tanh" not in rewritten.code
    x = torch.randn(5, 3)
    close(rewritten(x)[0], torch.sigmoid(x * gm.scale), "rewritten output")
