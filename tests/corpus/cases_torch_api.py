"""torch functions, tensor methods and properties, torch.nn.functional, tensor creation,
reductions, matmul, views, joins/splits, gather/where/masked_fill, indexing, dtype conversions."""
import torch
import torch.nn.functional as F

from .harness import case


def t34():
    return (torch.randn(3, 4),)


def t234():
    return (torch.randn(2, 3, 4),)


# ---- properties and metadata methods -------------------------------------------------------

@case(t234)
def props_shape_size(x):
    return x.shape, x.size(), x.size(1), x.size(-1), x.shape[0], tuple(x.shape), list(x.size())


@case(t234)
def props_dims_numel(x):
    return x.ndim, x.dim(), x.numel(), x.nelement(), len(x), x.ndimension()


@case(t34)
def props_dtype_device(x):
    return (x.dtype, x.device, x.is_floating_point(), x.is_complex(), x.dtype.is_floating_point,
            x.requires_grad, x.is_leaf, x.layout, x.element_size(), x.dtype.itemsize)


@case(t34)
def props_T_mT_stride(x):
    return x.T, x.mT, x.stride(), x.t().is_contiguous(), x.is_contiguous()


@case(t234)
def shape_arithmetic(x):
    b, s, h = x.shape
    n = b * s
    return x.reshape(n, h), x.view(-1, x.shape[-1] // 2, 2), torch.Size([b, s]) + (h,), x.shape[1:]


@case(lambda: (torch.randn(3, 4), torch.randn(4)))
def size_in_creation(x, v):
    return torch.zeros(x.shape), torch.ones(x.size(0), v.numel()), x.new_zeros(x.shape[1:])


# ---- elementwise torch functions and methods ------------------------------------------------

@case(t34)
def elementwise_functions(x):
    return (torch.sin(x), torch.cos(x), torch.exp(x), torch.log(x.abs() + 1), torch.sqrt(x.abs()),
            torch.tanh(x), torch.sigmoid(x), torch.abs(x), torch.neg(x), torch.sign(x),
            torch.floor(x), torch.ceil(x), torch.round(x), torch.trunc(x), torch.reciprocal(x + 5),
            torch.rsqrt(x.abs() + 1), torch.erf(x), torch.log1p(x.abs()), torch.expm1(x))


@case(t34)
def elementwise_methods(x):
    return (x.sin(), x.exp().log(), x.abs().sqrt(), x.clamp(-0.5, 0.5), x.clamp(min=0),
            x.pow(2), x.square(), x.sigmoid(), x.relu(), x.neg(), x.frac(), x.sign())


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def binary_functions(a, b):
    return (torch.add(a, b, alpha=2), torch.sub(a, b), torch.mul(a, 3), torch.div(a, b.abs() + 1),
            torch.div(a, 2, rounding_mode="floor"), torch.maximum(a, b), torch.minimum(a, b),
            torch.pow(a.abs(), b), torch.atan2(a, b), torch.fmod(a, 0.7), torch.remainder(a, 0.7),
            torch.lerp(a, b, 0.3), torch.hypot(a, b), torch.addcmul(a, a, b, value=0.5))


@case(lambda: (torch.randn(3, 4), torch.randn(3, 4)))
def comparison_functions(a, b):
    return (torch.eq(a, b), torch.gt(a, 0), torch.lt(a, b), torch.ge(a, b), torch.ne(a, a),
            torch.isclose(a, a + 1e-9), torch.isfinite(a / 0), torch.isnan(a.log()), a.eq(b),
            torch.logical_and(a > 0, b > 0), torch.logical_not(a > 0), torch.logical_or(a > 0, b > 0))


@case(t34)
def clamp_where_variants(x):
    return (torch.clamp(x, max=0.1), torch.clip(x, -0.2, 0.2), torch.where(x > 0, x, 0.0),
            torch.where(x > 0, 1.0, -1.0), torch.nan_to_num(x / 0, posinf=1.0, neginf=-1.0))


# ---- creation ----------------------------------------------------------------------------

@case(t34)
def creation_basic(x):
    return (torch.zeros(2, 3), torch.ones(3, dtype=torch.int64), torch.full((2, 2), 7.0),
            torch.arange(5), torch.arange(1, 10, 2), torch.arange(0.0, 1.0, 0.25),
            torch.linspace(0, 1, 5), torch.eye(3), torch.empty(2, 3).fill_(1.5), torch.tensor(3.5),
            torch.tensor([1, 2, 3]), torch.zeros((), dtype=torch.bool))


@case(t34)
def creation_like(x):
    return (torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 2.0),
            torch.empty_like(x).zero_(), torch.ones_like(x, dtype=torch.int32), x.new_ones(2),
            x.new_full((2,), 3.0), x.new_tensor([1.0, 2.0]), torch.rand_like(x).shape)


