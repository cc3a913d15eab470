"""A small pre-norm transformer made of repeated blocks, for the regional-compilation tests and benchmark."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, p: float = 0.0, hidden: int | None = None):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden or 4 * dim)
        self.out = nn.Linear(hidden or 4 * dim, dim)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class Tiny(nn.Module):
    def __init__(self, layers: int = 4, dim: int = 32, vocab: int = 64, blocks=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(blocks if blocks is not None else [Block(dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


class PostNormBlock(nn.Module):
    """BERT's layer: attention under an additive mask, a LayerNorm after each residual add."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int | None = None):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.ln1 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden or 4 * dim)
        self.out = nn.Linear(hidden or 4 * dim, dim)
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x, mask):
        b, t, c = x.shape

        def split(y):
            return y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=mask)
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, t, c)))
        return self.ln2(x + self.out(F.gelu(self.fc(x))))


class Encoder(nn.Module):
    """A BERT-shaped encoder: embedding, a padding mask made once, post-norm layers sharing it."""

    def __init__(self, layers: int = 4, dim: int = 32, vocab: int = 64, blocks=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(blocks if blocks is not None else [PostNormBlock(dim) for _ in range(layers)])

    def forward(self, idx, keep):
        x = self.ln(self.emb(idx))
        mask = torch.zeros(keep.shape, dtype=x.dtype).masked_fill(~keep, float("-inf"))[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x
