import torch
import torch._dynamo as dynamo

dynamo.config.suppress_errors = True
dynamo.config.verbose = False


@torch.compile
def f(x):
    y = x.relu()
    return y.cumsum(0) - x


print(f(torch.tensor([1.0, -2.0, 3.0])).tolist())
