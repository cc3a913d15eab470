import torch
import torch.nn as nn

torch.manual_seed(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)


@torch.compile
def loss_fn(x, y):
    return ((model(x) - y) ** 2).mean()


x = torch.randn(32, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(6):
    opt.zero_grad()
    loss = loss_fn(x, y)
    loss.backward()
    opt.step()
    if step % 2 == 0:
        print(step, round(loss.item(), 3))
