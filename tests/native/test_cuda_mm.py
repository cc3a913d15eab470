"""CUDA matmul rewrites (ember/native/cuda_mm.py): a tanh GELU after an fp16/bf16 addmm runs in cuBLASLt's
epilogue (``_addmm_activation(use_gelu=True)``).

The graph tests run on CPU: graphs traced on CPU get fake CUDA meta values (``_as_cuda``), which is all
the pass reads. ``tests/native/test_cuda_mm_gelu.py`` (gpu-marked) compiles GPT-2's MLP on the device."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import ember
from ember.native import cuda_mm, passes
from ember.native.options import NativeOptions
from tests.native.harness import trace

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path))
    monkeypatch.delenv("DISABLE_ADDMM_CUDA_LT", raising=False)
    ember.reset()


def new_gelu(x):
    """transformers' NewGELUActivation (GPT-2's ``gelu_new``), as written there."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def fast_gelu(x):
    """transformers' FastGELUActivation: the same function, factored differently."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTS = {"new_gelu": new_gelu, "fast_gelu": fast_gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu}


def _as_cuda(gm, device="cuda"):
    """Every tensor meta value of gm replaced by a fake tensor of the same sizes, strides and dtype on
    ``device`` (what a graph traced from CUDA inputs carries)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            with mode:
                n.meta["val"] = torch.empty_strided(tuple(v.shape), v.stride(), dtype=v.dtype, device=device)
    return gm


def _count(gm, target):
    return sum(n.target is target for n in gm.graph.nodes)


def _mlp(act):
    """GPT-2's MLP as its ATen graph has it: Conv1D = addmm(bias, x 2-D, w [K, N]) viewed 3-D, act, fc2."""
    def f(x, w1, b1, w2, b2):
        h = torch.addmm(b1, x.view(-1, x.shape[-1]), w1).view(*x.shape[:-1], -1)
        h = act(h)
        return torch.addmm(b2, h.view(-1, h.shape[-1]), w2).view(*x.shape[:-1], -1)
    return f


def _inputs(dtype=torch.bfloat16, b=2, s=8, d=16, n=64):
    g = torch.Generator().manual_seed(0)
    mk = lambda *sz: (torch.randn(*sz, generator=g) / math.sqrt(sz[0])).to(dtype)  # noqa: E731
    return [mk(b, s, d) * math.sqrt(b), mk(d, n), mk(n), mk(n, d), mk(d)]


@pytest.mark.parametrize("act", ["new_gelu", "fast_gelu", "gelu_tanh"])
def test_rewrite_on_cuda_graph(act):
    """The pass's own decision on a CUDA bf16 graph: one _addmm_activation, no tanh left; the rewritten
    graph run on CPU computes the same values (CPU's _addmm_activation is the erf GELU: see
    test_cpu_addmm_activation_is_erf_gelu for why the tolerance is 1e-3 here)."""
    inputs = _inputs()
    gm = _as_cuda(trace(_mlp(ACTS[act]), inputs))
    assert _count(gm, aten.tanh.default) + _count(gm, aten.gelu.default) >= 1
    assert cuda_mm.fuse_tanh_gelu(gm) == 1
    assert _count(gm, aten._addmm_activation.default) == 1 and _count(gm, aten.addmm.default) == 1
    assert _count(gm, aten.tanh.default) == 0 and _count(gm, aten.pow.Tensor_Scalar) == 0
    fused = [n for n in gm.graph.nodes if n.target is aten._addmm_activation.default][0]
    assert fused.kwargs == {"use_gelu": True} and fused.args[1].target is aten.view.default
    # the fc2 matmul reads the GELU's result through the same views as before
    fc2 = [n for n in gm.graph.nodes if n.target is aten.addmm.default][0]
    assert fc2.args[1].args[0].args[0] is fused
    ref = _mlp(ACTS[act])(*[t.double() for t in inputs])
    out = gm(*[t.double() for t in inputs])
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_whole_aten_gelu(approximate):
    """``aten.gelu`` left whole (a graph traced without decomp.py's table): its tanh form is taken, its
    erf form is not."""
    from torch.fx.experimental.proxy_tensor import make_fx
    inputs = _inputs()
    gm = _as_cuda(make_fx(_mlp(lambda h: F.gelu(h, approximate=approximate)), tracing_mode="fake")(*inputs))
    assert _count(gm, aten.gelu.default) == 1
    assert cuda_mm.fuse_tanh_gelu(gm) == (approximate == "tanh")
    assert _count(gm, aten.gelu.default) == (approximate == "none")


