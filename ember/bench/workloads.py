"""The workloads ``ember bench`` times: small models and functions, each at two sizes.

The "quick" suite fits a 2-core CPU in well under a minute; the "gpu" suite uses sizes where a GPU
has real work to do. A workload's sizes live in the SIZES table, next to the builder that uses them.
``benchmarks/bench_peer.py`` imports this module, so torch.compile sees exactly the same workloads.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

SUITES = ("quick", "gpu")


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[..., tuple]   # build(device, dtype, **sizes) -> (callable, args tuple)
    needs: str | None = None      # a module that must be importable, else the workload is skipped


def _mlp(device, dtype, batch, width, depth):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers), (torch.randn(batch, width),)


class _ConvBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


def _convnet(device, dtype, batch, size, width):
    blocks = [_ConvBlock(3, width, 1), _ConvBlock(width, 2 * width, 2), _ConvBlock(2 * width, 4 * width, 2)]
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10))
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():  # fresh BatchNorm stats (0 and 1) would make eval-mode BatchNorm an identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model, (torch.randn(batch, 3, size, size),)


class _Block(nn.Module):
    """A pre-norm transformer block: attention through scaled_dot_product_attention, then an MLP."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def _attention(device, dtype, batch, seq, dim, heads, depth):
    return nn.Sequential(*[_Block(dim, heads) for _ in range(depth)]), (torch.randn(batch, seq, dim),)


def _pointwise_chain(x):
    # six elementwise ops: eager reads and writes memory for each, a fusing compiler once
    return (torch.sigmoid(x) * x + torch.tanh(x) * 0.5).clamp(-2.0, 2.0) - x.square() * 0.1


def _pointwise(device, dtype, numel):
    return _pointwise_chain, (torch.randn(numel),)


def _norm_softmax(x, weight):
    # layer norm then a row softmax: two reductions per row and the pointwise work around them
    return torch.softmax(F.layer_norm(x, x.shape[-1:], weight) * 2.0, dim=-1)


def _softmax(device, dtype, rows, cols):
    return _norm_softmax, (torch.randn(rows, cols), torch.rand(cols) + 0.5)


def _gpt2(device, dtype, batch, seq, layers, width):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=1000, n_positions=max(seq, 64),
                     bos_token_id=0, eos_token_id=0, use_cache=False)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(0))

    def logits(ids):  # the tensor alone: the ModelOutput wrapper is not what is being timed
        return model(ids).logits

    logits.module = model
    return logits, (ids,)


WORKLOADS = {w.name: w for w in [
    Workload("mlp", "Linear + GELU stack", _mlp),
    Workload("convnet", "3 residual conv blocks with BatchNorm", _convnet),
    Workload("attention", "pre-norm transformer blocks (SDPA, causal)", _attention),
    Workload("pointwise", "a chain of 6 elementwise ops", _pointwise),
    Workload("softmax", "layer_norm then softmax over rows", _softmax),
    Workload("gpt2", "Hugging Face GPT-2 logits (random weights)", _gpt2, needs="transformers"),
]}

# sizes per suite; a workload absent from a suite is not part of it
SIZES = {
    "quick": {
        "mlp": dict(batch=32, width=256, depth=4),
        "convnet": dict(batch=4, size=32, width=16),
        "attention": dict(batch=2, seq=64, dim=128, heads=4, depth=2),
        "pointwise": dict(numel=1 << 18),
        "softmax": dict(rows=512, cols=512),
        "gpt2": dict(batch=2, seq=64, layers=2, width=128),
    },
    "gpu": {
        "mlp": dict(batch=512, width=2048, depth=8),
        "convnet": dict(batch=64, size=64, width=64),
        "attention": dict(batch=8, seq=512, dim=512, heads=8, depth=4),
        "pointwise": dict(numel=1 << 24),
        "softmax": dict(rows=8192, cols=2048),
        "gpt2": dict(batch=8, seq=256, layers=4, width=256),
    },
}


def select(suite: str, names: str | None) -> list[Workload]:
    """The suite's workloads, optionally filtered by a comma list of names."""
    if suite not in SIZES:
        raise ValueError(f"unknown suite {suite!r}; suites: {', '.join(SIZES)}")
    chosen = list(SIZES[suite])
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in SIZES[suite]]
        if unknown:
            raise ValueError(f"workload(s) {unknown} not in suite {suite!r}; it has: {', '.join(chosen)}")
        chosen = wanted
    return [WORKLOADS[n] for n in chosen]


def build(workload: Workload, suite: str, device: str, dtype: torch.dtype) -> tuple[Callable, tuple]:
    """The callable (an eval-mode module or a function) and its inputs, on ``device`` in ``dtype``."""
    torch.manual_seed(0)
    fn, args = workload.build(device, dtype, **SIZES[suite][workload.name])
    module = fn if isinstance(fn, nn.Module) else getattr(fn, "module", None)
    if module is not None:
        module.to(device=device, dtype=dtype).eval()
    args = tuple(a.to(device=device, dtype=dtype if a.is_floating_point() else a.dtype) for a in args)
    return fn, args
