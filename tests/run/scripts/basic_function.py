import torch


@torch.compile
def f(x, y):
    a = torch.sin(x) + torch.cos(y)
    return (a * a).sum(dim=-1)


torch.manual_seed(0)
x, y = torch.randn(4, 8), torch.randn(4, 8)
print([round(v, 4) for v in f(x, y).tolist()])
print(f(x, y).shape)
