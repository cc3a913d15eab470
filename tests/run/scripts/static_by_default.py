import torch
import torch._dynamo

torch._dynamo.config.assume_static_by_default = False
torch._dynamo.config.automatic_dynamic_shapes = True


@torch.compile
def f(x):
    return (x * x).sum(dim=0)


for n in (3, 4, 5):
    print(f(torch.ones(n, 2)).tolist())
torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.assume_static_by_default = True
