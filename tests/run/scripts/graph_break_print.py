import torch


@torch.compile
def step(x, i):
    x = x * 1.5
    print(f"iteration {i} shape {tuple(x.shape)}")
    return x - 0.25


x = torch.ones(2, 2)
for i in range(3):
    x = step(x, i)
print(x.tolist())
