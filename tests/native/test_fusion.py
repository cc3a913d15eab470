"""Structural checks: the fused patterns compile to exactly one Triton kernel (plus the extern
matmul where there is one), and the scheduler's bytes-moved report equals reading each input once
and writing each output once."""
import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ember.native.triton_helpers import erf_rational  # noqa: E402
from tests.native.harness import DEVICE, run_case  # noqa: E402
from tests.native.optable import OPS, f32  # noqa: E402

CASES = {c.name: c for c in OPS}
N, C = 13, 37
F4 = 4  # bytes per fp32
# pattern -> (kernel bytes, extern calls): inputs read once + outputs written once
EXPECTED = {
    "softmax": (2 * N * C * F4, 0),
    "log_softmax": (2 * N * C * F4, 0),
    "layer_norm": (2 * N * C * F4 + 2 * C * F4, 0),
    "rms_norm": (2 * N * C * F4 + C * F4, 0),
    "gelu_linear": (2 * 13 * 19 * F4 + 19 * F4, 1),        # mm result + bias in, activation out
    "cross_entropy": (N * C * F4 + N * 8 + F4, 0),          # logits, int64 targets, one scalar
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_one_kernel_and_bytes(name, native_cache):
    case = CASES[name]
    torch.manual_seed(0)
    compiled = run_case(case.fn, case.make(f32, DEVICE), atol=case.atol, rtol=case.rtol, cache_dir=native_cache)
    report = compiled.ember_native["report"]
    kbytes, externs = EXPECTED[name]
    assert report["kernels"] == 1, report
    assert report["externs"] == externs, report
    assert report["kernel_bytes"] == kbytes, report
    if externs:
        assert report["extern_ops"] == ["aten.mm.default"], report


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "cross_entropy"])
def test_fusion_saves_bytes(name, native_cache):
    """Without fusion the same graph runs several kernels and moves more bytes."""
    case = CASES[name]
    torch.manual_seed(0)
    inputs = case.make(f32, DEVICE)
    fused = run_case(case.fn, inputs, atol=case.atol, rtol=case.rtol, cache_dir=native_cache)
    unfused = run_case(case.fn, inputs, options={"fusion": False}, atol=case.atol, rtol=case.rtol,
                       cache_dir=native_cache)
    f, u = fused.ember_native["report"], unfused.ember_native["report"]
    assert u["kernels"] > f["kernels"] == 1
    assert u["bytes"] > f["bytes"]


def test_horizontal_fusion(native_cache):
    """Siblings reading the same input share one kernel (one read of x)."""
    torch.manual_seed(0)
    x = torch.randn(N, C, device=DEVICE)
    compiled = run_case(lambda x: (x.sin(), x.cos() * 2, x.exp() + 1), [x], cache_dir=native_cache)
    report = compiled.ember_native["report"]
    assert report["kernels"] == 1
    assert report["kernel_bytes"] == 4 * N * C * F4


def test_reduction_epilogue_and_prologue(native_cache):
    """sum((x*2).relu(), 1).sqrt(): prologue and epilogue in the reduction kernel."""
    torch.manual_seed(0)
    x = torch.randn(N, C, device=DEVICE)
    compiled = run_case(lambda x: (x * 2).relu().sum(1).sqrt() + 1, [x], cache_dir=native_cache)
    report = compiled.ember_native["report"]
    assert report["kernels"] == 1
    assert report["kernel_bytes"] == N * C * F4 + N * F4


def test_matmul_bias_activation_epilogue(native_cache):
    """Extern addmm/mm, then one kernel for bias + activation + residual."""
    torch.manual_seed(0)
    x, w, b, r = (torch.randn(13, 24, device=DEVICE), torch.randn(24, 19, device=DEVICE),
                  torch.randn(19, device=DEVICE), torch.randn(13, 19, device=DEVICE))
    compiled = run_case(lambda x, w, b, r: torch.relu(x @ w + b) + r, [x, w, b, r], atol=1e-5, rtol=1e-4,
                        cache_dir=native_cache)
    report = compiled.ember_native["report"]
    assert (report["kernels"], report["externs"]) == (1, 1), report


def test_layer_norm_over_3d_with_2d_epilogue_is_one_kernel(native_cache):
    """A transformer's layer norm reduces over [B, T, C] while its normalize pass is realized in the
    [B*T, C] view the next matmul reads: two shapes of the same points, fused into one kernel."""
    torch.manual_seed(0)
    B, T, C, H = 2, 6, 32, 16
    h, a = torch.randn(B, T, C, device=DEVICE), torch.randn(B, T, C, device=DEVICE)
    w, b = torch.randn(C, device=DEVICE), torch.randn(C, device=DEVICE)
    proj = torch.randn(C, H, device=DEVICE)

    def block(h, a, w, b, proj):
        y = torch.nn.functional.layer_norm(h + a, (C,), w, b)
        return (y.view(B * T, C) @ proj).view(B, T, H)
    compiled = run_case(block, [h, a, w, b, proj], cache_dir=native_cache)
    report = compiled.ember_native["report"]
    assert (report["kernels"], report["externs"]) == (1, 1), report


