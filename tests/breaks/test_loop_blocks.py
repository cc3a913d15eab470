"""A loop over a ModuleList of identical blocks with a graph break in its body (``for block in
self.h: x = block(x); print(...)``): the loop runs as Python and its body as compiled segments, and
the block is a loop variable, a different object each iteration. One segment must serve every block
(the module is guarded by its class and structure, not its identity; its parameters are graph inputs
read from the block of the call), and everything that does tell blocks apart must still recompile:
a float attribute, a parameter's shape, an instance attribute shadowing a class attribute, a
different number of children, an identity test in the body. Outputs and gradients equal eager's."""
from __future__ import annotations

import contextlib
import io

import pytest
import torch

import ember
from ember.diagnostics import counters

N_BLOCKS = 12


class Block(torch.nn.Module):
    scale = 1.0  # a class attribute: an instance may shadow it

    def __init__(self, width=8, eps=1e-5, extra=0):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width, eps=eps)
        self.extras = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(extra)])

    def forward(self, x):
        y = torch.relu(self.lin(self.norm(x))) * self.scale
        for m in self.extras:
            y = m(y)
        return x + y


class Stack(torch.nn.Module):
    def __init__(self, blocks, identity_test=False):
        super().__init__()
        self.h = torch.nn.ModuleList(blocks)
        self.identity_test = identity_test

    def forward(self, x):
        for i, block in enumerate(self.h):
            x = block(x)
            if self.identity_test and block is self.h[0]:
                x = x * 2
            print("block", i, "done")  # the graph break inside the loop
        return x.sum()


def _run(model, x, backend="eager"):
    """(loss, input grad, parameter grads, printed text) of one forward+backward."""
    x = x.clone().requires_grad_(True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loss = model(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss.detach(), x.grad, grads, out.getvalue()


def check(blocks_fn, identity_test=False, calls=2):
    """Compile a Stack of ``blocks_fn()`` and compare ``calls`` steps with an eager copy; returns
    (the body segment's cache entries, compile counters since the start)."""
    torch.manual_seed(0)
    model = Stack(blocks_fn(), identity_test)
    ref = Stack(blocks_fn(), identity_test)
    ref.load_state_dict(model.state_dict())
    compiled = ember.compile(model, backend="aot_eager")
    before, fallbacks = counters.compiled_snapshot(), counters.fallbacks()
    for step in range(calls):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        got, want = _run(compiled, x), _run(ref, x)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
        assert len(got[2]) == len(want[2])
        for a, b in zip(got[2], want[2]):
            torch.testing.assert_close(a, b)
        assert got[3] == want[3]
    assert counters.fallbacks() == fallbacks, "something ran eagerly (the recompile limit?)"
    segment = _body_segment(compiled)
    return segment, counters.compiled_snapshot() - before


def _body_segment(compiled):
    todo, seen = [compiled._ember_cache], set()
    while todo:
        cache = todo.pop()
        if id(cache) in seen:
            continue
        seen.add(id(cache))
        if "for loop" in cache.root.name and "body from line" in cache.root.name and \
                any(e.graph is not None for e in cache.entries):
            return cache
        todo += cache.break_context.caches()
    raise AssertionError("no compiled loop body segment")


def test_identical_blocks_share_one_segment():
    segment, compiles = check(lambda: [Block() for _ in range(N_BLOCKS)])
    # the first iteration has no `block` local yet, the second has: two entries for twelve blocks
    assert len(segment.entries) <= 2, segment.recompile_reasons
    assert not any("different object" in r for r in segment.recompile_reasons), segment.recompile_reasons
    assert compiles["graphs_compiled"] <= 6, compiles  # was one per block (then the recompile limit)


@pytest.mark.parametrize("vary, why", [
    (lambda i: Block(eps=1e-5 if i % 2 else 1e-3), "eps changed"),
    (lambda i: Block(width=8, extra=i % 2), "keys changed"),
])
def test_blocks_that_differ_compile_apart(vary, why):
    segment, _ = check(lambda: [vary(i) for i in range(4)])
    assert any(why in r for r in segment.recompile_reasons), segment.recompile_reasons


def test_instance_attribute_shadowing_a_class_attribute():
    def blocks():
        out = [Block() for _ in range(4)]
        out[2].scale = 3.0  # in the instance dict of one block only: its forward reads 3.0
        return out
    segment, _ = check(blocks)
    assert any("__dict__ keys changed" in r for r in segment.recompile_reasons), segment.recompile_reasons


def test_identity_test_in_the_body_pins_the_block():
    # `block is self.h[0]` must be answered for each block: the entry is guarded by identity again
    segment, _ = check(lambda: [Block() for _ in range(4)], identity_test=True)
    assert any("different object" in r for r in segment.recompile_reasons), segment.recompile_reasons


def test_swapped_submodule_class_recompiles():
    def blocks():
        out = [Block() for _ in range(4)]
        out[3].norm = torch.nn.Identity()
        return out
    segment, _ = check(blocks)
    assert any("type changed" in r for r in segment.recompile_reasons), segment.recompile_reasons


def test_first_iteration_shares_the_entry():
    # the loop variables `i, block` are unbound when the first iteration's body starts and bound at
    # the later ones; the body stores them before reading them, so one entry serves all (FSDP2's
    # per-block hooks broke the graph this way: one recompile per model, issue 31)
    segment, compiles = check(lambda: [Block() for _ in range(N_BLOCKS)], calls=3)
    assert len(segment.entries) == 1, segment.recompile_reasons
    assert not segment.recompile_reasons, segment.recompile_reasons


class NamedStack(Stack):
    def forward(self, x):
        block = "a block's name"
        for block in self.h:
            x = block(x)
            print("done")
        return x.sum() + len(str(type(block)))


def test_loop_variable_bound_before_the_loop():
    # `block` is bound before the loop (to a str): dead at the body's entry all the same
    torch.manual_seed(0)
    model = NamedStack([Block() for _ in range(4)])
    ref = NamedStack([Block() for _ in range(4)])
    ref.load_state_dict(model.state_dict())
    compiled = ember.compile(model, backend="aot_eager")
    for step in range(2):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        got, want = _run(compiled, x), _run(ref, x)
        torch.testing.assert_close(got[0], want[0])
        assert got[3] == want[3]
    assert len(_body_segment(compiled).entries) == 1
