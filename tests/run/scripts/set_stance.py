import torch


@torch.compile
def f(x):
    return x * 10


print(f(torch.ones(1)).tolist())
with torch.compiler.set_stance("force_eager"):
    print(f(torch.ones(2)).tolist())
torch.compiler.set_stance("eager_on_recompile")
print(f(torch.ones(3)).tolist())
torch.compiler.set_stance("default")
