import torch
import torch._dynamo


def f(x):
    return x.abs().sqrt() * 2


opt_f = torch._dynamo.optimize("eager")(f)
print(opt_f(torch.tensor([4.0, -9.0])).tolist())
opt_g = torch._dynamo.optimize("inductor", nopython=True)(f)
print(opt_g(torch.tensor([16.0])).tolist())
