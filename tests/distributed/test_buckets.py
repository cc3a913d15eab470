"""The ddp_buckets pass on its own (no processes): where it cuts, and that the split graph computes
what the graph did, gradients included."""
from __future__ import annotations

import types

import pytest
import torch

import ember
from ember.distributed import buckets


def fake_ddp(module, cap_bytes, first_cap=None, ignore=()):
    """What the pass reads of a DistributedDataParallel instance."""
    return types.SimpleNamespace(module=module, bucket_bytes_cap=cap_bytes, parameters_to_ignore=set(ignore),
                                 _bucket_config=types.SimpleNamespace(first_bucket_bytes_cap=first_cap or cap_bytes))


def mlp(layers=4, width=8):
    mods = []
    for i in range(layers):
        mods += [torch.nn.Linear(width, width)] + ([torch.nn.Tanh()] if i < layers - 1 else [])
    return torch.nn.Sequential(*mods)


def capture(model, x):
    """The graph and example inputs ember hands its backend for ``model(x)``."""
    seen = []

    def grab(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    ember.compile(model, backend=grab)(x)
    (gm, inputs), = seen
    return gm, inputs


LINEAR = (8 * 8 + 8) * 4  # bytes of one Linear(8, 8)


@pytest.mark.parametrize("cap, first, parts", [
    (LINEAR - 1, None, 4),          # every Linear fills a bucket
    (2 * LINEAR - 1, None, 2),      # two per bucket
    (10 * LINEAR, None, 1),         # one bucket: not split
    (2 * LINEAR - 1, LINEAR - 1, 3),  # a smaller first bucket (the last Linear alone), then two per bucket
])
def test_cuts_follow_the_bucket_caps(cap, first, parts):
    model = mlp()
    gm, inputs = capture(model, torch.randn(3, 8))
    plan = buckets.plan_buckets(gm, inputs, fake_ddp(model, cap, first))
    assert len(plan) == parts
    # parameters in reverse order of use, as DDP's gradients become ready: the last part holds the last Linear
    assert plan[-1].params[:2] in (["6.weight", "6.bias"], ["6.bias", "6.weight"])
    assert sum(len(b.params) for b in plan) == 8


def test_ignored_parameters_do_not_count():
    model = mlp()
    gm, inputs = capture(model, torch.randn(3, 8))
    ignore = [f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]
    plan = buckets.plan_buckets(gm, inputs, fake_ddp(model, LINEAR - 1, ignore=ignore))
    assert len(plan) == 1


def test_split_graph_matches_the_graph_with_gradients():
    model = mlp()
    x = torch.randn(3, 8, requires_grad=True)
    gm, inputs = capture(model, x)
    compiled = []

    def backend(part, example_inputs):
        compiled.append(part.meta["ember_split"]["index"])
        return ember.compile(part.forward, backend="ember")  # each part through the training backend

    split = buckets.split_at_buckets(gm, inputs, fake_ddp(model, LINEAR - 1), backend)
    assert split is not None
    (out,) = split(*inputs)
    (ref,) = gm(*inputs)
    torch.testing.assert_close(out, ref)
    assert sorted(compiled) == [0, 1, 2, 3]
    got = torch.autograd.grad(out.pow(2).sum(), [x, *model.parameters()])
    want = torch.autograd.grad(ref.pow(2).sum(), [x, *model.parameters()])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_no_ddp_forward_running_means_no_split():
    assert buckets.active_ddp_module() is None
    seen = []
    wrapped = buckets.with_ddp_buckets(lambda gm, inputs: seen.append(gm) or gm.forward)
    model = mlp()
    gm, inputs = capture(model, torch.randn(3, 8))
    wrapped(gm, inputs)
    assert seen == [gm]
