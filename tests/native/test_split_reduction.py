"""Split reductions (split_reduction.py): a reduction with few outputs over a long range runs as a
partial reduction over chunks and a final one over the partials. The thresholds are options, lowered
here so that small shapes (fast in the Triton interpreter) split."""
import pytest
import torch

pytest.importorskip("triton")

from ember.native import backend, ir  # noqa: E402
from tests.native.harness import DEVICE, bn_relu_training_case, run_case, trace  # noqa: E402

# split anything over 64 elements per program that would run fewer than 16 programs
SPLIT = {"split_reduction_programs": 16, "split_reduction_numel": 64, "single_program_numel": 64}
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


def test_batch_norm_statistics_at_resnet_scale():
    """64 channels of 32*112*112 channels_last elements: 98 chunks of 4096 rows (a divisor, no tail),
    so the first kernel runs 98 * 64 / 16 = 392 programs (>= 2 per SM of an H100)."""
    x = torch.empty(32, 64, 112, 112, device="meta").to(memory_format=CL)
    g, _, sched, emitted = backend.plan(trace(lambda x: x.sum((0, 2, 3)), [x]), [x], dict(backend.DEFAULT_OPTIONS))
    part, final = g.nodes
    assert part.ranges == (98, 4096, 64) and part.reduced == (1,)
    assert final.ranges == (98, 64) and final.reduced == (0,)
    ek = emitted[0][1]
    assert ek.config.XBLOCK >= 16 and ek.xnumel // ek.config.XBLOCK >= 264


def test_training_batch_norm_forward_and_backward(native_cache):
    """Training batch norm + relu, channels_last, forward and backward: the statistics (var_mean)
    and the weight/bias gradients (sums over N, H, W) are all split."""
    fn, inputs = bn_relu_training_case()
    partials = _check(fn, inputs, 4, native_cache, atol=1e-4, rtol=1e-4)
    for p in partials:  # 144 rows of 8 channels: 16 chunks of 9 rows, C innermost
        assert p.ranges == (16, 9, 8) and p.reduced == (1,)
