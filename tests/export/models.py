"""Models for the export tests: small transformers configs (skipped without transformers), a ResNet
and a ViT from torchvision/timm when installed, and small in-file ResNet/ViT blocks that always run."""
from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

HAS = {name: importlib.util.find_spec(name) is not None for name in ("transformers", "torchvision", "timm")}


class ResidualBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class TinyResNet(nn.Module):
    def __init__(self, c=8, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(c), ResidualBlock(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class TinyViT(nn.Module):
    def __init__(self, dim=32, patch=4, image=16, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.encoder(t)[:, 0]))


def build(name: str):
    """(model in eval mode, function batch -> example args tuple, output -> tensor to compare)."""
    torch.manual_seed(0)
    if name in ("gpt2", "bert", "llama"):
        import transformers as tf
        if name == "gpt2":
            m = tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                           use_cache=False))
        elif name == "bert":
            m = tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                           intermediate_size=128, vocab_size=128, max_position_embeddings=64))
        else:
            m = tf.LlamaModel(tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                             max_position_embeddings=64, use_cache=False))
        return m.eval(), (lambda b: (torch.randint(0, 128, (b, 16)),)), (lambda out: out.last_hidden_state)
    image = lambda b: (torch.randn(b, 3, 16, 16),)  # noqa: E731
    if name == "tiny_resnet":
        return TinyResNet().eval(), image, (lambda out: out)
    if name == "tiny_vit":
        return TinyViT().eval(), image, (lambda out: out)
    if name in ("resnet18", "resnet50"):
        import torchvision
        net = getattr(torchvision.models, name)(num_classes=10)
        return net.eval(), (lambda b: (torch.randn(b, 3, 64, 64),)), (lambda o: o)
    if name == "vit":
        import timm
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10)
        return m.eval(), (lambda b: (torch.randn(b, 3, 32, 32),)), (lambda o: o)
    raise KeyError(name)


NEEDS = {"gpt2": "transformers", "bert": "transformers", "llama": "transformers", "resnet18": "torchvision",
         "vit": "timm", "tiny_resnet": None, "tiny_vit": None}
GPU_ONLY = {"resnet50": "torchvision"}  # (too slow for the CPU round trips)
