import torch


def f(x):
    return torch.tanh(x) * torch.sigmoid(x) + 1


opts = {"epilogue_fusion": True, "max_autotune": False, "triton.cudagraphs": False,
        "shape_padding": True, "coordinate_descent_tuning": False, "freezing": False}
g = torch.compile(f, options=opts)
x = torch.linspace(-2, 2, 9)
print([round(v, 4) for v in g(x).tolist()])
h = torch.compile(f, backend="inductor", options={"trace.enabled": False, "cpp_wrapper": False})
print(round(h(x).sum().item(), 4))
