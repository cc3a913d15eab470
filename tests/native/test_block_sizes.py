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