@pytest.mark.parametrize("emulate", [False, True])
def test_low_precision_casts_inside_a_kernel(native_cache, emulate):
    """bf16 ops fused into one kernel compute in fp32 without rounding between them (as
    torch.compile does); emulate_precision_casts rounds each op's result as eager does."""
    torch.manual_seed(0)
    x = torch.randn(8, 32, device=DEVICE, dtype=torch.bfloat16)
    compiled = run_case(lambda x: (x * 0.5 + 1).sigmoid() * x, [x], atol=2e-2, rtol=2e-2, cache_dir=native_cache,
                        options={"emulate_precision_casts": emulate})
    src = "".join(open(p).read() for p in compiled.ember_native["kernels"])
    rounds = src.count(".to(tl.bfloat16).to(tl.float32)")
    assert (rounds >= 3) if emulate else (rounds == 0), src


def _kernel_sources(compiled) -> str:
    return "".join(open(p).read() for p in compiled.ember_native["kernels"])


@pytest.mark.parametrize("dtype,fast", [(torch.bfloat16, True), (torch.float16, True), (torch.float32, False)])
def test_gelu_erf_form_follows_the_output_precision(dtype, fast, native_cache):
    """layer_norm + gelu: rounded to a half type, erf is the rational form (cheaper); in float32 it
    stays libdevice's (1 ulp)."""
    def fn(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (64,), w, b))
    torch.manual_seed(0)
    inputs = [torch.randn(8, 64, dtype=dtype, device=DEVICE) for _ in range(1)] + \
        [torch.randn(64, dtype=dtype, device=DEVICE) for _ in range(2)]
    compiled = run_case(fn, inputs, cache_dir=native_cache)
    src = _kernel_sources(compiled)
    assert ("erf_rational(" in src) is fast and ("tl.math.erf(" in src) is not fast, src


@triton.jit
def _erf_kernel(x_ptr, y_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y_ptr + i, erf_rational(tl.load(x_ptr + i, i < n)), i < n)


def test_erf_rational_accuracy():
    """The rational erf within 6e-7 of float64 erf over [-6, 6] and at tiny arguments (odd, so
    erf(x) ~ 2x/sqrt(pi) keeps its relative accuracy near 0); exact +-1 past +-4; NaN stays NaN."""
    x = torch.cat([torch.linspace(-6, 6, 20001), torch.logspace(-30, 0, 301), -torch.logspace(-30, 0, 301)])
    x = x.to(DEVICE)
    y = torch.empty_like(x)
    _erf_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), B=1024)
    ref = torch.erf(x.double())
    assert (y.double() - ref).abs().max().item() < 6e-7
    small = x.abs() < 1e-3
    assert ((y[small].double() - ref[small]).abs() / ref[small].abs()).max().item() < 1e-6
    assert bool((y[x.abs() >= 4] == torch.sign(x[x.abs() >= 4])).all())
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], device=DEVICE)
    out = torch.empty_like(special)
    _erf_kernel[(1,)](special, out, special.numel(), B=8)
    torch.testing.assert_close(out, torch.erf(special), equal_nan=True, rtol=0, atol=0)


def test_tiny_independent_kernels_merge_into_one_launch(native_cache):
    """Batch norm's ``num_batches_tracked + 1`` per layer: scalar updates that share no data become
    one kernel; the same at 2048 elements (above scheduler.TINY_NUMEL) stays one kernel each."""
    def counters(a, b, c):
        return a + 1, b + 1, c * 2
    ints = [torch.tensor(n, device=DEVICE) for n in (3, 5, 7)]
    assert run_case(counters, ints, cache_dir=native_cache).ember_native["report"]["kernels"] == 1
    big = [torch.randn(2048, device=DEVICE) for _ in range(3)]
    assert run_case(counters, big, cache_dir=native_cache).ember_native["report"]["kernels"] == 3


def test_a_cast_read_by_an_extern_and_returned_is_written_once(native_cache):
    """autocast's bf16 copy of a weight, read by the convolution and saved for the backward: one
    buffer, not the same values written twice."""
    def fn(x, w):
        wb = w.to(torch.bfloat16)
        return torch.nn.functional.conv2d(x.to(torch.bfloat16), wb), wb
    x, w = torch.randn(2, 4, 5, 5, device=DEVICE), torch.randn(6, 4, 3, 3, device=DEVICE)
    # (the interpreter rounds fp32 to bf16 by truncation: a looser tolerance than bf16's own)
    compiled = run_case(fn, [x, w], atol=0.3, rtol=0.05, cache_dir=native_cache)
    src = open(compiled.ember_native["wrapper"]).read()
    steady = src.split("    def call_first(")[0]  # (the first-call copy of the body: ember/native/extern_check.py)
    assert steady.count("dtype=torch.bfloat16)") == 2, src  # the two casts' buffers, nothing else