def test_no_rewrite_for_erf_gelu_and_other_functions():
    inputs = _inputs()
    for act in (F.gelu, lambda x: 0.5 * x * (1.0 + torch.tanh(0.8 * (x + 0.044715 * x ** 3))),  # (other constant)
                lambda x: x * torch.tanh(x), F.relu):
        gm = _as_cuda(trace(_mlp(act), inputs))
        assert cuda_mm.fuse_tanh_gelu(gm) == 0
        assert _count(gm, aten._addmm_activation.default) == 0


def test_no_rewrite_when_the_preactivation_is_used():
    """Another user of the addmm's result (or of a piece of the formula): it must stay computed."""
    inputs = _inputs()
    gm = _as_cuda(trace(lambda *a: (lambda h: (new_gelu(h), h))(_mlp(lambda h: h)(*a)), inputs))
    assert cuda_mm.fuse_tanh_gelu(gm) == 0

    def shares_tanh(x, w1, b1):
        h = torch.addmm(b1, x.view(-1, x.shape[-1]), w1)
        t = torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0)))
        return 0.5 * h * (1.0 + t), t
    gm = _as_cuda(trace(shares_tanh, inputs[:3]))
    assert cuda_mm.fuse_tanh_gelu(gm) == 0


def test_no_rewrite_in_a_training_forward_graph():
    """ember's autograd layer on GPT-2's MLP: the forward graph keeps what the backward needs, so the
    formula is not alone on the matmul's result and the pass leaves it (the fused op has no backward)."""
    from ember.aot import aot_autograd
    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return gm

    inputs = _inputs(torch.float32)
    params = [torch.nn.Parameter(t.clone()) for t in inputs[1:]]
    f = ember.compile(lambda x, *ps: _mlp(new_gelu)(x, *ps), backend=aot_autograd(fw_compiler=fw))
    f(inputs[0], *params).sum().backward()
    fwd = graphs[0]
    assert _count(fwd, aten.tanh.default) == 1 and _count(fwd, aten.addmm.default) == 2
    for n in fwd.graph.nodes:  # (a bf16 graph on CUDA, as far as the pass can tell)
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype == torch.float32:
            n.meta["val"] = v.to(torch.bfloat16)
    assert cuda_mm.fuse_tanh_gelu(_as_cuda(fwd)) == 0


def test_no_rewrite_where_lt_would_decline_or_on_cpu():
    bf16 = _inputs()
    # fp32 (DTYPES: the epilogue's tanh accuracy is not documented to fp32's tolerance), fp16 is taken
    assert cuda_mm.fuse_tanh_gelu(_as_cuda(trace(_mlp(new_gelu), _inputs(torch.float32)))) == 0
    assert cuda_mm.fuse_tanh_gelu(_as_cuda(trace(_mlp(new_gelu), _inputs(torch.float16)))) == 1
    # a CPU graph: CPU's _addmm_activation is the erf GELU; cpu_mm has its own rules
    assert cuda_mm.fuse_tanh_gelu(trace(_mlp(new_gelu), bf16)) == 0
    # one row (Lt's sizes > 1), a 2-D bias, beta != 1
    x1 = bf16[0][:1, :1]
    assert cuda_mm.fuse_tanh_gelu(_as_cuda(trace(_mlp(new_gelu), [x1, *bf16[1:]]))) == 0
    full = torch.randn(16, 64).to(torch.bfloat16)
    gm = _as_cuda(trace(lambda x, w, b: new_gelu(torch.addmm(b, x.view(-1, 16), w)), [bf16[0], bf16[1], full]))
    assert cuda_mm.fuse_tanh_gelu(gm) == 0
    gm = _as_cuda(trace(lambda x, w, b: new_gelu(torch.addmm(b, x.view(-1, 16), w, beta=0.5)), bf16[:3]))
    assert cuda_mm.fuse_tanh_gelu(gm) == 0


