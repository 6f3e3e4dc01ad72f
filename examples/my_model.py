"""A model of one's own, named by import path: ``model: examples.my_model:build`` in an env config.

Any importable ``package.module:function`` works the same way: the function takes the
env's ``model_config`` as keyword arguments and returns an object with ``module`` (an
``nn.Module``), ``example_inputs`` (a tuple of tensors, the global batch on dim 0,
passed to ``module(*example_inputs)``) and ``loss_fn(output, *example_inputs)`` (a
scalar mean over the batch), e.g. a :class:`runtime.model.RuntimeModel`. It is
extracted with ``torch.export`` for training and planning, and built again on every
rank by ``runners.execute`` (after seeding, so every rank has the same weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model import RuntimeModel


class ResidualMLP(nn.Module):
    """``n_layer`` residual blocks ``x + W2 gelu(W1 layernorm(x))`` between an input and a class head."""

    def __init__(self, d_in: int, width: int, n_layer: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(n_layer))
        self.up = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(n_layer))
        self.down = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(n_layer))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for norm, up, down in zip(self.norms, self.up, self.down):
            h = h + down(F.gelu(up(norm(h))))
        return self.head(h)


def _loss(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Cross entropy against a label read off the input (which half its first feature is in)."""
    return F.cross_entropy(logits, (x[:, 0] > 0).long())


def build(
    batch: int = 32, d_in: int = 64, width: int = 128, n_layer: int = 4, classes: int = 10
) -> RuntimeModel:
    """The residual MLP on random inputs ``(batch, d_in)``, ``classes >= 2`` outputs."""
    config = {"batch": batch, "d_in": d_in, "width": width, "n_layer": n_layer, "classes": classes}
    return RuntimeModel(
        ResidualMLP(d_in, width, n_layer, classes), (torch.randn(batch, d_in),), _loss, config
    )
