import torch

torch.manual_seed(0)
lin = torch.nn.Linear(8, 8)


@torch.compile
def f(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    return y.float().relu().sum(), y.dtype


x = torch.randn(4, 8)
s, dt = f(x)
print(round(s.item(), 1), dt)
