"""Transposed reads of C++ pointwise kernels staged through local tiles (ember/native/cpp_tiles.py):
the kernel reads a column-major input through a tile array and its results equal eager's, with
ranges that are not multiples of the tile."""
import shutil

import pytest
import torch
import torch.nn.functional as F

from ember.native import compile_aten_graph, cpp_tiles
from ember.native.backend import plan
from tests.native.harness import compare, trace

pytestmark = pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++"))), reason="no C++ compiler")


def _sources(fn, inputs):
    gm = trace(fn, inputs)
    _, _, _, emitted = plan(gm, inputs, {}, "cpp")
    return [ck.source for _, ck in emitted]


@pytest.mark.parametrize("rows,cols", [(32, 1024), (37, 100), (8, 8), (70, 130)])
def test_transposed_input_is_staged(rows, cols, native_cache):
    x, b = torch.randn(cols, rows), torch.randn(cols)

    def fn(x, b):  # (row-major results, as a Linear's: eager's own would follow x's layout)
        return (F.gelu(x.t() + b) * 2).contiguous(), (x.t() - 1).contiguous()

    (src,) = _sources(fn, [x, b])
    assert "stage0[" in src and src.count("stage") >= 2, src
    gm = trace(fn, [x, b])
    compiled = compile_aten_graph(gm, [x, b], options={"cpu_codegen": "cpp", "cache_dir": native_cache})
    compare(compiled(x, b), fn(x, b), None, None, True)


def test_plain_kernels_keep_their_loops():
    x, b = torch.randn(64, 48), torch.randn(48)
    # row-major input: nothing to stage
    assert all("stage" not in s for s in _sources(lambda x, b: F.gelu(x + b), [x, b]))
    # below MIN_RANGE rows: nothing to gain
    x = torch.randn(48, cpp_tiles.MIN_RANGE - 1)
    assert all("stage" not in s for s in _sources(lambda x: (x.t() * 2).contiguous(), [x]))


def test_linear_index():
    v0, v1, s = (__import__("sympy").Symbol(n) for n in ("v0", "v1", "s"))
    assert cpp_tiles._linear(v0 + 32 * v1 + 5, v0, v1) == (1, 32)
    assert cpp_tiles._linear(v0 * v1, v0, v1) is None
    assert cpp_tiles._linear(v0 + s * v1, v0, v1) is None  # a symbolic stride
