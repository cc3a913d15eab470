"""CPU linear layers through MKL's packed GEMM (ember/native/packed_linear.py): results equal eager's,
and the packed weight is never stale: optimizer steps, load_state_dict, in-place updates under
no_grad and ``.data`` assignment all show in the next call's result."""
import shutil

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.native import packed_linear
from ember.native.packed_linear import PackedLinear

pytestmark = [
    pytest.mark.skipif(not packed_linear.available(), reason="torch built without MKL"),
    pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler"),
]


def _mlp(d0=64, d1=96, out=70):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d0, d1), torch.nn.GELU(), torch.nn.Linear(d1, out)).eval()


def _check(fn, m, x):
    with torch.no_grad():
        got, want = fn(x), m(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    return got


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    ember.reset()


def _packs():
    return packed_linear.STATS["packs"], packed_linear.STATS["packed_calls"]


def test_mlp_uses_packed_weights_and_matches_eager():
    m, x = _mlp(), torch.randn(8, 64)
    fn = ember.compile(m)
    packs, calls = _packs()
    for _ in range(3):
        _check(fn, m, x)
    assert _packs()[0] - packs == 2  # both layers (N=96, N=70), packed once each
    assert _packs()[1] - calls == 6


@pytest.mark.parametrize("how", ["no_grad_add", "load_state_dict", "data_assign", "optimizer_step", "copy_"])
def test_weight_update_repacks(how):
    """After the weights were packed, every way of changing them shows in the very next call."""
    m, x = _mlp(), torch.randn(8, 64)
    fn = ember.compile(m)
    for _ in range(2):
        _check(fn, m, x)
    w = m[0].weight
    packs = _packs()[0]
    if how == "no_grad_add":
        with torch.no_grad():
            w.add_(0.5)
    elif how == "load_state_dict":
        sd = {k: v + 1.0 for k, v in m.state_dict().items()}
        m.load_state_dict(sd)
    elif how == "data_assign":
        w.data = torch.randn_like(w)
    elif how == "copy_":
        with torch.no_grad():
            w.copy_(torch.randn_like(w))
    else:
        opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    _check(fn, m, x)
    _check(fn, m, x)
    assert _packs()[0] > packs  # re-packed (Parameters are packed at once)


def test_weights_changing_every_call_are_not_packed():
    """A plain tensor weight that is new at each call runs addmm: correct and never packed."""
    fn = ember.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)))
    packs = _packs()[0]
    x = torch.randn(4, 32)
    for _ in range(4):
        w, b = torch.randn(80, 32), torch.randn(80)
        torch.testing.assert_close(fn(x, w, b), F.gelu(F.linear(x, w, b)), rtol=1e-4, atol=1e-4)
    assert _packs()[0] == packs


def test_plain_tensor_weight_packed_once_stable_then_repacked_in_place():
    """A plain tensor (not a Parameter) seen unchanged twice is packed; an in-place write re-packs."""
    fn = ember.compile(lambda x, w: F.linear(x, w))
    x, w = torch.randn(4, 32), torch.randn(80, 32)
    packs = _packs()[0]
    for _ in range(3):
        torch.testing.assert_close(fn(x, w), x @ w.t(), rtol=1e-4, atol=1e-4)
    assert _packs()[0] == packs + 1
    w.mul_(-2)
    torch.testing.assert_close(fn(x, w), x @ w.t(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fn(x, w), x @ w.t(), rtol=1e-4, atol=1e-4)


def test_inference_mode_weights():
    """Inference tensors have no version counter: they run addmm, correctly."""
    with torch.inference_mode():
        m, x = _mlp(), torch.randn(8, 64)
        fn = ember.compile(m)
        for _ in range(3):
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-4)
        m[0].weight.add_(1)
        torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-4)


