"""The C++ path's matmul rewrites (ember/native/cpu_mm.py): an activation in place on a large addmm's
result (``_addmm_activation``) and a bias added in the kernel after ``mm``; results equal eager's."""
import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.native import cpu_mm
from tests.native.harness import trace

aten = torch.ops.aten
needs_cxx = pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    ember.reset()


def _count(gm, target):
    return sum(n.target is target for n in gm.graph.nodes)


@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("rank", [2, 3])
def test_fuse_activations_graph(act, rank):
    fn = {"relu": F.relu, "gelu": F.gelu}[act]
    x = torch.randn(4, 64, 32) if rank == 3 else torch.randn(256, 32)
    w, b = torch.randn(48, 32), torch.randn(48)
    gm = trace(lambda x, w, b: fn(F.linear(x, w, b)), [x, w, b])
    want = fn(F.linear(x, w, b))
    assert cpu_mm.fuse_activations(gm) == 1
    assert _count(gm, aten._addmm_activation.default) == 1 and _count(gm, aten.addmm.default) == 0
    assert _count(gm, aten.relu.default) == 0 and _count(gm, aten.erf.default) == 0
    out = gm(x, w, b)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, want)


def test_fuse_activations_leaves_small_batches_and_shared_results():
    x, w, b = torch.randn(32, 32), torch.randn(48, 32), torch.randn(48)
    gm = trace(lambda x, w, b: F.relu(F.linear(x, w, b)), [x, w, b])
    assert cpu_mm.fuse_activations(gm) == 0  # below MIN_ROWS: packed_linear's
    x = torch.randn(256, 32)
    gm = trace(lambda x, w, b: (lambda y: (F.relu(y), y * 2))(F.linear(x, w, b)), [x, w, b])
    assert cpu_mm.fuse_activations(gm) == 0  # the pre-activation value is used too


def test_unfuse_bias_graph():
    x, w, b, r = torch.randn(256, 32), torch.randn(48, 32), torch.randn(48), torch.randn(256, 48)
    gm = trace(lambda x, w, b, r: F.layer_norm(F.linear(x, w, b) + r, (48,)), [x, w, b, r])
    assert cpu_mm.unfuse_bias(gm) == 1
    assert _count(gm, aten.mm.default) == 1 and _count(gm, aten.addmm.default) == 0
    out = gm(x, w, b, r)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out,
                               F.layer_norm(F.linear(x, w, b) + r, (48,)), rtol=1e-5, atol=1e-5)
    # a result returned as is, or fed to another matmul, keeps its addmm
    gm = trace(lambda x, w, b: F.linear(x, w, b), [x, w, b])
    assert cpu_mm.unfuse_bias(gm) == 0
    gm = trace(lambda x, w, b: F.linear(x, w, b) @ w, [x, w, b])
    assert cpu_mm.unfuse_bias(gm) == 0


@needs_cxx
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_eager(activation):
    torch.manual_seed(0)
    m = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, activation=activation).eval()
    x = torch.randn(4, 40, 32)
    fn = ember.compile(m)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-4)


@needs_cxx
def test_training_through_rewrites_matches_eager():
    """Forward + backward of a large-batch MLP (the rewrites apply to the training forward graph)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16), torch.nn.LayerNorm(16))
    twin = copy.deepcopy(m)
    x = torch.randn(300, 32)
    fn = ember.compile(m)
    fn(x).square().sum().backward()
    twin(x).square().sum().backward()
    for p, q in zip(m.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


def _in_proj(x, w, b):
    """MultiheadAttention(batch_first=True)'s in-projection: [b, s, d] -> [s, b, d] -> Linear (as the
    AOT graph spells it: a permuted copy, viewed 2-D, mm, viewed back, the bias added)."""
    s, bsz, d = x.shape[1], x.shape[0], x.shape[2]
    t = x.transpose(0, 1).contiguous().view(s * bsz, d)
    return (t @ w.t()).view(s, bsz, -1) + b


def test_unpermute_rows_graph():
    x, w, b = torch.randn(4, 6, 8), torch.randn(12, 8), torch.randn(12)
    gm = trace(_in_proj, [x, w, b])
    assert _count(gm, aten.clone.default) == 1
    assert cpu_mm.unpermute_rows(gm) == 1
    assert _count(gm, aten.clone.default) == 0 and _count(gm, aten.mm.default) == 1
    out = gm(x, w, b)
    got = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(got, _in_proj(x, w, b), rtol=1e-5, atol=1e-5)


def test_unpermute_rows_leaves_other_uses():
    x, w = torch.randn(4, 6, 8), torch.randn(12, 8)
    # the 2-D result itself is used (returned): the rows must stay in permuted order
    gm = trace(lambda x, w: x.transpose(0, 1).contiguous().view(24, 8) @ w.t(), [x, w])
    assert cpu_mm.unpermute_rows(gm) == 0
    # the view back is a graph output: its strides are eager's (contiguous)
    gm = trace(lambda x, w: (x.transpose(0, 1).contiguous().view(24, 8) @ w.t()).view(6, 4, 12), [x, w])
    assert cpu_mm.unpermute_rows(gm) == 0
    # the last dim moves too: not a row permutation
    gm = trace(lambda x, w: (x.permute(2, 1, 0).contiguous().view(48, 4) @ w[:, :4].t()).view(8, 6, 12) + 1, [x, w])
    assert cpu_mm.unpermute_rows(gm) == 0


@needs_cxx
@pytest.mark.parametrize("simd", ["auto", "portable"])
def test_batch_first_attention_matches_eager(monkeypatch, simd):
    """MultiheadAttention(batch_first=True) and the encoder layer through the C++ path (both renderings of
    its kernels): the in-projection's matmul reads the input in place (no permuted copy), results as eager's."""
    monkeypatch.setattr(ember.config, "native_cpu_simd", simd)
    calls = []
    real = cpu_mm.unpermute_rows
    monkeypatch.setattr(cpu_mm, "unpermute_rows", lambda gm: calls.append(real(gm)) or calls[-1])
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    enc = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(3, 20, 32)
    with torch.no_grad():
        f = ember.compile(lambda x: mha(x, x, x, need_weights=False)[0])
        torch.testing.assert_close(f(x), mha(x, x, x, need_weights=False)[0], rtol=1e-4, atol=1e-5)
        g = ember.compile(enc)
        torch.testing.assert_close(g(x), enc(x), rtol=1e-4, atol=1e-4)
    assert calls and all(c == 1 for c in calls)


def test_unpermute_rows_addmm():
    """An addmm with a 1-D bias (the same for every row) is rewritten as mm is; results as eager's."""
    x, w, b = torch.randn(4, 6, 8), torch.randn(12, 8), torch.randn(12)
    f = lambda x, w, b: torch.addmm(b, x.transpose(0, 1).contiguous().view(24, 8), w.t()).view(6, 4, 12) * 2  # noqa: E731
    gm = trace(f, [x, w, b])
    assert cpu_mm.unpermute_rows(gm) == 1 and _count(gm, aten.clone.default) == 0
    out = gm(x, w, b)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, f(x, w, b), rtol=1e-5, atol=1e-5)

