"""Launch configurations are powers of two for every size: real Triton rejects ``tl.arange`` over
anything else, and the interpreter used for the CPU tests does not check it."""
import types

import pytest

from ember.native.options import NativeOptions
from ember.native.triton_emit import choose_config

OPTS = NativeOptions()

SIZES = [1, 3, 7, 23, 100, 376 * 128, 47 * 768 * 8, 1104 * 128, 65537, 3 * 50257]


def _pow2(n):
    return n is None or (n > 0 and n & (n - 1) == 0)


@pytest.mark.parametrize("n", SIZES)
def test_pointwise_blocks_are_powers_of_two(n):
    k = types.SimpleNamespace(is_reduction=False, numel=n)
    assert _pow2(choose_config(k, OPTS, True).XBLOCK)


@pytest.mark.parametrize("inner", [True, False])
@pytest.mark.parametrize("xn", [1, 5, 47, 3000])
@pytest.mark.parametrize("rn", [2, 23, 768, 5000, 50257])
def test_reduction_blocks_are_powers_of_two(xn, rn, inner):
    k = types.SimpleNamespace(is_reduction=True, xnumel=xn, rnumel=rn)
    c = choose_config(k, OPTS, inner)
    assert _pow2(c.XBLOCK) and _pow2(c.RBLOCK), c


@pytest.mark.parametrize("rn", [2, 23, 768, 5000])
def test_unbounded_symbolic_rows_loop(rn):
    # a symbolic rnumel without a known bound: never a persistent tile sized for the hint
    k = types.SimpleNamespace(is_reduction=True, xnumel=1024, rnumel=rn)
    c = choose_config(k, OPTS, True, persistent_ok=False)
    assert not c.persistent and _pow2(c.XBLOCK) and _pow2(c.RBLOCK), c


def test_heavy_persistent_reductions_get_fewer_warps():
    """A costly op per element (gelu's erf) is compute-bound with 8 warps per 4096-wide row: 4."""
    k = types.SimpleNamespace(is_reduction=True, xnumel=8192, rnumel=4096)
    assert choose_config(k, OPTS, True).num_warps == 8
    assert choose_config(k, OPTS, True, heavy=True).num_warps == 4
    looped = types.SimpleNamespace(is_reduction=True, xnumel=8, rnumel=50000)
    assert choose_config(looped, OPTS, True, heavy=True) == choose_config(looped, OPTS, True)


def test_strided_looped_reductions_take_the_outer_table():
    """A looped reduction along a strided dim with many outputs takes OUTER_CONFIGS' row for how
    many buffers it streams; with few outputs (a split's final kernel) a long tile along r instead.
    Powers of two, never persistent."""
    from ember.native.split_reduction import OUTER_XBLOCK
    from ember.native.triton_emit import OUTER_CONFIGS
    # split_reduction counts programs of OUTER_XBLOCK outputs: a row may run more, never fewer
    assert all(row[1] <= OUTER_XBLOCK for row in OUTER_CONFIGS)
    for streams in (1, 2, 4, 8, 20):
        row = next(r for r in OUTER_CONFIGS if r[0] is None or streams <= r[0])
        k = types.SimpleNamespace(is_reduction=True, xnumel=131072, rnumel=392,
                                  reads=[f"in{i}" for i in range(streams - 1)], writes=["out"])
        c = choose_config(k, OPTS, False)
        assert (c.XBLOCK, c.RBLOCK, c.num_warps, c.persistent, c.hints) == (row[1], min(row[2], 512), row[3], False, row[4])
        narrow = types.SimpleNamespace(is_reduction=True, xnumel=3, rnumel=5000, reads=k.reads, writes=k.writes)
        c = choose_config(narrow, OPTS, False)
        assert c.XBLOCK == 4 and _pow2(c.RBLOCK) and not c.persistent and not c.hints


