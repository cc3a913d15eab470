"""What a warm start skips: compiling generated modules again (``diskcache.compile_cached``) and
compiling the Python code of graphs rebuilt from a cache entry (``aot.cache.LoadedGraphModule``),
without trusting anything it would not have trusted before."""
import os

import pytest
import torch
import torch.fx as fx

from ember import diskcache
from ember.aot.cache import _Pickler, _Unpickler, graph_data, make_loaded, rebuild_graph


def test_compile_cached_reuses_the_code_object_for_the_same_bytes_only(tmp_path):
    root = str(tmp_path)
    path = os.path.join(root, "code", "ab", "x.code")
    src = b"def f(a):\n    return a * 3\n"
    c1 = diskcache.compile_cached(src, "<gen>", path, root)
    assert os.path.exists(path)
    c2 = diskcache.compile_cached(src, "<gen>", path, root)
    ns1, ns2 = {}, {}
    exec(c1, ns1)
    exec(c2, ns2)
    assert ns1["f"](2) == ns2["f"](2) == 6
    # other bytes under the same path: the stored code object is not theirs, they compile
    other = diskcache.compile_cached(b"def f(a):\n    return a + 1\n", "<gen>", path, root)
    ns = {}
    exec(other, ns)
    assert ns["f"](2) == 3


def test_compile_cached_ignores_a_corrupt_code_file(tmp_path):
    root = str(tmp_path)
    path = os.path.join(root, "code", "cd", "y.code")
    src = b"X = 41 + 1\n"
    diskcache.compile_cached(src, "<gen>", path, root)
    with open(path, "r+b") as f:  # flip a payload byte: the envelope's checksum fails
        data = bytearray(f.read())
        data[-3] ^= 0xFF
        f.seek(0)
        f.write(bytes(data))
    ns = {}
    exec(diskcache.compile_cached(src, "<gen>", path, root), ns)
    assert ns["X"] == 42


def _graph():
    aten = torch.ops.aten

    def f(x, y):  # ATen ops, as the aot cache's graphs hold
        return aten.add.Tensor(aten.relu.default(aten.mm.default(x, y)), 1)
    return fx.symbolic_trace(f)


def _stored(gm):
    """The graph as the aot cache stores and reads it back (nodes by name)."""
    import io
    import pickle
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(graph_data(gm))
    return _Unpickler(io.BytesIO(buf.getvalue()), None).load()


def test_loaded_graph_module_answers_its_code_and_compiles_only_to_run():
    gm = _graph()
    loaded = rebuild_graph(_stored(gm))
    assert loaded._needs_recompile()  # nothing compiled yet
    assert loaded.code == gm.code
    assert loaded._needs_recompile()  # reading the code did not compile it
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(loaded(x, y), gm(x, y))
    assert not loaded._needs_recompile()
    assert loaded.code == gm.code


def test_loaded_graph_module_code_follows_a_changed_graph():
    gm = _graph()
    loaded = rebuild_graph(_stored(gm))
    for n in loaded.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.relu.default:
            n.target = torch.ops.aten.sigmoid.default
    loaded.recompile()
    assert "aten.sigmoid" in loaded.code and "aten.relu" not in loaded.code
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(loaded(x, y), torch.sigmoid(x @ y) + 1)


def test_loaded_graph_module_rejects_other_code():
    from ember.aot.cache import rebuild_nodes
    gm = _graph()
    with pytest.raises(ValueError, match="differs"):
        make_loaded({}, rebuild_nodes(_stored(gm)), gm.code.replace("relu", "sigmoid"))
