"""A residual MLP for feature vectors (imports torch; load it through :mod:`mtfl_custom_task.models`).

The architecture is the "ResNet for tabular data" of Gorishniy et al. 2021 ("Revisiting Deep
Learning Models for Tabular Data", NeurIPS, §3.2), without dropout::

    h0 = Linear(F, d)(x)
    h_{k+1} = h_k + Linear(2d, d)(ReLU(Linear(d, 2d)(LayerNorm(h_k))))      k = 0 .. depth-1
    logits = Linear(d, C)(ReLU(LayerNorm(h_depth)))

LayerNorm normalises each sample on its own, so the model has no BatchNorm statistics and trains
alike at any batch size, including the small ones a label-skewed shard may give.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """``h + Linear(2d, d)(ReLU(Linear(d, 2d)(LayerNorm(h))))`` on ``(N, d)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.expand = nn.Linear(width, 2 * width)
        self.project = nn.Linear(2 * width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = h + self.project(torch.relu(self.expand(self.norm(h))))
        return out


class TabularMLP(nn.Module):
    """Residual MLP: ``(N, in_features)`` float32 -> ``(N, num_classes)`` logits.

    Args:
        in_features: ``F``, features per sample.
        num_classes: ``C``, output logits per sample.
        width: ``d``, the hidden width.
        depth: number of residual blocks.
    """

    def __init__(self, *, in_features: int, num_classes: int, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.in_features = in_features
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"x: expected a (N, {self.in_features}) batch, got {tuple(x.shape)}")
        out: torch.Tensor = self.head(torch.relu(self.norm(self.blocks(self.stem(x)))))
        return out
