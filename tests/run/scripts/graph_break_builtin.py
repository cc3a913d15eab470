import torch
import torch._dynamo


@torch.compile
def f(x):
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


print(f(torch.tensor([1.0, 2.0])).tolist())
print("compiling:", torch.compiler.is_compiling(), torch._dynamo.is_compiling())
