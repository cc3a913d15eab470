"""A compiled graph called directly (no frontend guards in front of it) picks the variant of each
call's autograd situation; the per-call key is computed inline (``AOTCompiledGraph.__call__``), for
graphs of tensors only and for graphs with size symbols among their inputs."""
import pytest
import torch

import ember
from ember.aot import aot_autograd, run_graph_eagerly


class Keep:
    """A backend that keeps the compiled graph and its example inputs."""

    def __init__(self):
        self.backend = aot_autograd(fw_compiler=run_graph_eagerly, bw_compiler=run_graph_eagerly, strict=True)
        self.graphs = []

    def __call__(self, gm, example_inputs):
        compiled = self.backend(gm, example_inputs)
        self.graphs.append((compiled, list(example_inputs)))
        return compiled


@pytest.mark.parametrize("dynamic", [False, True])
def test_direct_calls_follow_requires_grad_and_grad_mode(dynamic):
    def f(x, w, n):
        return (x * w).sum(-1) * n

    keep = Keep()
    x, w = torch.randn(3, 4), torch.randn(4)
    cf = ember.compile(f, backend=keep, dynamic=dynamic)
    cf(x, w, 3)
    cf(x, w, 5)  # (dynamic: n becomes a size symbol, an input of the graph)
    compiled, examples = keep.graphs[-1]
    if dynamic:  # a size symbol among the graph's inputs
        assert any(not isinstance(a, torch.Tensor) for a in examples)
    w_pos = next(i for i, a in enumerate(examples) if isinstance(a, torch.Tensor) and a.shape == (4,))
    wg = w.clone().requires_grad_(True)
    args = list(examples)
    args[w_pos] = wg
    out = compiled(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.requires_grad
    out.sum().backward()
    n = next((int(a) for a in args if not isinstance(a, torch.Tensor)), 5)  # (static: 5, the newest graph's)
    torch.testing.assert_close(wg.grad, x.sum(0) * n)
    with torch.no_grad():
        out = compiled(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert not out.requires_grad
    assert sorted(v.kind for v in compiled.variants.values()) == ["inference", "training"]
