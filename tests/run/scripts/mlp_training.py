import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
cmodel = torch.compile(model)
x = torch.randn(64, 16)
target = torch.randint(0, 4, (64,))
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(cmodel(x), target)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.3f}")
