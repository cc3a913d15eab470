import torch
import torch._dynamo


def custom_op(x):
    return x.clamp(min=0) ** 2


torch._dynamo.allow_in_graph(custom_op)


@torch.compile
def f(x):
    return custom_op(x - 1).sum()


print(f(torch.tensor([0.0, 1.0, 2.0, 3.0])).item())
