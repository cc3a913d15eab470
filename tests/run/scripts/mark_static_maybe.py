import torch
from torch._dynamo import mark_static, maybe_mark_dynamic


@torch.compile
def f(x, y):
    return x @ y


for n in (4, 6, 8):
    x = torch.ones(n, 3)
    y = torch.ones(3, 2)
    maybe_mark_dynamic(x, 0)
    mark_static(y)
    print(f(x, y).shape, f(x, y).sum().item())