# ---------------------------------------------------------------------- transpose_small_mm (few rows)

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 32, 64])
def test_transpose_small_mm_graph(bias, rows):
    """A Linear of few rows becomes ``mm(w, x.t())`` read transposed; values and the result's
    (row-major) layout stay eager's."""
    x, w, b = torch.randn(rows, 48), torch.randn(40, 48), torch.randn(40)
    fn = (lambda x, w, b: F.gelu(F.linear(x, w, b))) if bias else (lambda x, w, b: F.linear(x, w) * b)
    gm = trace(fn, [x, w, b])
    assert cpu_mm.transpose_small_mm(gm, packed=False) == 1
    assert _count(gm, aten.addmm.default) == 0 and _count(gm, aten.mm.default) == 1
    (mm,) = [n for n in gm.graph.nodes if n.target is aten.mm.default]
    assert mm.meta["val"].shape == (40, rows)  # the transposed product
    out = gm(x, w, b)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, fn(x, w, b), rtol=1e-5, atol=1e-5)


def test_transpose_small_mm_leaves_other_matmuls():
    w, b = torch.randn(40, 48), torch.randn(40)
    # more rows than T_MAX_ROWS: MKL's row-major GEMM is as fast
    x = torch.randn(cpu_mm.T_MAX_ROWS + 1, 48)
    assert cpu_mm.transpose_small_mm(trace(lambda x, w, b: F.linear(x, w, b), [x, w, b]), packed=False) == 0
    # a weight read as stored (the backward's dz @ w): row-major results are the faster ones there
    x = torch.randn(8, 40)
    assert cpu_mm.transpose_small_mm(trace(lambda x, w: x @ w, [x, w]), packed=False) == 0
    # inference with packed_linear on: its packed GEMM takes a weight that is a graph input
    x = torch.randn(8, 48)
    w = torch.randn(128, 48)
    assert cpu_mm.transpose_small_mm(trace(lambda x, w: F.linear(x, w), [x, w]), packed=True) == 0
    # ... but not N=10 (below its smallest N)
    w = torch.randn(10, 48)
    assert cpu_mm.transpose_small_mm(trace(lambda x, w: F.linear(x, w), [x, w]), packed=True) == 1
    # float64: not measured, left alone
    x, w = torch.randn(8, 48, dtype=torch.float64), torch.randn(40, 48, dtype=torch.float64)
    assert cpu_mm.transpose_small_mm(trace(lambda x, w: F.linear(x, w), [x, w]), packed=False) == 0


@needs_cxx
def test_small_batch_training_matches_eager():
    """The mlp_train row's shape of step (3 Linear + GELU, 32 rows): loss and every gradient equal
    eager's; the training forward's Linears run transposed (packed_linear is off there)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 96), torch.nn.GELU(),
                            torch.nn.Linear(96, 10))
    twin = copy.deepcopy(m)
    x, y = torch.randn(32, 48), torch.randint(0, 10, (32,))
    seen = []
    real = cpu_mm.transpose_small_mm

    def spy(gm, packed):
        seen.append(real(gm, packed))
        return seen[-1]
    cpu_mm.transpose_small_mm = spy
    try:
        fn = ember.compile(m)
        for _ in range(2):
            loss = F.cross_entropy(fn(x), y)
            ref = F.cross_entropy(twin(x), y)
            loss.backward()
            ref.backward()
            torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
            for p, q in zip(m.parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
                p.grad = q.grad = None
    finally:
        cpu_mm.transpose_small_mm = real
    assert 3 in seen  # the forward graph's three Linears
