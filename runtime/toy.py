"""Small models for runtime tests, docs and profiling (``{"factory": "runtime.toy:NAME"}``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model import RuntimeModel


class Branchy(nn.Module):
    """Two parallel branches joined by an add, then a head: a DAG, not a chain."""

    def __init__(self, d: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, hidden)
        self.b = nn.Linear(d, hidden)
        self.c = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x)) + torch.tanh(self.b(x))
        return self.head(torch.relu(self.c(h)) + h)


def _regression_loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return ((out - x.flip(-1)) ** 2).mean()


def branchy(batch: int = 8, d: int = 8, hidden: int = 16) -> RuntimeModel:
    """A branchy regression model on random inputs ``(batch, d)``."""
    return RuntimeModel(
        Branchy(d, hidden), (torch.randn(batch, d),), _regression_loss, {"batch": batch, "d": d}
    )


class MLPBlock(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, hidden)
        self.proj = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class TinyLM(nn.Module):
    """Token embedding, ``n_layer`` residual MLP blocks with layer norm, a tied LM head."""

    def __init__(self, vocab: int = 32, d: int = 16, n_layer: int = 2, hidden: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(MLPBlock(d, hidden) for _ in range(n_layer))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.wte(idx)
        for blk in self.blocks:
            h = h + blk(h)
        return self.ln(h) @ self.wte.weight.t()


def _lm_loss(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def tiny_lm(
    batch: int = 8, seq: int = 8, vocab: int = 32, d: int = 16, n_layer: int = 2, hidden: int = 32
) -> RuntimeModel:
    """A tiny language model with tied embeddings on random tokens ``(batch, seq)``."""
    return RuntimeModel(
        TinyLM(vocab, d, n_layer, hidden),
        (torch.randint(0, vocab, (batch, seq)),),
        _lm_loss,
        {"batch": batch, "seq": seq, "vocab": vocab, "d": d, "n_layer": n_layer},
    )


def mlp(batch: int = 8, d: int = 8, hidden: int = 16) -> RuntimeModel:
    """One Megatron-style MLP block (``mlp.fc`` then ``mlp.proj``) and a regression loss."""
    module = nn.Sequential()
    module.add_module("mlp", MLPBlock(d, hidden))
    return RuntimeModel(
        module, (torch.randn(batch, d),), _regression_loss, {"batch": batch, "d": d}
    )
