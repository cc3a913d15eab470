"""Shared helpers of the autograd-layer tests: a recording aot_autograd backend, eager-vs-compiled
runners, and per-dtype tolerances."""
from __future__ import annotations

import copy

import torch

import ember
from ember.aot import aot_autograd, run_graph_eagerly

# (rtol, atol) for comparing compiled against eager results and gradients, by dtype
TOL = {
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),  # torch's fp32 defaults: the graphs run ATen on CPU
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=1e-2, atol=1e-2),
}


class Recorder:
    """An aot_autograd backend that keeps every AOTCompiledGraph it builds (and the graphs its
    compilers were handed)."""

    def __init__(self, **aot_kwargs):
        self.fw_graphs, self.bw_graphs = [], []
        aot_kwargs.setdefault("fw_compiler", self._keep(self.fw_graphs))
        aot_kwargs.setdefault("bw_compiler", self._keep(self.bw_graphs))
        aot_kwargs.setdefault("strict", True)
        self.backend = aot_autograd(**aot_kwargs)
        self.compiled = []

    @staticmethod
    def _keep(store):
        def compiler(gm, example_inputs):
            store.append(gm)
            return run_graph_eagerly(gm, example_inputs)
        return compiler

    def __call__(self, gm, example_inputs):
        c = self.backend(gm, example_inputs)
        self.compiled.append(c)
        return c

    @property
    def variants(self):
        return [v for c in self.compiled for v in c.variants.values()]

    def kinds(self):
        return [v.kind for v in self.variants]


def close(actual, expected, what=""):
    tol = TOL.get(expected.dtype, TOL[torch.float32])
    torch.testing.assert_close(actual, expected, **tol, msg=lambda m: f"{what}: {m}")


def assert_same_grads(ref: torch.nn.Module, test: torch.nn.Module):
    for (name, p), (_, q) in zip(ref.named_parameters(), test.named_parameters()):
        if p.grad is None:
            assert q.grad is None, f"{name}: eager grad is None, compiled is not"
            continue
        assert q.grad is not None, f"{name}: compiled grad is None"
        close(q.grad, p.grad, f"grad of {name}")


def assert_same_buffers(ref: torch.nn.Module, test: torch.nn.Module):
    for (name, b), (_, c) in zip(ref.named_buffers(), test.named_buffers()):
        torch.testing.assert_close(c, b, msg=lambda m: f"buffer {name}: {m}")


def train_step_pair(model, make_loss, seed=1, backend=None):
    """One forward+backward of ``model`` eagerly and of a compiled deep copy, from the same seed.
    Returns (eager_model, compiled_model, eager_loss, compiled_loss, backend)."""
    backend = backend or Recorder()
    twin = copy.deepcopy(model)
    compiled = ember.compile(twin, backend=backend)
    torch.manual_seed(seed)
    ref_loss = make_loss(model)
    ref_loss.backward()
    torch.manual_seed(seed)
    loss = make_loss(compiled)
    loss.backward()
    return model, twin, ref_loss, loss, backend