@case(t34)
def creation_random_after_call_seed(x):
    a = torch.randn(3, 4)
    b = torch.rand(2)
    c = torch.randint(0, 10, (3,))
    d = torch.randn_like(x)
    return a, b, c, d, x + a


@case(t34)
def creation_random_global_stream(x):
    return torch.randn(2, 2), torch.rand_like(x), torch.randperm(5), torch.normal(0.0, 1.0, (3,))


@case(t34)
def creation_from_python_values(x):
    n = x.shape[1]
    vals = [float(i) for i in range(n)]
    return x * torch.tensor(vals), torch.tensor([[1, 2], [3, 4]], dtype=torch.float32), torch.as_tensor(vals)


@case(lambda: (torch.randn(3),))
def creation_tril_triu_diag(x):
    m = torch.ones(4, 4)
    return torch.tril(m), torch.triu(m, 1), torch.diag(x), torch.diag_embed(x), m.tril(-1)


# ---- reductions -------------------------------------------------------------------------

@case(t234)
def reductions_full(x):
    return (x.sum(), x.mean(), x.prod(), x.max(), x.min(), x.std(), x.var(), x.norm(),
            x.abs().amax(), torch.sum(x), torch.mean(x), x.logsumexp(dim=(0, 1, 2)))


@case(t234)
def reductions_dim(x):
    return (x.sum(0), x.sum(dim=-1, keepdim=True), x.mean((0, 2)), torch.amax(x, 1),
            torch.amin(x, dim=(1, 2)), x.std(1, unbiased=False), torch.var_mean(x, 2),
            torch.logsumexp(x, -1), x.norm(dim=1), torch.cumsum(x, 1), x.cumprod(2))


@case(t234)
def reductions_returning_namedtuples(x):
    mx = x.max(dim=1)
    mn = torch.min(x, -1, keepdim=True)
    tk = torch.topk(x, 2, dim=-1)
    srt = torch.sort(x, dim=0, descending=True)
    return mx, mn.values, mn.indices, tk.values, tk.indices, srt, x.argmax(), x.argmin(dim=2)


@case(lambda: (torch.rand(4, 5) > 0.5,))
def reductions_bool(m):
    return m.any(), m.all(), m.any(dim=1), m.sum(), m.float().mean(), torch.count_nonzero(m, dim=0)


# ---- matmul family ----------------------------------------------------------------------

@case(lambda: (torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(4), torch.randn(5, 4)))
def matmul_family(a, b, v, w):
    return (torch.matmul(a, b), torch.bmm(a, b), a @ v, torch.mm(a[0], b[0]), torch.mv(w, v),
            torch.dot(v, v), torch.outer(v, v), torch.einsum("bij,bjk->bik", a, b),
            F.linear(a, w), torch.addmm(torch.zeros(3, 5), a[0], b[0]), torch.baddbmm(torch.zeros(2, 3, 5), a, b))


# ---- views and shapes -------------------------------------------------------------------