def test_batchnorm_statistics_take_their_row():
    """BatchNorm's forward statistics at 64x256x56x56 (224 chunks of 896 rows x 256 channels; x read,
    the Welford pair's two partials written) take 32x64 tiles, 4 warps and L2 hints
    (benchmarks/results/ln_gelu_sweep-nvidia-h100-s38.json); the backward's 4+ streams keep 64x64/8."""
    stats = types.SimpleNamespace(is_reduction=True, xnumel=224 * 256, rnumel=896, reads=["x"],
                                  writes=["mean_partial", "m2_partial"])
    c = choose_config(stats, OPTS, False)
    assert (c.XBLOCK, c.RBLOCK, c.num_warps, c.persistent, c.hints) == (32, 64, 4, False, True)
    bwd = types.SimpleNamespace(**{**vars(stats), "reads": ["g", "y", "x"]})
    c = choose_config(bwd, OPTS, False)
    assert (c.XBLOCK, c.RBLOCK, c.num_warps, c.hints) == (64, 64, 8, False)


def test_batchnorm_statistics_kernel_is_hinted():
    """The split var_mean's partial kernel of a channels-last activation carries OUTER_EVICTION's
    hints (the rows streamed evict_first); the backward-like 4-stream sums do not."""
    import torch
    from ember.native.backend import DEFAULT_OPTIONS, plan
    from tests.native.harness import trace
    x = torch.randn(4, 16, 32, 32).to(memory_format=torch.channels_last)
    small = {**DEFAULT_OPTIONS, "split_reduction_programs": 16, "split_reduction_numel": 64,
             "single_program_numel": 64, "split_outer_rows": 128}
    kernels = plan(trace(lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0), [x]), [x], small)[3]
    partial = [ek for _, ek in kernels if ek.config.hints]
    assert len(partial) == 1 and "eviction_policy='evict_first'" in partial[0].source, [ek.config for _, ek in kernels]
    g, y = torch.randn_like(x), torch.randn_like(x)
    kernels = plan(trace(lambda g, y, x: (torch.where(y <= 0, 0, g) * x).sum((0, 2, 3)), [g, y, x]), [g, y, x], small)[3]
    assert not any("eviction_policy" in ek.source for _, ek in kernels)


def test_persistent_hints_mark_rows_shared_loads_and_tile_stores(monkeypatch):
    """PERSISTENT_HINTS: a persistent row kernel's row loads, its weight loads (the same for every
    program) and its tile stores get their own hint; looped kernels and an empty table get none."""
    import torch
    import torch.nn.functional as F
    from ember.native import triton_emit as te
    from ember.native.backend import DEFAULT_OPTIONS, plan
    from tests.native.harness import trace

    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[1],), w, b))
    inputs = [torch.randn(16, 256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16),
              torch.randn(256, dtype=torch.bfloat16)]

    def kernel(**opts):
        (ek,) = [ek for _, ek in plan(trace(f, inputs), inputs, {**DEFAULT_OPTIONS, **opts})[3]]
        return ek
    plain = kernel()
    assert plain.kind == "per" and "eviction_policy" not in plain.source and "cache_modifier" not in plain.source
    monkeypatch.setattr(te, "PERSISTENT_HINTS", {"rows": "evict_first", "shared": "evict_last", "store": ".cs"})
    ek = kernel()
    loads = [line for line in ek.source.splitlines() if "tl.load(" in line]
    assert len(loads) == 3
    assert sum("eviction_policy='evict_first'" in line for line in loads) == 1  # x
    assert sum("eviction_policy='evict_last'" in line for line in loads) == 2   # w, b
    assert "cache_modifier='.cs'" in next(line for line in ek.source.splitlines() if "tl.store(" in line)
    looped = kernel(persistent_rnumel=64, max_rblock=64)
    assert looped.kind == "red" and "eviction_policy" not in looped.source and "cache_modifier" not in looped.source


def test_persistent_hints_run(monkeypatch, tmp_path):
    """The hinted kernel computes the same values (the hints change caching, nothing else)."""
    import torch
    import torch.nn.functional as F
    from ember.native import triton_emit as te
    from tests.native.harness import DEVICE, run_case
    monkeypatch.setattr(te, "PERSISTENT_HINTS", {"rows": "evict_first", "shared": "evict_last", "store": ".cs"})
    x, w, b = torch.randn(9, 200, device=DEVICE), torch.randn(200, device=DEVICE), torch.randn(200, device=DEVICE)
    run_case(lambda x, w, b: F.gelu(F.layer_norm(x, (200,), w, b)), [x, w, b], cache_dir=str(tmp_path),
             atol=1e-5, rtol=1e-5)