def test_training_forward_not_packed():
    """The training row's shape: forward + backward compiled, the optimizer eager; grads as eager's."""
    m, x, y = _mlp(), torch.randn(8, 64), torch.randint(0, 70, (8,))
    m.train()
    twin = _mlp().train()
    fn = ember.compile(m)
    packs = _packs()[0]
    for _ in range(3):
        for mod, f in ((m, fn), (twin, twin)):
            mod.zero_grad()
            F.cross_entropy(f(x), y).backward()
            with torch.no_grad():
                for p in mod.parameters():
                    p.sub_(0.1 * p.grad)
        for p, q in zip(m.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert _packs()[0] == packs


@pytest.mark.parametrize("batch", [1, 5, 8, 40])
def test_other_batch_than_packed(batch):
    """_mkl_linear at a batch other than the packed one (its internal plain GEMM path)."""
    w, b = torch.nn.Parameter(torch.randn(96, 64)), torch.randn(96)
    site = PackedLinear("addmm", 8, 96, 64)
    with torch.no_grad():
        site(b, torch.randn(8, 64), w)  # packs for M=8
        x = torch.randn(batch, 64)
        torch.testing.assert_close(site(b, x, w), torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-5)
        mm = PackedLinear("mm", 8, 96, 64)
        mm(torch.randn(8, 64), w)
        torch.testing.assert_close(mm(x, w), x @ w.t(), rtol=1e-5, atol=1e-5)


def test_rules_large_batch_and_narrow_output_keep_addmm():
    """RULES: M above 128 or N below 64 keep ATen's addmm (where packing measured no faster)."""
    from ember.native.ir import BufferArg, ExternNode, Layout
    aten = torch.ops.aten

    def node(M, N, K):
        args = (BufferArg("b", (N,), (1,), 0), BufferArg("x", (M, K), (K, 1), 0), BufferArg("w", (K, N), (1, K), 0))
        cpu = torch.device("cpu")
        lay = {"b": Layout((N,), (1,), torch.float32, cpu), "x": Layout((M, K), (K, 1), torch.float32, cpu),
               "w": Layout((N, K), (K, 1), torch.float32, cpu)}
        return ExternNode("buf0", aten.addmm.default, args, {}, [("buf0", None)]), lay
    e, lay = node(32, 1024, 512)
    assert packed_linear.plan(e, lay, {"w", "b", "x"}) == "PackedLinear('addmm', 32, 1024, 512)"
    assert packed_linear.plan(e, lay, {"b", "x"}) is None  # a weight computed in the graph
    for M, N in ((129, 1024), (32, 10)):
        e, lay = node(M, N, 512)
        assert packed_linear.plan(e, lay, {"w", "b", "x"}) is None


def test_option_off():
    """Native option packed_linear=False: ATen's addmm, the same results."""
    from ember.native import compile_aten_graph
    from tests.native.harness import trace
    m, x = _mlp(), torch.randn(8, 64)
    with torch.no_grad():
        args = [x, m[0].weight.detach(), m[0].bias.detach()]
        gm = trace(lambda x, w, b: F.linear(x, w, b), args)
        packs = _packs()
        for opt in (False, True):
            fn = compile_aten_graph(gm, args, options={"packed_linear": opt})
            for _ in range(3):
                out = fn(*args)
                torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, F.linear(*args),
                                           rtol=1e-4, atol=1e-4)
            assert (_packs()[0] > packs[0]) == opt


def test_budget_caps_packed_memory(monkeypatch):
    """Past BUDGET_BYTES of packed copies a site runs addmm (same results); a dropped site frees its share."""
    w, b = torch.nn.Parameter(torch.randn(96, 64)), torch.randn(96)
    x = torch.randn(8, 64)
    before = packed_linear._live[0]
    monkeypatch.setattr(packed_linear, "BUDGET_BYTES", before)  # nothing more fits
    site = PackedLinear("addmm", 8, 96, 64)
    with torch.no_grad():
        packs = _packs()[0]
        torch.testing.assert_close(site(b, x, w), torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-5)
        assert _packs()[0] == packs and site.packed is None
        monkeypatch.setattr(packed_linear, "BUDGET_BYTES", before + (64 << 20))
        torch.testing.assert_close(site(b, x, w), torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-5)
        assert _packs()[0] == packs + 1 and packed_linear._live[0] > before
    del site
    assert packed_linear._live[0] == before