@case(t234)
def views_reshape(x):
    return (x.view(6, 4), x.reshape(-1), x.reshape(2, 12), x.flatten(), x.flatten(1),
            x.unflatten(2, (2, 2)), x.view(2, -1).contiguous(), torch.reshape(x, (4, 6)),
            x.view_as(torch.empty(6, 4)), x.reshape_as(torch.empty(24)))


@case(t234)
def views_permute_transpose(x):
    return (x.permute(2, 0, 1), x.transpose(0, 2), x.transpose(-1, -2).contiguous(), x.movedim(0, -1),
            torch.permute(x, (1, 0, 2)), x.swapaxes(0, 1), torch.transpose(x, 1, 2))


@case(lambda: (torch.randn(3, 1), torch.randn(1, 4)))
def views_expand_broadcast(a, b):
    return (a.expand(3, 4), a.expand(-1, 5), b.expand_as(torch.empty(2, 4)), a.repeat(2, 3),
            torch.broadcast_to(b, (3, 4)), torch.broadcast_tensors(a, b), a.tile((2,)),
            b.repeat_interleave(2, dim=1))


@case(lambda: (torch.randn(2, 1, 3),))
def views_squeeze_unsqueeze(x):
    return (x.squeeze(), x.squeeze(1), x.unsqueeze(0), x.unsqueeze(-1), x[None], torch.squeeze(x, 1),
            torch.unsqueeze(x, 2), x.squeeze(1).unsqueeze(1))


@case(t234)
def views_narrow_select_unbind(x):
    return x.narrow(2, 1, 2), x.select(1, 0), x.unbind(0), torch.unbind(x, dim=2), x.flip(0), x.roll(1, 2)


# ---- joining and splitting ---------------------------------------------------------------

@case(lambda: (torch.randn(2, 3), torch.randn(2, 3), torch.randn(1, 3)))
def join_cat_stack(a, b, c):
    return (torch.cat([a, b]), torch.cat((a, b), dim=1), torch.cat([a, c], 0), torch.stack([a, b]),
            torch.stack((a, b), dim=-1), torch.hstack([a, b]), torch.vstack([a, c]), torch.concat([a, b], 1))


@case(lambda: (torch.randn(6, 4),))
def split_chunk(x):
    return (x.split(2), torch.split(x, [1, 2, 3]), x.chunk(3), torch.chunk(x, 2, dim=1),
            x.split(3, dim=0)[1], x.tensor_split(3), x.unsafe_split(2))


@case(lambda: (torch.randn(6, 4),))
def split_unpacked(x):
    a, b, c = x.chunk(3)
    first, *rest = torch.split(x, 2, dim=0)
    return a + c, b, first, len(rest)


# ---- gather / scatter / where / masked_fill / index ops ------------------------------------

@case(lambda: (torch.randn(3, 5), torch.randint(0, 5, (3, 2))))
def gather_scatter(x, idx):
    return (torch.gather(x, 1, idx), x.gather(1, idx), torch.zeros(3, 5).scatter(1, idx, 1.0),
            torch.zeros(3, 5).scatter_add(1, idx, torch.ones(3, 2)), x.take_along_dim(idx, 1))


@case(lambda: (torch.randn(4, 5), torch.rand(4, 5) > 0.5))
def where_masked_fill(x, m):
    return (torch.where(m, x, torch.zeros_like(x)), x.masked_fill(m, -1e9), x.masked_fill(~m, 0.0),
            torch.masked_fill(x, m, float("-inf")).softmax(-1), x.where(m, 2.0))


@case(lambda: (torch.randn(5, 3), torch.tensor([0, 2, 4])))
def index_select_family(x, idx):
    return (x.index_select(0, idx), torch.index_select(x, 1, idx[:2]), x[idx], x.index_add(0, idx, torch.ones(3, 3)),
            torch.embedding(x, torch.tensor([[1, 0]])), x.index_fill(1, idx[:1], 0.0))


# ---- indexing --------------------------------------------------------------------------

