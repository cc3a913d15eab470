import torch
import torch._dynamo


@torch._dynamo.disable(recursive=False)
def helper(x):
    return x.tolist()


@torch.compile(fullgraph=False)
def f(x):
    return helper(x * 3), x + 1


print(f(torch.tensor([1.0, 2.0])))
