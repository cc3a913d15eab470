"""A regional model's steady state against whole-graph compilation of the same model (CPU, the C++
renderer): the same kernels and extern calls per step except at block boundaries, a few Python
frames per part, results equal to eager's.

Kernels per step are counted from each compiled graph's report (``ember.testing.KernelCount``);
host work is counted as Python function calls per step (``sys.setprofile``): a count, not a time,
so it is the same on a loaded machine.
"""
from __future__ import annotations

import collections
import shutil
import sys

import pytest
import torch

import ember
from ember.backends import regional
from ember.testing import KernelCount

from .models import Encoder, PostNormBlock, Tiny

needs_cxx = pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler")


@pytest.fixture(autouse=True)
def _fresh_shared_table():
    regional.clear()
    yield
    regional.clear()


def _inputs():
    idx = torch.randint(0, 64, (2, 8))
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, 6:] = False  # a padded sequence: the mask is not all zeros
    return idx, keep


def _steady(model, args, regional_on: bool, train: bool = False):
    """(kernels, externs, graph calls) of the second call, and that call's output."""
    with KernelCount() as kc, torch.set_grad_enabled(train):
        c = ember.compile(model, options={"regional": regional_on})
        out = c(*args)
        if train:
            out.sum().backward()
        kc.reset()
        out = c(*args)
        if train:
            out.sum().backward()
    return (kc.kernels, kc.externs, kc.graphs), out


@needs_cxx
def test_post_norm_encoder_runs_the_same_kernels_as_the_whole_graph():
    # BERT's shape: each block ends with a LayerNorm, so nothing fuses across a block boundary and
    # the regional model must launch exactly what the whole graph launches
    idx, keep = _inputs()
    m = Encoder(layers=4).eval()
    with torch.no_grad():
        ref = m(idx, keep)
    (wk, we, wg), whole = _steady(m, (idx, keep), False)
    before = regional.stats()
    (rk, re_, rg), out = _steady(m, (idx, keep), True)
    seen = regional.stats() - before
    assert seen["splits"] == 1 and seen["reuses"] == 3  # one block compiled, shared by the other three
    assert wg == 1 and rg == 5  # glue + 4 blocks
    assert (rk, re_) == (wk, we) and wk > 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)


@needs_cxx
def test_pre_norm_blocks_lose_only_the_fusion_across_each_boundary():
    # GPT-2's shape: a block ends with a residual add that the whole graph fuses into the next
    # block's LayerNorm; split there, it is one kernel of its own per boundary, nothing more
    layers = 4
    idx = torch.randint(0, 64, (2, 8))
    m = Tiny(layers=layers).eval()
    (wk, we, _), whole = _steady(m, (idx,), False)
    (rk, re_, rg), out = _steady(m, (idx,), True)
    assert rg == layers + 2
    assert re_ == we
    assert wk <= rk <= wk + layers + 1  # a boundary before each block and after the last
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)


@needs_cxx
def test_training_kernels_differ_only_at_block_boundaries():
    idx, keep = _inputs()
    layers = 4
    m = Encoder(layers=layers)
    (wk, we, wg), _ = _steady(m, (idx, keep), False, train=True)
    grads_whole = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    (rk, re_, rg), _ = _steady(m, (idx, keep), True, train=True)
    assert wg == 2 and rg == 2 * (layers + 1)  # forward and backward of each part
    assert re_ == we
    assert wk <= rk <= wk + layers  # the gradient of a block's input, summed at each boundary
    for p, g in zip(m.parameters(), grads_whole):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)  # (two steps accumulated, both ways)


def _python_calls(fn, *args) -> int:
    calls = collections.Counter()

    def prof(frame, event, arg):
        if event == "call":
            calls[frame.f_code] += 1
    sys.setprofile(prof)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return sum(calls.values())


@needs_cxx
def test_host_work_per_part_is_a_few_frames():
    # per part and call: the autograd layer's dispatch, its variant, the native wrapper (and on CPU
    # the C++ graph's binding and its thread-count check); no nn.Module.__call__, no part object
    idx, keep = _inputs()
    layers = 6
    counts = {}
    for on in (False, True):
        regional.clear()
        m = Encoder(layers=layers).eval()
        with torch.no_grad():
            c = ember.compile(m, options={"regional": on})
            for _ in range(2):
                c(idx, keep)
            counts[on] = _python_calls(c, idx, keep)
    extra_parts = layers  # glue + 6 blocks against one graph
    assert counts[True] - counts[False] <= 5 * extra_parts + 6, counts  # (+6: the split GraphModule's call)


@pytest.mark.parametrize("backend", ["ember", "aot_eager"])
def test_a_layer_that_differs_gets_its_own_compile_and_matches_eager(backend):
    blocks = [PostNormBlock(), PostNormBlock(), PostNormBlock(hidden=48), PostNormBlock(), PostNormBlock(heads=2)]
    m = Encoder(blocks=blocks)
    idx, keep = _inputs()
    ref = m(idx, keep)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    before = regional.stats()
    out = ember.compile(m, backend=backend, options={"regional": True})(idx, keep)
    out.sum().backward()
    seen = regional.stats() - before
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for p, g in zip(m.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
    # the plain block runs three times (compiled once, reused twice); hidden=48 and heads=2 are
    # one-offs, so they stay in the glue between the parts
    assert seen["splits"] == 1 and seen["reuses"] == 2
