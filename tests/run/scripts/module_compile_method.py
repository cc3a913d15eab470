import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 3))
model.compile()
x = torch.randn(5, 6)
out = model(x)
out.sum().backward()
print(tuple(out.shape), round(out.sum().item(), 3), round(model[0].weight.grad.abs().sum().item(), 3))
