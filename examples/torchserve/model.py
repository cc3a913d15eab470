"""The served model: a small image classifier (float32 images of shape (N, 3, 32, 32) -> 10 logits).

TorchServe's loader imports this file, expects exactly one class in it, builds it without arguments and
loads the archive's state_dict into it; ``client.py`` builds the same model as the eager reference.
"""
import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.GELU(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.features(x)
        return self.head(torch.flatten(x.mean(dim=(2, 3)), 1))
