import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 10), nn.SiLU(), nn.Linear(10, 2)).eval()
fast = torch.compile(model, mode="reduce-overhead")
x = torch.randn(4, 10)
with torch.inference_mode():
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        out = fast(x)
print([round(v, 3) for v in out.flatten().tolist()])
