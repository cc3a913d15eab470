"""Recompilation: changing a shape, a dtype, a Python scalar argument, ``training`` or a read
global causes exactly one recompile, whose recorded reason names what changed; afterwards both
versions stay cached (calling with the original inputs again does not recompile)."""
import re

import pytest
import torch
import torch.nn as nn

import ember
from ember.testing import CompileCounter, cache_of

from .harness import assert_same

CORPUS_GLOBAL_SCALE = 2.0
CORPUS_GLOBAL_OFFSETS = (1, 2)


def scale_rows(activations):
    return activations * 2 + activations.sum(0)


def scale_by_int(activations, n_repeat):
    for _ in range(n_repeat):
        activations = activations * 0.5 + 1
    return activations


def scale_by_float(activations, temperature):
    return torch.softmax(activations / temperature, dim=-1)


def maybe_bias(activations, use_bias):
    if use_bias:
        return activations + 1
    return activations - 1


def read_global_scale(activations):
    return activations * CORPUS_GLOBAL_SCALE


def _helper_reading_global(t):
    return t * CORPUS_GLOBAL_SCALE


def read_global_in_inlined_helper(activations):
    return _helper_reading_global(activations) + 1


class _Config:
    def __init__(self):
        self.dropout_scale = 0.5


CORPUS_CONFIG = _Config()


def read_global_object_attribute(activations):
    return activations * CORPUS_CONFIG.dropout_scale


def scale_by_keyword(activations, *, width_multiplier=1.0):
    return activations * width_multiplier


def read_global_tuple(activations):
    return activations + sum(CORPUS_GLOBAL_OFFSETS)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = TrainToggle()

    def forward(self, x):
        return self.inner(x) * 2


class TrainToggle(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(self.lin(x))
        if self.training:
            h = h + 1
        return h


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x)


def _check(compiled, fn, args):
    torch.manual_seed(0)
    expected = fn(*args)
    torch.manual_seed(0)
    actual = compiled(*args)
    assert_same(expected, actual)


def _compile(fn):
    cnt = CompileCounter()
    return ember.compile(fn, backend=cnt, fullgraph=True), cnt


def _assert_one_recompile(compiled, *patterns):
    cache = cache_of(compiled)
    assert cache.compile_count == 2, (cache.compile_count, cache.recompile_reasons)
    assert len(cache.recompile_reasons) == 1, cache.recompile_reasons
    assert len(cache.entries) >= 1
    reason = cache.recompile_reasons[-1]
    for p in patterns:
        assert re.search(p, reason, re.IGNORECASE | re.DOTALL), f"reason {reason!r} does not match {p!r}"
    return reason


