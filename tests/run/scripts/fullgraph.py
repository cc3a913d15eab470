import torch
import torch.nn.functional as F


@torch.compile(fullgraph=True)
def gelu_block(x, w, b):
    h = F.linear(x, w, b)
    h = F.gelu(h)
    return F.layer_norm(h, h.shape[-1:])


torch.manual_seed(0)
x, w, b = torch.randn(3, 8), torch.randn(16, 8), torch.randn(16)
out = gelu_block(x, w, b)
print(tuple(out.shape), round(out.abs().sum().item(), 2))
