"""Patchify convolutions (stride == kernel, no padding: a ViT's patch embedding) become a gather and
one matmul (ember/native/patchify.py). Values, strides and gradients match eager's convolution;
convolutions whose windows overlap, pad, dilate, group or transpose are left alone; the device/dtype
table keeps CPU graphs (C++ path) on the convolution."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functionalize

pytest.importorskip("triton")

from ember.native import DECOMPOSITIONS, backend, patchify  # noqa: E402
from tests.native.harness import DEVICE, run_case, trace  # noqa: E402

aten = torch.ops.aten
CL = torch.channels_last
# eager's fp32 convolution on a GPU runs on TF32 tensor cores
TOL = dict(atol=5e-3, rtol=5e-3) if DEVICE == "cuda" else dict(atol=1e-4, rtol=1e-4)
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _rewritten(fn, inputs) -> int:
    gm = trace(fn, inputs)
    n = patchify.rewrite(gm, on_cpu=True)
    if n:
        assert aten.convolution.default not in _targets(gm)
    return n


def _case(d, n=2, c=3, o=5, k=4, size=8, bias=True):
    torch.manual_seed(0)
    x = torch.randn(n, c, *[size + i for i in range(d)], device=DEVICE)  # unequal spatial sizes
    w = torch.randn(o, c, *[k] * d, device=DEVICE) * 0.2
    b = torch.randn(o, device=DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_patchify_matches_eager_and_keeps_eager_strides(d, bias):
    # spatial sizes 8, 9, 10 with kernel 4: 9 and 10 leave positions the convolution drops
    x, w, b = _case(d, bias=bias)
    conv = CONV[d]

    def f(x, w, b):
        return conv(x, w, b, stride=4)  # returned as it is: eager's contiguous strides
    inputs = [x, w, b]
    assert _rewritten(f, inputs) == 1
    run_case(f, inputs, **TOL)  # (checks output strides against eager's)


def test_channels_last_input_and_weight():
    x, w, b = _case(2, c=6, size=12)
    x, w = x.to(memory_format=CL), w.to(memory_format=CL)

    def f(x, w, b):
        y = F.conv2d(x, w, b, stride=4)  # eager: channels_last, which the matmul's rows give as they are
        return y, y.relu().sum(dim=1)
    assert _rewritten(f, [x, w, b]) == 1
    gm = trace(f, [x, w, b])
    patchify.rewrite(gm, on_cpu=True)
    # (k, k, C) patch rows for a channels-last input: no final clone to eager's layout is needed
    assert _targets(gm).count(aten.clone.default) == 1
    run_case(f, [x, w, b], **TOL)


def test_channels_last_input_contiguous_weight():
    x, w, b = _case(2, c=4, size=9)
    x = x.to(memory_format=CL)
    f = lambda x, w, b: F.conv2d(x, w, b, stride=4) * 2  # noqa: E731
    assert _rewritten(f, [x, w, b]) == 1
    run_case(f, [x, w, b], **TOL)


def test_conv1d_over_a_transposed_sequence():
    """A [N, L, C] sequence read as conv1d's [N, C, L] (channel stride 1): patch rows in (k, C)
    order, the weight copied into that order, eager's contiguous result kept."""
    torch.manual_seed(0)
    seq, w, b = torch.randn(2, 22, 6, device=DEVICE), torch.randn(5, 6, 4, device=DEVICE), torch.randn(5, device=DEVICE)
    f = lambda seq, w, b: F.conv1d(seq.transpose(1, 2), w, b, stride=4)  # noqa: E731
    assert _rewritten(f, [seq, w, b]) == 1
    run_case(f, [seq, w, b], **TOL)


def test_symbolic_sizes_are_left_alone():
    x, w, b = _case(2, size=8)
    gm = trace(lambda x, w, b: F.conv2d(x, w, b, stride=4), [x, w, b], tracing_mode="symbolic")
    assert patchify.rewrite(gm, on_cpu=True) == 0