def test_shape_change_dim0():
    c, cnt = _compile(scale_rows)
    _check(c, scale_rows, (torch.randn(5, 3),))
    _check(c, scale_rows, (torch.randn(5, 3),))
    assert cache_of(c).compile_count == 1
    _check(c, scale_rows, (torch.randn(9, 3),))
    _assert_one_recompile(c, r"\bactivations\b", r"size|shape", r"\b5\b.*\b9\b")
    _check(c, scale_rows, (torch.randn(5, 3),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_shape_change_dim1():
    c, cnt = _compile(scale_rows)
    _check(c, scale_rows, (torch.randn(3, 6),))
    _check(c, scale_rows, (torch.randn(3, 11),))
    _assert_one_recompile(c, r"\bactivations\b", r"size|shape", r"\b6\b.*\b11\b")
    _check(c, scale_rows, (torch.randn(3, 6),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_dtype_change():
    c, cnt = _compile(scale_rows)
    _check(c, scale_rows, (torch.randn(4, 3),))
    _check(c, scale_rows, (torch.randn(4, 3, dtype=torch.float64),))
    _assert_one_recompile(c, r"\bactivations\b", r"dtype", r"float32|float\b.*(double|float64)")
    _check(c, scale_rows, (torch.randn(4, 3),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_int_scalar_argument_change():
    c, cnt = _compile(scale_by_int)
    _check(c, scale_by_int, (torch.randn(4), 2))
    _check(c, scale_by_int, (torch.randn(4), 2))
    assert cache_of(c).compile_count == 1
    _check(c, scale_by_int, (torch.randn(4), 3))
    _assert_one_recompile(c, r"\bn_repeat\b")
    _check(c, scale_by_int, (torch.randn(4), 2))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_float_scalar_argument_change():
    c, cnt = _compile(scale_by_float)
    _check(c, scale_by_float, (torch.randn(2, 4), 0.5))
    _check(c, scale_by_float, (torch.randn(2, 4), 0.25))
    _assert_one_recompile(c, r"\btemperature\b")
    _check(c, scale_by_float, (torch.randn(2, 4), 0.5))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_bool_scalar_argument_change():
    c, cnt = _compile(maybe_bias)
    _check(c, maybe_bias, (torch.randn(4), True))
    _check(c, maybe_bias, (torch.randn(4), False))
    _assert_one_recompile(c, r"\buse_bias\b")
    _check(c, maybe_bias, (torch.randn(4), True))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_training_toggle():
    torch.manual_seed(0)
    m = TrainToggle()
    c, cnt = _compile(m)
    x = torch.randn(3, 4)
    _check(c, m, (x,))
    _check(c, m, (torch.randn(3, 4),))
    assert cache_of(c).compile_count == 1
    m.eval()
    _check(c, m, (x,))
    _assert_one_recompile(c, r"training")
    m.train()
    _check(c, m, (x,))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_module_input_shape_change():
    torch.manual_seed(0)
    m = SmallNet()
    c, cnt = _compile(m)
    _check(c, m, (torch.randn(5, 4),))
    _check(c, m, (torch.randn(7, 4),))
    _assert_one_recompile(c, r"\bx\b", r"size|shape", r"\b5\b.*\b7\b")
    _check(c, m, (torch.randn(5, 4),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


@pytest.fixture
def restore_globals():
    saved = (CORPUS_GLOBAL_SCALE, CORPUS_GLOBAL_OFFSETS)
    yield
    globals()["CORPUS_GLOBAL_SCALE"], globals()["CORPUS_GLOBAL_OFFSETS"] = saved


def test_read_global_change(restore_globals):
    global CORPUS_GLOBAL_SCALE
    c, cnt = _compile(read_global_scale)
    _check(c, read_global_scale, (torch.randn(4),))
    _check(c, read_global_scale, (torch.randn(4),))
    assert cache_of(c).compile_count == 1
    CORPUS_GLOBAL_SCALE = 3.0
    _check(c, read_global_scale, (torch.randn(4),))
    _assert_one_recompile(c, r"\bCORPUS_GLOBAL_SCALE\b")
    CORPUS_GLOBAL_SCALE = 2.0
    _check(c, read_global_scale, (torch.randn(4),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_read_global_tuple_change(restore_globals):
    global CORPUS_GLOBAL_OFFSETS
    c, cnt = _compile(read_global_tuple)
    _check(c, read_global_tuple, (torch.randn(4),))
    CORPUS_GLOBAL_OFFSETS = (1, 5)
    _check(c, read_global_tuple, (torch.randn(4),))
    _assert_one_recompile(c, r"\bCORPUS_GLOBAL_OFFSETS\b")
    CORPUS_GLOBAL_OFFSETS = (1, 2)
    _check(c, read_global_tuple, (torch.randn(4),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_unchanged_inputs_never_recompile():
    c, cnt = _compile(scale_by_int)
    for _ in range(5):
        _check(c, scale_by_int, (torch.randn(4), 2))
    assert cache_of(c).compile_count == 1
    assert cache_of(c).recompile_reasons == []
    assert cnt.frame_count == 1


def test_keyword_scalar_argument_change():
    c, cnt = _compile(scale_by_keyword)
    c(torch.randn(4), width_multiplier=2.0)
    torch.manual_seed(0)
    x = torch.randn(4)
    assert_same(scale_by_keyword(x, width_multiplier=3.0), c(x, width_multiplier=3.0))
    _assert_one_recompile(c, r"\bwidth_multiplier\b")
    c(torch.randn(4), width_multiplier=2.0)
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_global_read_in_inlined_helper_change(restore_globals):
    global CORPUS_GLOBAL_SCALE
    c, cnt = _compile(read_global_in_inlined_helper)
    _check(c, read_global_in_inlined_helper, (torch.randn(4),))
    CORPUS_GLOBAL_SCALE = 5.0
    _check(c, read_global_in_inlined_helper, (torch.randn(4),))
    _assert_one_recompile(c, r"\bCORPUS_GLOBAL_SCALE\b")
    CORPUS_GLOBAL_SCALE = 2.0
    _check(c, read_global_in_inlined_helper, (torch.randn(4),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_global_object_attribute_change():
    c, cnt = _compile(read_global_object_attribute)
    try:
        _check(c, read_global_object_attribute, (torch.randn(4),))
        CORPUS_CONFIG.dropout_scale = 0.25
        _check(c, read_global_object_attribute, (torch.randn(4),))
        _assert_one_recompile(c, r"\bdropout_scale\b")
    finally:
        CORPUS_CONFIG.dropout_scale = 0.5
    _check(c, read_global_object_attribute, (torch.randn(4),))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_submodule_training_toggle():
    torch.manual_seed(0)
    m = Outer()
    c, cnt = _compile(m)
    x = torch.randn(3, 4)
    _check(c, m, (x,))
    m.inner.eval()
    _check(c, m, (x,))
    _assert_one_recompile(c, r"training")
    m.inner.train()
    _check(c, m, (x,))
    assert cache_of(c).compile_count == 2, cache_of(c).recompile_reasons


def test_module_input_dtype_change():
    torch.manual_seed(0)
    m = SmallNet().double()
    c, cnt = _compile(m)
    _check(c, m, (torch.randn(5, 4, dtype=torch.float64),))
    m.float()
    _check(c, m, (torch.randn(5, 4),))
    assert cache_of(c).compile_count == 2, (cache_of(c).compile_count, cache_of(c).recompile_reasons)
    assert len(cache_of(c).recompile_reasons) == 1
    assert re.search(r"dtype", cache_of(c).recompile_reasons[-1], re.I), cache_of(c).recompile_reasons
