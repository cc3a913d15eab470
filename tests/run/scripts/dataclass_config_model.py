from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class Config:
    vocab: int = 50
    dim: int = 16
    heads: int = 2
    layers: int = 2


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.dim)
        self.attn = nn.MultiheadAttention(cfg.dim, cfg.heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim), nn.GELU(), nn.Linear(4 * cfg.dim, cfg.dim))

    def forward(self, x, mask):
        h = self.ln(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, ids):
        n = ids.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(x)


torch.manual_seed(0)
model = TinyLM(Config()).eval()
cm = torch.compile(model)
ids = torch.randint(0, 50, (2, 7))
with torch.no_grad():
    logits = cm(ids)
print(tuple(logits.shape), logits.argmax(-1).tolist())
