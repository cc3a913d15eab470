import torch


@torch.compile(dynamic=True)
def softmax_rows(x):
    return torch.softmax(x * 0.5, dim=-1)


for n in (2, 3, 7, 11):
    x = torch.linspace(-1, 1, n * n).reshape(n, n)
    y = softmax_rows(x)
    print(n, tuple(y.shape), round(y[0, 0].item(), 4))
