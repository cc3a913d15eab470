"""Split reductions (split_reduction.py): a reduction with few outputs over a long range runs as a
partial reduction over chunks and a final one over the partials. The thresholds are options, lowered
here so that small shapes (fast in the Triton interpreter) split."""
import pytest
import torch

pytest.importorskip("triton")

from ember.native import backend, ir, split_reduction  # noqa: E402
from tests.native.harness import DEVICE, bn_relu_training_case, run_case, trace  # noqa: E402

# split anything over 64 elements per program that would run fewer than 16 programs (strided
# reductions: into chunks of 9 rows or more)
SPLIT = {"split_reduction_programs": 16, "split_reduction_numel": 64, "single_program_numel": 64,
         "split_outer_rows": 9}
CL = torch.channels_last


def _split_nodes(fn, inputs, options=SPLIT):
    g, _, sched, _ = backend.plan(trace(fn, inputs), inputs, dict(backend.DEFAULT_OPTIONS, **options))
    return [n for n in g.nodes if isinstance(n, ir.ComputedNode) and n.name.endswith("_partial")], g, sched


def _check(fn, inputs, splits, cache_dir, **tol):
    partials, _, _ = _split_nodes(fn, inputs)
    assert len(partials) == splits, [(n.name, n.ranges) for n in partials]
    run_case(fn, inputs, options=SPLIT, cache_dir=cache_dir, **tol)
    return partials