@case(t234)
def indexing_ints_slices(x):
    return x[0], x[1, 2], x[-1, -1, -1], x[:, 1], x[..., 0], x[:, :, 1:3], x[0, :, ::2], x[1:, 1:, 1:]


@case(t234)
def indexing_none_ellipsis(x):
    return x[None], x[:, None], x[..., None], x[None, ..., None], x[0, ..., 1], x[..., None, 1:]


@case(lambda: (torch.randn(5, 4), torch.tensor([3, 0, 1]), torch.tensor([1, 1, 2])))
def indexing_tensor_indices(x, i, j):
    return x[i], x[i, j], x[:, j], x[i][:, 1:], x[[0, 2]], x[torch.tensor([[0, 1], [2, 3]])]


# Boolean masks give data-dependent output shapes: a graph break until dynamic shapes (issue 10).
@case(lambda: (torch.randn(5, 4),), breaks=r"data-dependent output shape")
def indexing_bool_masks(x):
    return x[torch.tensor([True, False, True, False, True])], x[x[:, 0] > 10]


@case(lambda: (torch.randn(4, 3), torch.tensor([True, False, True, True])), breaks=r"data-dependent output shape")
def indexing_bool_mask_input(x, m):
    return x[m], x[:, torch.tensor([False, True, True])], x[m][:, 0]


@case(lambda: (torch.randn(2, 3, 4), 1))
def indexing_with_python_int_args(x, i):
    return x[i], x[:, i], x[i, i:], x[..., -i]


# ---- dtype conversions --------------------------------------------------------------------

@case(t34)
def dtype_conversions(x):
    return (x.to(torch.float64), x.double(), x.half(), x.bfloat16(), x.int(), x.long(), x.bool(),
            x.to(dtype=torch.int16), x.type(torch.float64), x.float(), (x * 10).to(torch.uint8),
            x.to(torch.get_default_dtype()))


@case(lambda: (torch.randn(3, 4), torch.zeros(2, dtype=torch.float64)))
def dtype_to_other_and_like(x, ref):
    return x.to(ref), x.type_as(ref), x.to(ref.dtype), torch.zeros_like(x, dtype=ref.dtype), x.to("cpu")


@case(lambda: (torch.randint(0, 5, (4,)),))
def dtype_promotions_results(i):
    f = i.float()
    return (i / 2).dtype, (i * 2).dtype, (i + 0.5).dtype, (f > 1).dtype, f


@case(lambda: (torch.randn(3),))
def dtype_objects(x):
    dt = torch.float16
    return (x.to(dt), dt.is_floating_point, torch.finfo(torch.float32).eps, torch.iinfo(torch.int8).max,
            torch.promote_types(torch.int32, torch.float32), dt == torch.half, torch.finfo(x.dtype).max)


# ---- torch.nn.functional ----------------------------------------------------------------

@case(t34)
def functional_activations(x):
    return (F.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.elu(x), F.leaky_relu(x, 0.1),
            F.softplus(x), F.hardtanh(x), F.mish(x), F.selu(x), F.sigmoid(x), F.tanh(x), F.relu6(x * 4),
            F.hardswish(x), F.logsigmoid(x), F.glu(x, -1))


@case(t34)
def functional_softmax_norms(x):
    return (F.softmax(x, dim=-1), F.log_softmax(x, 1), F.normalize(x, dim=1), F.layer_norm(x, (4,)),
            F.layer_norm(x, (4,), torch.ones(4), torch.zeros(4), 1e-6), F.rms_norm(x, (4,)), F.softmin(x, 0))


@case(lambda: (torch.randn(4, 3), torch.randint(0, 3, (4,)), torch.rand(4, 3)))
def functional_losses(logits, target, prob):
    return (F.cross_entropy(logits, target), F.nll_loss(F.log_softmax(logits, 1), target),
            F.mse_loss(logits, prob), F.l1_loss(logits, prob, reduction="sum"),
            F.binary_cross_entropy_with_logits(logits, prob), F.smooth_l1_loss(logits, prob),
            F.kl_div(F.log_softmax(logits, 1), prob, reduction="batchmean"),
            F.cross_entropy(logits, target, label_smoothing=0.1, reduction="none"))


