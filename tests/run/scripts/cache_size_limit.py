import torch
import torch._dynamo

torch._dynamo.config.cache_size_limit = 2


@torch.compile(dynamic=False)
def scale(x, k):
    return x * k


for k in range(5):
    print(k, scale(torch.ones(3), k).tolist())