def test_disabled_lt_env_leaves_the_graph(monkeypatch):
    monkeypatch.setenv("DISABLE_ADDMM_CUDA_LT", "1")
    assert cuda_mm.fuse_tanh_gelu(_as_cuda(trace(_mlp(new_gelu), _inputs()))) == 0


def test_registered_in_the_native_passes():
    """passes.run applies it (option ``fusion``); fusion=False leaves the graph alone."""
    gm = _as_cuda(trace(_mlp(new_gelu), _inputs()))  # (fc1: x [16, 16] @ w [16, 64])
    assert passes.run(gm, NativeOptions(fusion=False, small_mm_flops=0)).get("fusion") is None
    assert _count(gm, aten._addmm_activation.default) == 0
    # a matmul small_mm takes (default mode: 2*16*16*64 FLOPs <= small_mm_flops) keeps its addmm here
    assert passes.run(gm, NativeOptions(small_mm_flops=2 * 16 * 16 * 64))["fusion"] == 0
    assert passes.run(gm, NativeOptions(small_mm_flops=0))["fusion"] == 1
    assert _count(gm, aten._addmm_activation.default) == 1


def test_cpu_addmm_activation_is_erf_gelu():
    """What the CPU checks above prove: on CPU ATen's _addmm_activation(use_gelu=True) is addmm then the
    erf GELU (its fallback), 5e-4 at most from the tanh formula, so CPU runs check the rewrite's wiring
    (argument order, views, users) to 1e-3 but not the CUDA epilogue's numbers: the gpu test does that.
    It is also why the pass never fires on CPU graphs (eager's CPU result is the formula's)."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(64, 32, generator=g, dtype=torch.float64), torch.randn(32, 48, generator=g,
               dtype=torch.float64) / 4, torch.randn(48, generator=g, dtype=torch.float64))
    got = aten._addmm_activation(b, x, w, use_gelu=True)
    pre = torch.addmm(b, x, w)
    torch.testing.assert_close(got, F.gelu(pre), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, new_gelu(pre), rtol=0, atol=1e-3)
    assert (got - new_gelu(pre)).abs().max() > 1e-6  # (so not the tanh form: a CPU rewrite would change results)


def test_generated_wrapper_calls_addmm_activation(monkeypatch, tmp_path):
    """The rewritten graph through the Triton path's lowering and wrapper (TRITON_INTERPRET on CPU: the pass
    let onto CPU fp32 graphs for this test only): the wrapper calls ATen's _addmm_activation with use_gelu,
    and its result equals the rewritten graph run op by op."""
    from ember.native import compile_aten_graph
    monkeypatch.setattr(cuda_mm, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(cuda_mm, "DTYPES", (torch.float32,))
    inputs = _inputs(torch.float32)
    gm = trace(_mlp(new_gelu), inputs)
    compiled = compile_aten_graph(gm, inputs, force_triton=True, options={"small_mm_flops": 0})
    assert compiled.ember_native.get("reason") is None, compiled.ember_native
    assert compiled.ember_native["wrapper"].startswith(str(tmp_path))  # (where the gpu test looks for it)
    src = open(compiled.ember_native["wrapper"]).read()
    assert "_addmm_activation" in src and "use_gelu=True" in src, src
    assert "tanh" not in src  # (no kernel computes it)
    want = _mlp(lambda h: F.gelu(h))(*inputs)  # (CPU's _addmm_activation: the erf GELU)
    out = compiled(*inputs)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, want, rtol=1e-5, atol=1e-5)
