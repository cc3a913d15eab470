"""max_pool2d_with_indices_backward lowered in gather form (lower_pool.py): bit-equal to eager in
float32, routed by the indices it is given (never a recomputed argmax), native in a training graph,
and ATen where the lowering declines (dilation)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from ember.native import compile_aten_graph  # noqa: E402
from tests.native.harness import DEVICE, trace  # noqa: E402

aten = torch.ops.aten


def _compile(fn, inputs, tmp_path):
    compiled = compile_aten_graph(trace(fn, inputs), inputs, force_triton=True, options={"cache_dir": str(tmp_path)})
    assert compiled.ember_native.get("reason") is None, compiled.ember_native.get("reason")
    return compiled


def _bwd(k, s, p, ceil_mode, d=1):
    def fn(g, x, idx):
        return aten.max_pool2d_with_indices_backward(g, x, list(k), list(s), list(p), [d, d], ceil_mode, idx)
    return fn


# (kernel, stride, padding, ceil_mode): ResNet's stem, non-overlapping, stride 1, ceil_mode tails,
# stride past the kernel (inputs no window covers), asymmetric windows
CASES = [((3, 3), (2, 2), (1, 1), False), ((2, 2), (2, 2), (0, 0), False), ((3, 3), (1, 1), (1, 1), False),
         ((3, 3), (2, 2), (0, 0), True), ((2, 2), (3, 3), (0, 0), False), ((3, 2), (2, 1), (1, 0), True)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("k,s,p,ceil_mode", CASES)
def test_float32_bit_equal(k, s, p, ceil_mode, channels_last, tmp_path):
    """Integer-valued inputs tie often between overlapping windows; the sums of up to four windows'
    gradients are added in eager's order, so float32 results are identical bits."""
    torch.manual_seed(0)
    x = torch.randint(0, 3, (2, 5, 11, 10), device=DEVICE).float()
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    _, idx = F.max_pool2d(x, k, s, p, ceil_mode=ceil_mode, return_indices=True)
    g = torch.randn(idx.shape, device=DEVICE) * 1e3 + 0.1  # (digits that a different order would round off)
    if channels_last:
        g = g.contiguous(memory_format=torch.channels_last)
    fn = _bwd(k, s, p, ceil_mode)
    compiled = _compile(fn, [g, x, idx], tmp_path)
    got, want = compiled(g, x, idx), fn(g, x, idx)
    assert torch.equal(got, want)
    assert got.stride() == want.stride()
    assert compiled.ember_native["report"]["externs"] == 0, compiled.ember_native["report"]


def test_indices_decide(tmp_path):
    """Indices that are not the argmax (any in-window position, as eager's forward may pick among
    ties or NaNs): the gradient goes where they point."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 9, 9, device=DEVICE)
    _, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    oh = torch.arange(idx.shape[2], device=DEVICE)[:, None]
    ow = torch.arange(idx.shape[3], device=DEVICE)[None, :]
    dh = torch.randint(0, 3, idx.shape, device=DEVICE)
    dw = torch.randint(0, 3, idx.shape, device=DEVICE)
    h = (oh * 2 - 1 + dh).clamp(0, 8)
    w = (ow * 2 - 1 + dw).clamp(0, 8)
    idx = h * 9 + w
    g = torch.randn(idx.shape, device=DEVICE)
    fn = _bwd((3, 3), (2, 2), (1, 1), False)
    got = _compile(fn, [g, x, idx], tmp_path)(g, x, idx)
    assert torch.equal(got, fn(g, x, idx))


def test_training_graph_is_native(tmp_path):
    """The forward pool and its backward in one traced graph (vjp): the backward runs no ATen call."""
    torch.manual_seed(0)
    x = torch.randint(0, 4, (2, 4, 10, 10), device=DEVICE).float().to(memory_format=torch.channels_last)
    grad = torch.randn(2, 4, 5, 5, device=DEVICE).contiguous(memory_format=torch.channels_last)

    def fn(x, grad):
        y, vjp = torch.func.vjp(lambda x: F.max_pool2d(x, 3, 2, 1), x)
        return (y,) + tuple(vjp(grad))
    compiled = _compile(fn, [x, grad], tmp_path)
    got, want = compiled(x, grad), fn(x, grad)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert compiled.ember_native["report"]["externs"] == 0, compiled.ember_native["report"]


def test_dilation_declines_to_aten(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 11, device=DEVICE)
    _, idx = F.max_pool2d(x, 3, 2, 1, dilation=2, return_indices=True)
    g = torch.randn(idx.shape, device=DEVICE)
    fn = _bwd((3, 3), (2, 2), (1, 1), False, d=2)
    compiled = _compile(fn, [g, x, idx], tmp_path)
    assert torch.equal(compiled(g, x, idx), fn(g, x, idx))
    assert compiled.ember_native["report"]["externs"] == 1, compiled.ember_native["report"]
