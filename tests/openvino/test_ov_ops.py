"""Per-op conversion table: each op, compiled with backend="openvino", against eager PyTorch.

Every case runs ``op`` followed by one cheap op (``_then``), so that even a light op forms a partition
worth converting (a lone light op stays in PyTorch by design). ``expect`` names the ATen op that must
have run inside an OpenVINO partition; ``None`` only checks results (the op may stay in PyTorch).
"""
import pytest

from tests.openvino.conftest import require_openvino  # noqa: E402

require_openvino()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ember  # noqa: E402
from tests.openvino.helpers import F32, ov_ops, rel_err  # noqa: E402


def _then(out):
    if isinstance(out, (tuple, list)):
        return tuple(_then(o) for o in out)
    if out.dtype == torch.bool:
        return ~out
    return out + 1


def r(*shape):
    return torch.randn(*shape)


def pos(*shape):
    return torch.rand(*shape) + 0.1


def ints(*shape, high=10):
    return torch.randint(0, high, shape)


# (id, function, input factory, ATen op expected inside a partition)
CASES = [
    # elementwise
    ("add", lambda x, y: x + y, lambda: (r(4, 8), r(4, 8)), "aten.add.Tensor"),
    ("sub_broadcast", lambda x, y: x - y, lambda: (r(4, 8), r(8)), "aten.sub.Tensor"),
    ("mul_scalar", lambda x: x * 3.5, lambda: (r(4, 8),), "aten.mul.Tensor"),
    ("div", lambda x, y: x / y, lambda: (r(4, 8), pos(4, 8)), "aten.div.Tensor"),
    ("neg_abs", lambda x: -x.abs(), lambda: (r(4, 8),), "aten.abs.default"),
    ("exp", torch.exp, lambda: (r(4, 8),), "aten.exp.default"),
    ("log", torch.log, lambda: (pos(4, 8),), "aten.log.default"),
    ("sqrt", torch.sqrt, lambda: (pos(4, 8),), "aten.sqrt.default"),
    ("rsqrt", torch.rsqrt, lambda: (pos(4, 8),), "aten.rsqrt.default"),
    ("pow", lambda x: x ** 3, lambda: (r(4, 8),), "aten.pow.Tensor_Scalar"),
    ("sin_cos", lambda x: torch.sin(x) * torch.cos(x), lambda: (r(4, 8),), "aten.sin.default"),
    ("tanh", torch.tanh, lambda: (r(4, 8),), "aten.tanh.default"),
    ("sigmoid", torch.sigmoid, lambda: (r(4, 8),), "aten.sigmoid.default"),
    ("erf", torch.erf, lambda: (r(4, 8),), "aten.erf.default"),
    ("floor_ceil", lambda x: torch.floor(x) + torch.ceil(x), lambda: (r(4, 8) * 3,), "aten.floor.default"),
    ("clamp", lambda x: x.clamp(-0.5, 0.5), lambda: (r(4, 8),), "aten.clamp.default"),
    ("maximum", torch.maximum, lambda: (r(4, 8), r(4, 8)), "aten.maximum.default"),
    ("where", lambda x, y: torch.where(x > 0, x, y), lambda: (r(4, 8), r(4, 8)), "aten.where.self"),
    ("sign", torch.sign, lambda: (r(4, 8),), "aten.sign.default"),
    ("reciprocal", torch.reciprocal, lambda: (pos(4, 8),), "aten.reciprocal.default"),
    # activations
    ("relu", F.relu, lambda: (r(4, 8),), "aten.relu.default"),
    ("gelu", F.gelu, lambda: (r(4, 8),), "aten.gelu.default"),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda: (r(4, 8),), "aten.gelu.default"),
    ("silu", F.silu, lambda: (r(4, 8),), None),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), lambda: (r(4, 8),), None),
    ("elu", F.elu, lambda: (r(4, 8),), None),
    ("hardswish", F.hardswish, lambda: (r(4, 8),), None),
    ("hardtanh", F.hardtanh, lambda: (r(4, 8) * 2,), None),
    ("softplus", F.softplus, lambda: (r(4, 8),), None),
    ("mish", F.mish, lambda: (r(4, 8),), None),
    # comparisons and logic
    ("gt", lambda x, y: x > y, lambda: (r(4, 8), r(4, 8)), "aten.gt.Tensor"),
    ("eq_int", lambda x, y: x == y, lambda: (ints(4, 8, high=3), ints(4, 8, high=3)), "aten.eq.Tensor"),
    ("bool_and", lambda x, y: (x > 0) & (y > 0), lambda: (r(4, 8), r(4, 8)), "aten.bitwise_and.Tensor"),
    # integer arithmetic
    ("int_add_mul", lambda x, y: x * y + x, lambda: (ints(4, 8), ints(4, 8)), "aten.mul.Tensor"),
    ("int_floordiv", lambda x: torch.div(x, 3, rounding_mode="floor"), lambda: (ints(4, 8, high=50) - 25,), None),
    ("int_trunc_div", lambda x: torch.div(x, 3, rounding_mode="trunc"), lambda: (ints(4, 8, high=50) - 25,), None),
    ("int_remainder", lambda x, y: torch.remainder(x, y), lambda: (ints(4, 8, high=50) - 25, ints(4, 8, high=6) + 1),
     None),
    ("int8_wraps", lambda x: x.to(torch.int8) * 3, lambda: (ints(4, 8, high=120),), None),
    ("abs_of_range", lambda x: x + torch.arange(-3, 5).abs(), lambda: (ints(4, 8),), None),
    # reductions
    ("sum_dim", lambda x: x.sum(1), lambda: (r(4, 8, 5),), "aten.sum.dim_IntList"),
    ("mean_keepdim", lambda x: x.mean(-1, keepdim=True), lambda: (r(4, 8),), "aten.mean.dim"),
    ("amax", lambda x: x.amax(0), lambda: (r(4, 8),), "aten.amax.default"),
    ("argmax", lambda x: x.argmax(-1), lambda: (r(4, 8),), "aten.argmax.default"),
    ("var", lambda x: x.var(1), lambda: (r(4, 16),), None),
    ("prod", lambda x: x.prod(1), lambda: (pos(4, 5),), "aten.prod.dim_int"),
    ("cumsum", lambda x: x.cumsum(1), lambda: (r(4, 8),), "aten.cumsum.default"),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), lambda: (r(4, 8),), None),
    ("topk", lambda x: torch.topk(x, 3, dim=1), lambda: (r(4, 8),), "aten.topk.default"),
    ("sort", lambda x: torch.sort(x, dim=1), lambda: (r(4, 8),), None),
    # normalization, softmax
    ("softmax", lambda x: F.softmax(x, -1), lambda: (r(4, 8),), "aten._softmax.default"),
    ("log_softmax", lambda x: F.log_softmax(x, -1), lambda: (r(4, 8),), "aten._log_softmax.default"),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), lambda: (r(4, 8), r(8), r(8)),
     "aten.native_layer_norm.default"),
    ("group_norm", lambda x: F.group_norm(x, 2), lambda: (r(2, 4, 5, 5),), None),
    ("batch_norm_eval", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, False),
     lambda: (r(2, 4, 5, 5), r(4), pos(4), r(4), r(4)), None),
    # linear algebra
    ("matmul", torch.matmul, lambda: (r(4, 8), r(8, 6)), "aten.mm.default"),
    ("bmm", torch.bmm, lambda: (r(3, 4, 8), r(3, 8, 5)), "aten.bmm.default"),
    ("linear", F.linear, lambda: (r(4, 8), r(6, 8), r(6)), "aten.addmm.default"),
    ("baddbmm", lambda a, b, c: torch.baddbmm(a, b, c), lambda: (r(3, 4, 5), r(3, 4, 8), r(3, 8, 5)), None),
    ("einsum", lambda a, b: torch.einsum("bij,bjk->bik", a, b), lambda: (r(2, 3, 4), r(2, 4, 5)), None),
    ("sdpa", F.scaled_dot_product_attention, lambda: (r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16)), None),
    ("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda: (r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16)), None),
    # convolution and pooling
    ("conv1d", lambda x, w: F.conv1d(x, w, padding=1), lambda: (r(2, 3, 16), r(4, 3, 3)), "aten.convolution.default"),
    ("conv2d_stride", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), lambda: (r(2, 3, 9, 9), r(4, 3, 3, 3), r(4)),
     "aten.convolution.default"),
    ("conv2d_groups_dilation", lambda x, w: F.conv2d(x, w, groups=2, dilation=2),
     lambda: (r(1, 4, 9, 9), r(6, 2, 3, 3)), "aten.convolution.default"),
    ("conv3d", lambda x, w: F.conv3d(x, w), lambda: (r(1, 2, 5, 5, 5), r(3, 2, 3, 3, 3)), "aten.convolution.default"),
    ("conv_transpose2d", lambda x, w: F.conv_transpose2d(x, w, stride=2), lambda: (r(1, 4, 5, 5), r(4, 3, 3, 3)),
     "aten.convolution.default"),
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1), lambda: (r(2, 3, 9, 9),), "aten.max_pool2d_with_indices.default"),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2), lambda: (r(2, 3, 8, 8),), "aten.avg_pool2d.default"),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1), lambda: (r(2, 3, 8, 8),), None),
    ("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2), lambda: (r(1, 3, 4, 4),), None),
    ("interpolate_bilinear", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), lambda: (r(1, 3, 4, 4),), None),
    ("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), lambda: (r(1, 8, 3, 3),), None),
    # shapes, indexing, data movement
    ("cat", lambda x, y: torch.cat([x, y], 1), lambda: (r(2, 3), r(2, 5)), "aten.cat.default"),
    ("stack", lambda x, y: torch.stack([x, y]), lambda: (r(2, 3), r(2, 3)), None),
    ("split", lambda x: torch.split(x, [2, 3], 1), lambda: (r(4, 5),), None),
    ("permute_reshape", lambda x: x.permute(0, 2, 1).reshape(4, -1), lambda: (r(4, 3, 5),), None),
    ("transpose_contig", lambda x: x.transpose(0, 1).contiguous() * 2, lambda: (r(4, 3),), None),
    ("expand", lambda x: x.expand(4, 3, 5), lambda: (r(1, 3, 5),), None),
    ("repeat", lambda x: x.repeat(2, 3), lambda: (r(2, 3),), None),
    ("flip", lambda x: torch.flip(x, [1]), lambda: (r(4, 5),), None),
    ("roll", lambda x: torch.roll(x, 2, 1), lambda: (r(4, 5),), None),
    ("slice_step", lambda x: x[:, 1::2] * 2, lambda: (r(4, 9),), None),
    ("index_select", lambda x, i: torch.index_select(x, 0, i), lambda: (r(6, 4), torch.tensor([0, 5, 2])), None),
    ("gather", lambda x, i: torch.gather(x, 1, i), lambda: (r(4, 6), ints(4, 3, high=6)), "aten.gather.default"),
    ("embedding", F.embedding, lambda: (ints(2, 5, high=20), r(20, 8)), "aten.embedding.default"),
    ("masked_fill", lambda x: x.masked_fill(x < 0, -1.0), lambda: (r(4, 8),), None),
    ("tril", torch.tril, lambda: (r(5, 5),), None),
    ("pad_constant", lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), lambda: (r(1, 2, 4, 4),), None),
    ("pad_reflect", lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), lambda: (r(1, 2, 4, 4),), None),
    ("arange_add", lambda x: x + torch.arange(8, dtype=torch.float32), lambda: (r(4, 8),), None),
    ("full_like", lambda x: x * torch.full_like(x, 2.0), lambda: (r(4, 8),), None),
    ("to_dtype", lambda x: (x * 10).to(torch.int32), lambda: (r(4, 8),), None),
    ("bool_to_float", lambda x: (x > 0).float() * x, lambda: (r(4, 8),), None),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t), lambda: (r(4, 7), ints(4, high=7)), None),
    ("one_hot_mm", lambda i, w: F.one_hot(i, 6).float() @ w, lambda: (ints(5, high=6), r(6, 3)), None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_eager(case, reports):
    name, fn, make_inputs, expect = case
    inputs = make_inputs()

    def body(*args):
        return _then(fn(*args))

    compiled = ember.compile(body, backend="openvino", options=F32)
    with torch.no_grad():
        expected, got = body(*inputs), compiled(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (name, g.dtype, e.dtype, g.shape, e.shape)
        if e.dtype.is_floating_point:
            assert rel_err(g, e) < 1e-4, (name, rel_err(g, e))
        else:
            assert torch.equal(g, e), name
    assert reports(), f"{name}: nothing was compiled"
    if expect is not None:
        assert expect in ov_ops(reports()), f"{name}: {expect} did not run in OpenVINO: {reports()}"
