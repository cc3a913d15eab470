import torch

torch._dynamo.config.capture_scalar_outputs = True
torch._dynamo.config.capture_dynamic_output_shape_ops = True


@torch.compile
def f(x):
    m = x.max().item()
    idx = torch.nonzero(x > 0).flatten()
    return x / m, idx


torch.manual_seed(0)
a, b = f(torch.randn(6))
print([round(v, 3) for v in a.tolist()], b.tolist())