CASES = {  # name -> (fn, input shape, number of split reductions, whether the last chunk has a tail)
    "sum_rows": (lambda x: x.sum(1), (3, 1000), 1, False),
    "sum_all": (lambda x: x.sum(), (7, 149), 1, True),          # 1043 = 7 * 149: no divisor near 16
    "mean_cols": (lambda x: x.mean(0), (999, 5), 1, False),     # strided reduction, contiguous kept dim
    "max_min": (lambda x: (x.amax(1), x.amin(1)), (4, 997), 2, True),  # tails filled with -inf / inf
    "var_mean": (lambda x: torch.var_mean(x, (0, 2), correction=1), (50, 3, 40), 2, False),  # two sums
    "any_all": (lambda x: ((x > 2.5).any(1), (x > -3).all(1)), (2, 3001), 2, True),
    "int_sum": (lambda x: (x * 100).long().sum(1), (3, 778), 1, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_split_matches_eager(name, native_cache):
    fn, shape, splits, tail = CASES[name]
    torch.manual_seed(0)
    # 1e-4, not fp32's 1.3e-6: splitting reorders sums of up to ~2000 terms by design (as optable's
    # sum_large_r); the error grows with the number of terms
    partials = _check(fn, [torch.randn(shape, device=DEVICE)], splits, native_cache, atol=1e-4, rtol=1e-4)
    assert all(any(e.op == "masked" for e in ir.walk([p.body])) == tail for p in partials)


def test_argmax_is_not_split(native_cache):
    x = torch.randn(3, 1000, device=DEVICE)
    _check(lambda x: (x.argmax(1), x.amax(1)), [x], 1, native_cache)


def test_low_precision_partials_are_fp32(native_cache):
    x = torch.randn(4, 2000, device=DEVICE, dtype=torch.bfloat16)
    (p,) = _check(lambda x: x.sum(1), [x], 1, native_cache, atol=1e-2, rtol=1e-2)
    assert p.layout.dtype == torch.float32


def test_no_split_at_default_thresholds_for_small_or_wide_reductions():
    # 8 rows of 20000: short loops per program; 4096 rows: enough programs
    for shape in [(8, 20000), (4096, 512)]:
        partials, _, _ = _split_nodes(lambda x: x.sum(1), [torch.randn(shape)], {})
        assert not partials, shape


RESNET_BN = [(64, 112, 112), (256, 56, 56), (512, 28, 28), (1024, 14, 14), (2048, 7, 7)]


@pytest.mark.parametrize("c,h,w", RESNET_BN)
def test_batch_norm_statistics_at_resnet_scale(c, h, w):
    """BatchNorm statistics of ResNet-50's channels_last activations (batch 64): the Triton rule for
    strided reductions makes many short chunks (a divisor of N*H*W, no tail), so the partial kernel
    runs thousands of small programs, and the final kernel reduces them per channel."""
    x = torch.empty(64, c, h, w, device="meta").to(memory_format=CL)
    opts = backend.NativeOptions()
    g, _, sched, emitted = backend.plan(trace(lambda x: x.sum((0, 2, 3)), [x]), [x], opts)
    rows = 64 * h * w
    if len(g.nodes) == 1:  # not split: its programs are enough, or each loop is short
        assert rows * split_reduction.OUTER_XBLOCK < opts.split_reduction_numel
        return
    part, final = g.nodes
    count, chunk, kept = part.ranges
    assert part.reduced == (1,) and kept == c and count * chunk == rows
    assert chunk >= opts.split_outer_rows and count * c <= 2 * opts.split_outer_outputs
    assert final.ranges == (count, c) and final.reduced == (0,)
    ek = emitted[0][1]
    assert chunk % split_reduction.ALIGN_ROWS == 0  # (a divisor of N*H*W allows it at these shapes)
    assert not ek.config.persistent and ek.xnumel // ek.config.XBLOCK >= opts.split_reduction_programs // 2, ek.config


def test_cpp_renderer_keeps_few_long_chunks():
    """The C++ renderer's kernels parallelize over outputs with a few threads: the strided rule of
    the Triton kernels (thousands of chunks) is not theirs (98 chunks of 4096 rows here)."""
    x = torch.empty(32, 64, 112, 112, device="meta").to(memory_format=CL)
    g = trace(lambda x: x.sum((0, 2, 3)), [x])
    from ember.native import lowering
    ir_graph, _ = lowering.lower(g, [x])
    part, final = split_reduction.split_reductions(ir_graph, backend.NativeOptions(), "cpp").nodes
    assert part.ranges == (98, 4096, 64) and final.ranges == (98, 64)


@pytest.mark.parametrize("streams,hint", [(1, True), (5, True), (5, False)])
def test_strided_reduction_eviction_hints(streams, hint, native_cache, monkeypatch):
    """triton_emit.EVICTION: a one-pass looped strided reduction streams its rows with
    evict_first and keeps the per-channel vectors with evict_last; results unchanged."""
    from ember.native import triton_emit
    monkeypatch.setattr(triton_emit, "EVICTION", {"stream": "evict_first", "reused": "evict_last"} if hint else {})
    torch.manual_seed(0)
    ys = [torch.randn(4, 8, 6, 6, device=DEVICE).to(memory_format=CL) for _ in range(streams)]
    ys.append(torch.randn(8, device=DEVICE))

    def fn(*ys):
        *big, mean = ys
        g = torch.where(big[0] <= 0, 0, sum(big[1:], big[0]))
        return g * 2, g.sum((0, 2, 3)), (g * (big[-1] - mean[None, :, None, None])).sum((0, 2, 3))
    # unsplit, and not one program: one looped kernel over 144 rows (past the persistent limit)
    opts = {"split_reduction_programs": 1, "single_program_numel": 64}
    run_case(fn, ys, options=opts, cache_dir=native_cache, atol=1e-4, rtol=1e-4)
    _, _, _, emitted = backend.plan(trace(fn, ys), ys, dict(backend.DEFAULT_OPTIONS, **opts))
    looped = [ek.source for _, ek in emitted if ek.kind == "red"]
    assert looped
    assert any("eviction_policy='evict_first'" in src for src in looped) == hint
    assert any("eviction_policy='evict_last'" in src for src in looped) == hint


def test_training_batch_norm_forward_and_backward(native_cache):
    """Training batch norm + relu, channels_last, forward and backward: the statistics (var_mean)
    and the weight/bias gradients (sums over N, H, W) are all split."""
    fn, inputs = bn_relu_training_case()
    partials = _check(fn, inputs, 4, native_cache, atol=1e-4, rtol=1e-4)
    for p in partials:  # 144 rows of 8 channels: 16 chunks of 9 rows, C innermost
        assert p.ranges == (16, 9, 8) and p.reduced == (1,)
