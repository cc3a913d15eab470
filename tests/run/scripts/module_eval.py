import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = x.mean(dim=(2, 3))
        return self.fc(x)


torch.manual_seed(0)
net = Net().eval()
cnet = torch.compile(net)
x = torch.randn(2, 3, 8, 8)
with torch.no_grad():
    out = cnet(x)
print(tuple(out.shape), [round(v, 3) for v in out[0].tolist()])
print("parameters", sum(p.numel() for p in cnet.parameters()))
