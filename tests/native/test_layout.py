"""Layout propagation: realized intermediates take eager's strides when those are dense (channels_last
from convolutions flows through batch norm and relu), their loops run in memory order (stride-1 dim
innermost), and reductions loop in their input's memory order. Fusion stays correct when a permuted
iteration order and the logical one have the same sizes (C == H == W)."""
import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton")

from ember.native import backend, ir  # noqa: E402
from tests.native.harness import DEVICE, bn_relu_training_case, run_case, trace  # noqa: E402

CL = torch.channels_last


def _plan(fn, inputs, **options):
    g, _, sched, emitted = backend.plan(trace(fn, inputs), inputs, dict(backend.DEFAULT_OPTIONS, **options))
    return g, sched, emitted


def _conv_bn_relu_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    for m in net:
        if isinstance(m, nn.BatchNorm2d):  # eval statistics that are not the identity
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    net = net.to(DEVICE, memory_format=CL)
    state = {**dict(net.named_parameters()), **dict(net.named_buffers())}
    names = list(state)

    def fn(x, *tensors):
        with torch.no_grad():
            return torch.func.functional_call(net, dict(zip(names, tensors)), (x,))
    x = torch.randn(2, 3, 6, 5, device=DEVICE).to(memory_format=CL)
    return fn, [x] + [t.detach() for t in state.values()]


def test_conv_bn_relu_stays_channels_last(native_cache):
    fn, inputs = _conv_bn_relu_net()
    compiled = run_case(fn, inputs, cache_dir=native_cache)  # also checks output strides
    report = compiled.ember_native["report"]
    # one batch-norm + relu kernel after each convolution, and no copy (layout conversion) extern
    assert report["extern_ops"] == ["aten.convolution.default"] * 2, report
    assert report["kernels"] == 2, report
    g, _, _ = _plan(fn, inputs)
    computed = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert len(computed) == 2
    for n in computed:
        assert n.layout.strides == (240, 1, 40, 8), n.layout  # [2, 8, 6, 5] channels_last
        assert n.ranges == (2, 6, 5, 8), n.ranges  # loops N, H, W, C: C (stride 1) innermost
    conv2 = [n for n in g.nodes if isinstance(n, ir.ExternNode)][1]
    assert conv2.args[0].strides == (240, 1, 40, 8)  # the second convolution reads channels_last


def test_contiguous_intermediates_stay_contiguous():
    """No convolution, no permuted input: eager's strides are contiguous, and so are ours."""
    g, _, _ = _plan(lambda x: ((x * 2).relu() @ x.t(),), [torch.randn(4, 6, device=DEVICE)])
    (n,) = [n for n in g.nodes if isinstance(n, ir.ComputedNode)]
    assert n.layout.strides == (6, 1)


def _heavy(y):
    """Enough ops that a value used twice is realized instead of inlined (GraphLowering.should_realize)."""
    for _ in range(16):
        y = y.sin() * 1.5
    return y


def test_permuted_and_logical_orders_with_equal_sizes_do_not_fuse(native_cache):
    """y is channels_last [2, 4, 4, 4] and loops (N, H, W, C); z = y.contiguous() loops (N, C, H, W).
    Both iteration spaces are (2, 4, 4, 4), but z reads y at another point than where y's kernel
    writes it: they must not fuse vertically (the scheduler compares the indices)."""
    x = torch.randn(2, 4, 4, 4, device=DEVICE).to(memory_format=CL)

    def fn(x):
        y = _heavy(x)
        return y * 2, y.contiguous() + 1
    compiled = run_case(fn, [x], atol=1e-5, rtol=1e-5, cache_dir=native_cache)
    g, sched, _ = _plan(fn, [x])
    layouts = {n.name: n.layout.strides for n in g.nodes}
    assert sorted(layouts.values()) == sorted([(64, 1, 16, 4)] * 2 + [(64, 16, 4, 1)]), layouts
    assert compiled.ember_native["report"]["kernels"] == 2  # y with y * 2; then the contiguous copy


def test_reduction_epilogue_with_equal_sizes_does_not_fuse(native_cache):
    """sum over W of a channels_last y loops (N, H, [W], C) and keeps (N, H, C); its contiguous
    [N, C, H] result's epilogue loops (N, C, H): equal sizes, different points, no fusion."""
    x = torch.randn(2, 4, 4, 4, device=DEVICE).to(memory_format=CL)

    def fn(x):
        y = _heavy(x)
        return y * 2, y.sum(3) * 3 + 1
    run_case(fn, [x], atol=1e-5, rtol=1e-5, cache_dir=native_cache)
    g, sched, _ = _plan(fn, [x])
    red = next(n for n in g.nodes if isinstance(n, ir.ComputedNode) and n.is_reduction)
    assert red.ranges == (2, 4, 4, 4) and red.reduced == (2,)  # W, between H and C in memory order
    kernel_of = {n.name: k.name for k in sched.steps for n in k.nodes}
    epilogue = next(n for n in g.nodes if isinstance(n, ir.ComputedNode) and red.name in
                    {ld.attr[0] for ld in ir.loads_of(n.body)})
    assert kernel_of[epilogue.name] != kernel_of[red.name]


def test_reduction_over_channels_last_loops_in_memory_order():
    """Batch-norm statistics of a channels_last input: C (stride 1) is the kept loop, innermost, and
    the kernel's x block runs along it, so loads are coalesced."""
    x = torch.randn(4, 8, 6, 6, device=DEVICE).to(memory_format=CL)
    g, sched, emitted = _plan(lambda x: torch.var_mean(x, (0, 2, 3)), [x], split_reduction_programs=1)
    reds = [n for n in g.nodes if isinstance(n, ir.ComputedNode) and n.is_reduction]
    assert reds and all(n.ranges == (4, 6, 6, 8) and n.reduced == (0, 1, 2) for n in reds)
    (k, ek), = emitted
    assert k.ranges == (144, 8) and k.reduced == (0,)  # N*H*W merged into one loop
    assert ek.config.XBLOCK > 1 and "v1 = xindex" in ek.source


def test_argmax_keeps_logical_order(native_cache):
    """argmax returns a position in logical order: it must not loop in memory order."""
    x = torch.randn(2, 3, 4, 5, device=DEVICE).to(memory_format=CL)
    run_case(lambda x: (x.argmax(), x.argmax(1), x.amax((0, 2, 3))), [x], cache_dir=native_cache)


def test_training_batch_norm_channels_last(native_cache):
    """Forward and backward of a training batch norm + relu: the activations and the input gradient
    stay channels_last."""
    fn, inputs = bn_relu_training_case()
    x = inputs[0]
    run_case(fn, inputs, cache_dir=native_cache)
    g, _, _ = _plan(fn, inputs)
    big = [n for n in g.nodes if isinstance(n, ir.ComputedNode) and n.layout.numel == x.numel()]
    assert big and all(n.layout.strides == x.stride() for n in big)
