"""requires_grad inputs: outputs must require grad exactly when eager's do, and gradients from
.backward() on the outputs must match eager's."""
import torch
import torch.nn.functional as F

from .harness import case


def g(*shape):
    return torch.randn(*shape, requires_grad=True)


@case(lambda: (g(3, 4),))
def grad_elementwise(x):
    return (x.sin() * x.exp()).tanh()


@case(lambda: (g(3, 4), g(4, 5)))
def grad_matmul_sum(a, b):
    return (a @ b).relu().sum()


@case(lambda: (g(3, 4), torch.randn(3, 4)))
def grad_mixed_requires(a, b):
    return a * b, b * 2, (a + b).mean()


@case(lambda: (g(2, 3, 4),))
def grad_views(x):
    return x.permute(2, 0, 1).reshape(4, 6)[1:].t(), x[:, 1].unsqueeze(0).expand(3, 2, 4)


@case(lambda: (g(4, 5), torch.randint(0, 5, (4,))))
def grad_cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


@case(lambda: (g(4, 6),))
def grad_softmax_layernorm(x):
    return F.layer_norm(F.softmax(x, -1) * x, (6,))


@case(lambda: (g(4), g(4)))
def grad_no_grad_part(a, b):
    with torch.no_grad():
        c = a * 2
    return a * c + b, c


@case(lambda: (g(4),))
def grad_detach(x):
    return x * x.detach(), x.detach().requires_grad


@case(lambda: (g(4),))
def grad_clone_and_inplace_on_nonleaf(x):
    y = x * 1
    y.mul_(3)
    y[0] = 0.0
    return y


@case(lambda: (g(3, 4),))
def grad_return_input_leaf(x):
    return x, x * 2


@case(lambda: (g(6, 2),))
def grad_split_cat(x):
    a, b, c = x.chunk(3)
    return torch.cat([c, a * b], 1)


@case(lambda: (g(3, 4), torch.rand(3, 4) > 0.5))
def grad_where_masked(x, m):
    return torch.where(m, x * 2, x.exp()).masked_fill(~m, 0.0).sum(0)


@case(lambda: (g(5, 3), torch.tensor([4, 0, 2])))
def grad_indexing(x, idx):
    return x[idx], x[1:3, None, ...], x.gather(0, idx[:, None].expand(3, 3))


@case(lambda: (g(4), 3))
def grad_python_scalar_ops(x, n):
    y = x
    for _ in range(n):
        y = y * 0.5 + 1
    return y, y.requires_grad, y.is_leaf


@case(lambda: (g(2, 3, 8, 8), g(4, 3, 3, 3), g(4)))
def grad_conv(x, w, b):
    return F.max_pool2d(F.conv2d(x, w, b, padding=1).relu(), 2)


@case(lambda: (torch.randn(3, requires_grad=True, dtype=torch.float64),))
def grad_float64(x):
    return (x ** 3).sum(), x.dtype


@case(lambda: (g(3),))
def grad_enable_grad_on_no_grad_input(x):
    with torch.enable_grad():
        y = x * 2
    return y, torch.is_grad_enabled()


@case(lambda: (g(4, 4),))
def grad_autocast(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
    return y.float().sum(), y.dtype