def test_vit_patch_embedding_shape_and_its_consumers():
    """The ViT's own use: flatten(2).transpose(1, 2), a class token, a position embedding, a norm."""
    torch.manual_seed(0)
    n, c, dim, p, hw = 2, 3, 16, 4, 16
    x = torch.randn(n, c, hw, hw, device=DEVICE)
    w, b = torch.randn(dim, c, p, p, device=DEVICE) * 0.2, torch.randn(dim, device=DEVICE)
    cls, pos = torch.randn(1, 1, dim, device=DEVICE), torch.randn(1, (hw // p) ** 2 + 1, dim, device=DEVICE)

    def f(x, w, b, cls, pos):
        y = F.conv2d(x, w, b, stride=p).flatten(2).transpose(1, 2)
        y = torch.cat([cls.expand(n, -1, -1), y], 1) + pos
        return F.layer_norm(y, (dim,))
    assert _rewritten(f, [x, w, b, cls, pos]) == 1
    report = run_case(f, [x, w, b, cls, pos], **TOL).ember_native["report"]
    if DEVICE == "cpu":  # (on a GPU fp32 keeps the convolution: patchify.APPLY)
        assert "aten.convolution.default" not in report["extern_ops"], report


def test_conv_output_viewed_as_eager_laid_it_out():
    """A view traced on eager's contiguous result (not viewable on the matmul's channels-last rows)
    still gets eager's values, also when the graph runs as ATen code."""
    x, w, b = _case(2, size=8)
    f = lambda x, w, b: F.conv2d(x, w, b, stride=4).view(2, -1) + 1  # noqa: E731
    gm = trace(f, [x, w, b])
    assert patchify.rewrite(gm, on_cpu=True) == 1
    torch.testing.assert_close(gm(x, w, b), f(x, w, b), **TOL)  # the rewritten graph, run by ATen
    run_case(f, [x, w, b], **TOL)


@pytest.mark.parametrize("kwargs, why", [
    (dict(stride=2), "overlapping windows"),
    (dict(stride=4, padding=1), "padding"),
    (dict(stride=4, dilation=2), "dilation"),
    (dict(stride=(4, 2)), "stride differs from the kernel in one dim"),
])
def test_not_a_patchify_is_left_alone(kwargs, why):
    x, w, b = _case(2, size=12)
    f = lambda x, w, b: F.conv2d(x, w, b, **kwargs)  # noqa: E731
    assert _rewritten(f, [x, w, b]) == 0, why
    run_case(f, [x, w, b], **TOL)


def test_groups_transposed_and_1x1_are_left_alone():
    x, w, b = _case(2, c=4, o=6, size=8)
    assert _rewritten(lambda x, w: F.conv2d(x, w[:, :2], stride=4, groups=2), [x, w]) == 0
    wt = torch.randn(4, 5, 4, 4, device=DEVICE)
    assert _rewritten(lambda x, w: F.conv_transpose2d(x, w, stride=4), [x, wt]) == 0
    assert _rewritten(lambda x, w: F.conv2d(x, w[:, :, :1, :1]), [x, w]) == 0


def test_gradients_flow_through_the_compiled_forward():
    """Training: the forward graph's convolution is rewritten; the backward keeps eager's
    convolution_backward on the same saved input and weight. Input, weight and bias grads match."""
    from ember.aot import aot_autograd
    from ember.native import compile_aten_graph
    reports = []

    def native(gm, example_inputs):
        fn = compile_aten_graph(gm, example_inputs, force_triton=True)
        reports.append(fn.ember_native["report"])
        return fn
    conv = torch.nn.Conv2d(3, 8, 4, stride=4).to(DEVICE)

    def f(x, w, b):
        y = F.conv2d(x, w, b, stride=4).flatten(2).transpose(1, 2)
        return (y.tanh() * torch.arange(8., device=y.device)).sum()
    x = torch.randn(2, 3, 10, 9, device=DEVICE, requires_grad=True)
    w, b = (p.detach().clone().requires_grad_() for p in (conv.weight, conv.bias))
    compiled = aot_autograd(fw_compiler=native, bw_compiler=native, decompositions=DECOMPOSITIONS)(
        torch.fx.symbolic_trace(f), [x, w, b])
    out = compiled(x, w, b)
    out = out[0] if isinstance(out, (tuple, list)) else out
    got = torch.autograd.grad(out, [x, w, b])
    ref = torch.autograd.grad(f(x, w, b), [x, w, b])
    torch.testing.assert_close(out, f(x, w, b), **TOL)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, **TOL)
    if DEVICE == "cpu":
        assert "aten.convolution.default" not in reports[0]["extern_ops"], reports[0]
    assert "aten.convolution_backward.default" in reports[1]["extern_ops"], reports[1]


def _fake_graph(dtype, device="cuda"):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.empty(4, 3, 32, 32, device=device, dtype=dtype)
        w = torch.empty(16, 3, 16, 16, device=device, dtype=dtype)
        b = torch.empty(16, device=device, dtype=dtype)
    f = lambda x, w, b: F.conv2d(x, w, b, stride=16).flatten(2).transpose(1, 2) + 1  # noqa: E731
    return make_fx(functionalize(f), decomposition_table=DECOMPOSITIONS, tracing_mode="fake")(x, w, b), [x, w, b]


@pytest.mark.parametrize("dtype, device, expected", [
    (torch.bfloat16, "cuda", 1), (torch.float16, "cuda", 1),
    (torch.float32, "cuda", 0),  # eager's fp32 convolution runs on TF32, an fp32 matmul would not
    (torch.bfloat16, "cpu", 0), (torch.float32, "cpu", 0),  # CPU keeps MKL-DNN's convolution
])
def test_device_and_dtype_table(dtype, device, expected):
    gm, _ = _fake_graph(dtype, device)
    assert patchify.rewrite(gm) == expected


def test_cuda_plan_has_one_gather_and_one_matmul_with_provenance():
    """The ViT-shaped graph on (fake) CUDA bf16 tensors, planned without running: the convolution
    is gone, the gather is one kernel, its consumer reads the matmul's rows through the views, and
    the output code says where the matmul came from."""
    from ember.native import wrapper
    gm, inputs = _fake_graph(torch.bfloat16)
    opts = backend.NativeOptions(small_mm_flops=0)
    g, _, sched, emitted = backend.plan(gm, inputs, opts)
    assert sched.report["extern_ops"] == ["aten.addmm.default"], sched.report
    assert sched.report["kernels"] == 2, sched.report  # the gather; the +1 reading the product
    kernels = {id(s): (f"k{i}", ek, "path") for i, (s, ek) in enumerate(emitted)}
    src = wrapper.WrapperCodegen(sched, kernels, {}, "header", True).generate()
    assert "# extern addmm.default [patchify conv2d [4, 3, 32, 32] kernel=stride=[16, 16] as a matmul " \
           "[16, 768] x [768, 16] (patchify.py)]" in src, src


def test_option_turns_it_off():
    gm, inputs = _fake_graph(torch.bfloat16)
    _, _, sched, _ = backend.plan(gm, inputs, backend.NativeOptions(patchify_conv=False))
    assert "aten.convolution.default" in sched.report["extern_ops"]


# -- on a GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("n, img, k, width, dtype", [
    (4, 224, 16, 768, torch.bfloat16),    # ViT-B/16
    (2, 224, 14, 1024, torch.float16),    # ViT-L/14: K = 588, padded to 592 by pad_mm
    (2, 384, 14, 1152, torch.bfloat16),   # SigLIP-So400m/14: 384 % 14 = 6 rows and columns dropped
])
def test_gpu_patch_embeddings_compile_to_a_matmul_and_match_eager(n, img, k, width, dtype):
    torch.manual_seed(0)
    x = torch.randn(n, 3, img, img, device="cuda", dtype=dtype)
    w = (torch.randn(width, 3, k, k, device="cuda") * 0.05).to(dtype)
    b = torch.randn(width, device="cuda", dtype=dtype)
    cls = torch.randn(1, 1, width, device="cuda", dtype=dtype)
    pos = torch.randn(1, (img // k) ** 2 + 1, width, device="cuda", dtype=dtype)

    def f(x, w, b, cls, pos):
        y = F.conv2d(x, w, b, stride=k).flatten(2).transpose(1, 2)
        return F.layer_norm(torch.cat([cls.expand(n, -1, -1), y], 1) + pos, (width,)), F.conv2d(x, w, b, stride=k)
    report = run_case(f, [x, w, b, cls, pos], atol=5e-2, rtol=5e-2).ember_native["report"]
    assert "aten.convolution.default" not in report["extern_ops"], report
