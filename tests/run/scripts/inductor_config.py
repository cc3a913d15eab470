import torch
import torch._inductor.config as inductor_config

inductor_config.fx_graph_cache = True
inductor_config.coordinate_descent_tuning = True
inductor_config.triton.unique_kernel_names = True
inductor_config.epilogue_fusion = False
torch._inductor.config.freezing = False


@torch.compile
def f(a, b):
    return torch.addmm(b, a, a.t()).relu()


a = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10
b = torch.ones(3)
print([[round(v, 3) for v in row] for row in f(a, b).tolist()])
