import torch
import torch._dynamo


def f(x):
    y = x.sin()
    print("between graphs")
    return y.cos() + 1


exp = torch._dynamo.explain(f)(torch.ones(3))
print("graphs", exp.graph_count, "breaks", exp.graph_break_count)
torch._dynamo.reset()
g = torch.compile(f)
print([round(v, 4) for v in g(torch.ones(3)).tolist()])
torch.compiler.reset()
print([round(v, 4) for v in g(torch.zeros(2)).tolist()])
