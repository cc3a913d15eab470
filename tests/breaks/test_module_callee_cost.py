"""A module called where a graph break sits inside it (an FSDP2 block in the model's loop, issue 31):
each call goes through the break function's call wrapper (``resume._wrap_region_calls``'s ``guarded``)
and ``BreakContext.compiled_callee``, at every step. They used to ask the module for ``__func__`` and
``__code__`` (five times per call), which nn.Module answers through ``__getattr__`` by raising
AttributeError: ~5 us per call of each block, in a host-bound FSDP2 step. A module has neither, so
they are no longer asked; results and what gets compiled are as before."""
from __future__ import annotations

import torch

import ember


class Counting(torch.nn.Module):
    """A block with a graph break in its forward that counts nn.Module.__getattr__'s lookups."""

    lookups: list = []

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def __getattr__(self, name):
        if name.startswith("__"):
            Counting.lookups.append(name)
        return super().__getattr__(name)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        torch._dynamo.graph_break()  # ember: a break (trace_rules.BREAKS_BY_NAME)
        return y + 1


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.h = torch.nn.ModuleList([Counting() for _ in range(3)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x.sum()


def test_module_callee_asks_no_dunder_attributes():
    torch.manual_seed(0)
    model = Outer()
    compiled = ember.compile(model, backend="eager")
    x = torch.randn(2, 4, requires_grad=True)
    want = model(x)
    want.backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for _ in range(2):  # compile, then steady state
        got = compiled(x)
    Counting.lookups.clear()
    got = compiled(x)
    got.backward()
    assert Counting.lookups == [], Counting.lookups  # before: __func__, __code__ ... per block call
    torch.testing.assert_close(got, want)
    for p, g in zip(model.parameters(), want_grads):
        torch.testing.assert_close(p.grad, g)
