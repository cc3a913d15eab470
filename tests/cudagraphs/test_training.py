"""CUDA-graph runners under ember's autograd layer, on CPU with the fake graph API: the forward and
backward graphs are each replayed, and training matches eager step for step, including the
patterns that keep graph outputs alive across calls (a kept loss, gradient accumulation, two
forwards before one backward, BatchNorm buffers)."""
import copy

import pytest
import torch

import ember
import ember.cudagraphs as cg
from ember.aot import aot_autograd, run_graph_eagerly


def _compile(model, fake):
    backend = aot_autograd(fw_compiler=cg.wrap_compiler(run_graph_eagerly, api=fake), strict=True)
    return ember.compile(model, backend=backend)


def _mlp(bn=False):
    layers = [torch.nn.Linear(8, 16)] + ([torch.nn.BatchNorm1d(16)] if bn else []) + [torch.nn.GELU(),
                                                                                      torch.nn.Linear(16, 4)]
    return torch.nn.Sequential(*layers)


def _pair(bn=False):
    torch.manual_seed(0)
    ref = _mlp(bn)
    return ref, copy.deepcopy(ref)


def _close_params(ref, test):
    for (n, p), q in zip(ref.named_parameters(), test.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    for (n, b), c in zip(ref.named_buffers(), test.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("bn", [False, True], ids=["mlp", "batchnorm"])
def test_training_steps_match_eager_and_replay(fake, bn):
    ref, twin = _pair(bn)
    model = _compile(twin, fake)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_c = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    kept = []
    for step in range(6):
        x = torch.randn(5, 8)
        for m, opt in ((ref, opt_r), (model, opt_c)):
            loss = m(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            kept.append(loss.detach())  # keeping every loss: a held output, across calls
        torch.testing.assert_close(kept[-1], kept[-2], rtol=1e-5, atol=1e-6)
        _close_params(ref, twin)
    s = cg.stats()
    assert s["recordings"] == 2 and s["replays"] >= 6 and not s["disabled"], s


def test_gradient_accumulation(fake):
    """After a replayed first micro-batch, p.grad *is* the backward graph's output (autograd takes
    it over) and is added to in place: no later replay may write over it."""
    ref, twin = _pair()
    model = _compile(twin, fake)
    for step in range(5):
        xs = [torch.randn(5, 8) for _ in range(3)]
        for m in (ref, model):
            for x in xs:
                m(x).sum().backward()
        for p, q in zip(ref.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
        for m in (ref, twin):
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.01 * p.grad
            m.zero_grad(set_to_none=True)
    assert cg.stats()["replays"] > 0


def test_two_forwards_before_one_backward(fake):
    ref, twin = _pair()
    model = _compile(twin, fake)
    for _ in range(4):
        x1, x2 = torch.randn(5, 8), torch.randn(5, 8)
        for m in (ref, model):
            l1 = m(x1).pow(2).sum()
            l2 = m(x2).sin().sum()
            (l1 + l2).backward()
        for p, q in zip(ref.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
            p.grad = q.grad = None


def test_inference_outputs_kept_in_a_list(fake):
    """Every output is kept: the recorded graph's output is still held at the next two calls, so
    the runner disables itself (production: no second recording) and no kept output is overwritten."""
    ref, twin = _pair()
    model = _compile(twin.eval(), fake)
    xs = [torch.randn(5, 8) for _ in range(8)]
    with torch.no_grad():
        outs = [model(x) for x in xs]
        for x, o in zip(xs, outs):
            torch.testing.assert_close(o, ref.eval()(x), rtol=1e-5, atol=1e-6)
    s = cg.stats()
    assert s["recordings"] == 1 and s["fallbacks"] == 1, s
    assert [d.split(": ", 1)[1] for d in s["disabled"]] == [
        "1 graph output(s) still held across calls; recording again is disabled (see runner.REPLACE_RECORDINGS)"]
