import torch
import torch.nn as nn

torch.manual_seed(0)
cell = nn.GRUCell(4, 6)


@torch.compile
def run(xs, h):
    for t in range(xs.shape[0]):
        h = cell(xs[t], h)
    return h


xs = torch.randn(5, 2, 4)
h = run(xs, torch.zeros(2, 6))
print(tuple(h.shape), round(h.sum().item(), 3))