@case(lambda: (torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)))
def functional_conv_pool(x, w, b):
    y = F.conv2d(x, w, b, padding=1)
    return (y, F.max_pool2d(y, 2), F.avg_pool2d(y, 2, stride=1), F.adaptive_avg_pool2d(y, (1, 1)),
            F.conv2d(x, w, stride=2), F.interpolate(x, scale_factor=2, mode="nearest"), F.pad(x, (1, 1)),
            F.adaptive_max_pool2d(y, 3))


@case(lambda: (torch.randn(2, 3, 10), torch.randn(5, 3, 3)))
def functional_conv1d(x, w):
    return F.conv1d(x, w), F.conv1d(x, w, padding="same"), F.max_pool1d(x, 2), F.avg_pool1d(x, 3)


@case(lambda: (torch.randn(2, 4, 5), torch.randn(2, 4, 5), torch.randn(2, 4, 5)))
def functional_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)


@case(lambda: (torch.randint(0, 10, (2, 3)), torch.randn(10, 4)))
def functional_embedding_onehot(idx, table):
    return F.embedding(idx, table), F.one_hot(idx, 10), F.embedding(idx, table, padding_idx=0)


@case(lambda: (torch.randn(4, 3),))
def functional_dropout(x):
    return F.dropout(x, 0.5, training=False), F.dropout(x, 0.5, training=True), F.dropout(x, p=0.0)


@case(lambda: (torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)))
def functional_batch_group_norm(x, rm, rv):
    rv = rv.abs() + 0.5
    return (F.batch_norm(x, rm, rv, training=False), F.group_norm(x, 3), F.instance_norm(x),
            F.batch_norm(x, rm.clone(), rv.clone(), torch.ones(3), torch.zeros(3), training=True))


@case(lambda: (torch.randn(3, 5), torch.randn(3, 5)))
def functional_similarity(a, b):
    return (F.cosine_similarity(a, b), F.pairwise_distance(a, b), torch.cdist(a, b),
            F.unfold(a[None, None], (2, 2)).shape)


# ---- misc torch namespace ---------------------------------------------------------------

@case(lambda: (torch.randn(3, 4),))
def misc_torch_namespace(x):
    return (torch.numel(x), torch.is_tensor(x), torch.is_floating_point(x), torch.flatten(x, 0),
            torch.clone(x), torch.cumsum(x, 0), torch.diff(x, dim=1), torch.tril_indices(3, 3),
            torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), torch.searchsorted(torch.arange(5.0), x))


@case(lambda: (torch.randn(3, 4),))
def misc_tensor_methods(x):
    return (x.clone(), x.detach(), x.contiguous(), x.diagonal(), x.type(torch.float32),
            x.new_empty(0).numel(), x.sum().neg(), x.abs().sqrt_().mul_(2), x.t().contiguous(),
            x.reshape(4, 3).add(1), x.masked_fill(x > 0, 1.0).sub_(0.5))


@case(lambda: (torch.randn(3, 4),))
def shape_comparisons_and_device(x):
    return (x.shape == (3, 4), x.shape == torch.Size([3, 4]), x.shape[-2:] == (3, 4), x.device.type,
            x.device == torch.device("cpu"), x.size() != (4, 3),
            torch.zeros(x.shape, dtype=x.dtype, device=x.device), x.view(*x.size()).view(x.shape[0], -1))


@case(lambda: (torch.randn(2, 3), torch.randn(3, 2)))
def tensor_dunder_methods(a, b):
    return a.__add__(1), a.__mul__(b.T), a.__matmul__(b), a.__getitem__(0), a.__neg__(), a.__rsub__(1)