needs_onednn = pytest.mark.skipif(not packed_linear.onednn_available(), reason="torch built without oneDNN")


def _act_mlp(act, d0=64, d1=160, out=48):
    torch.manual_seed(0)
    a = {"relu": torch.nn.ReLU(), "gelu": torch.nn.GELU()}[act]
    return torch.nn.Sequential(torch.nn.Linear(d0, d1), a, torch.nn.Linear(d1, out)).eval()


@needs_onednn
@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("shape", [(300, 64), (3, 100, 64)])
def test_large_batch_activation_runs_onednn_and_matches_eager(act, shape):
    """A large-batch Linear + ReLU/GELU (``_addmm_activation`` after cpu_mm) runs oneDNN's packed linear with
    the bias and activation in its epilogue; a 3-D input reaches it as a [M, K] view of its buffer."""
    m, x = _act_mlp(act), torch.randn(*shape)
    fn = ember.compile(m)
    packs, calls = _packs()
    for _ in range(3):
        _check(fn, m, x)
    assert _packs()[0] - packs == 1  # the first layer's weight, packed once (the second Linear runs mm)
    assert _packs()[1] - calls == 3


@needs_onednn
@pytest.mark.parametrize("how", ["no_grad_add", "data_assign", "optimizer_step"])
def test_large_batch_activation_weight_update_repacks(how):
    """The oneDNN packed copy is checked as MKL's: an update of the weight shows in the next call."""
    m, x = _act_mlp("relu"), torch.randn(300, 64)
    fn = ember.compile(m)
    for _ in range(2):
        _check(fn, m, x)
    w = m[0].weight
    packs = _packs()[0]
    if how == "no_grad_add":
        with torch.no_grad():
            w.add_(0.5)
    elif how == "data_assign":
        w.data = torch.randn_like(w)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    _check(fn, m, x)
    assert _packs()[0] > packs


@needs_onednn
def test_large_batch_activation_inference_tensors_fall_back():
    """Inference tensors (no version counter): ATen's _addmm_activation, the same results."""
    with torch.inference_mode():
        m, x = _act_mlp("gelu"), torch.randn(300, 64)
        fn = ember.compile(m)
        packs = _packs()[0]
        for _ in range(2):
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-4)
        assert _packs()[0] == packs


def test_rules_activation_site():
    """``_addmm_activation`` of cpu_mm.MIN_ROWS rows or more goes to oneDNN with its activation; without
    oneDNN, or with an unknown keyword, it keeps ATen's op."""
    from ember.native.ir import BufferArg, ExternNode, Layout
    aten = torch.ops.aten
    cpu = torch.device("cpu")
    M, N, K = 2048, 1024, 256
    args = (BufferArg("b", (N,), (1,), 0), BufferArg("x", (M, K), (K, 1), 0), BufferArg("w", (K, N), (1, K), 0))
    lay = {"b": Layout((N,), (1,), torch.float32, cpu), "x": Layout((16, 128, K), (128 * K, K, 1), torch.float32, cpu),
           "w": Layout((N, K), (K, 1), torch.float32, cpu)}

    def plan(**kw):
        e = ExternNode("buf0", aten._addmm_activation.default, args, kw, [("buf0", None)])
        return packed_linear.plan(e, lay, {"w", "b"})
    if packed_linear.onednn_available():
        assert plan(use_gelu=False) == "PackedLinear('addmm_act', 2048, 1024, 256, 'relu')"
        assert plan(use_gelu=True) == "PackedLinear('addmm_act', 2048, 1024, 256, 'gelu')"
        assert plan() == "PackedLinear('addmm_act', 2048, 1024, 256, 'relu')"
    assert plan(use_gelu=False, beta=2) is None
    import unittest.mock
    with unittest.mock.patch.object(packed_linear, "onednn_available", lambda: False):
        assert plan(use_gelu=False) is None
    with pytest.raises(ValueError, match="activation"):
        PackedLinear("addmm", 8, 96, 64, "relu")
