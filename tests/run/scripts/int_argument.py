import torch


class Repeat(torch.nn.Module):
    def __init__(self, times):
        super().__init__()
        self.times = times

    def forward(self, x, extra):
        return x.repeat(self.times) + extra


m = torch.compile(Repeat(2))
for extra in range(4):
    print(m(torch.tensor([1.0, 2.0]), extra).tolist())
