import torch
import torch._dynamo


@torch._dynamo.config.patch(cache_size_limit=4)
def run():
    @torch.compile(dynamic=False)
    def f(x):
        return x + x.numel()

    return [f(torch.zeros(n)).sum().item() for n in range(1, 4)]


print(run())
with torch._dynamo.config.patch("suppress_errors", True):
    print(torch.compile(lambda t: t.flip(0))(torch.arange(3)).tolist())
print(torch._dynamo.config.suppress_errors)
