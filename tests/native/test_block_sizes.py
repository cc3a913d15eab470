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
    many buffers it streams and how long its chunks are; with few outputs (a split's final kernel) a
    long tile along r instead. Powers of two, never persistent."""
    from ember.native.split_reduction import OUTER_XBLOCK
    from ember.native.triton_emit import OUTER_CONFIGS
    # split_reduction counts programs of OUTER_XBLOCK outputs: a row may run more, never fewer
    assert all(row[2] <= OUTER_XBLOCK for row in OUTER_CONFIGS)
    for streams in (1, 2, 4, 8, 20):
        for rows in (392, 4096):
            row = next(r for r in OUTER_CONFIGS if (r[0] is None or streams <= r[0]) and rows >= r[1])
            k = types.SimpleNamespace(is_reduction=True, xnumel=131072, rnumel=rows,
                                      reads=[f"in{i}" for i in range(streams - 1)], writes=["out"])
            c = choose_config(k, OPTS, False)
            assert (c.XBLOCK, c.RBLOCK, c.num_warps, c.persistent) == (row[2], min(row[3], 512), row[4], False)
        narrow = types.SimpleNamespace(is_reduction=True, xnumel=3, rnumel=5000, reads=k.reads, writes=k.writes)
        c = choose_config(narrow, OPTS, False)
        assert c.XBLOCK == 4 and _pow2(c.RBLOCK) and not c.persistent


def test_batchnorm_statistics_in_long_chunks_take_their_row():
    """BatchNorm's forward statistics at 64x256x56x56 split into chunks of 2048 rows: the partial
    kernel (98 chunks x 256 channels; x read, the Welford pair's two partials written) takes
    32x64 tiles and 4 warps (benchmarks/results/outer_reduction-fwd-nvidia-h100-s37.json); the same
    kernel in today's 896-row chunks, and the backward's 4+ streams, keep their rows."""
    stats = types.SimpleNamespace(is_reduction=True, xnumel=98 * 256, rnumel=2048, reads=["x"],
                                  writes=["mean_partial", "m2_partial"])
    c = choose_config(stats, OPTS, False)
    assert (c.XBLOCK, c.RBLOCK, c.num_warps, c.persistent) == (32, 64, 4, False)
    short = types.SimpleNamespace(**{**vars(stats), "xnumel": 224 * 256, "rnumel": 896})
    assert (choose_config(short, OPTS, False).XBLOCK, choose_config(short, OPTS, False).RBLOCK) == (64, 16)
    bwd = types.SimpleNamespace(**{**vars(stats), "reads": ["g", "y", "x"]})
    assert (choose_config(bwd, OPTS, False).XBLOCK, choose_config(bwd, OPTS, False).num_warps) == (64, 8)


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
