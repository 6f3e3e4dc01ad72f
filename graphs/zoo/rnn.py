"""Recurrent models of the device-placement papers, unrolled in time: RNNLM and attention NMT."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LSTMLayer(nn.Module):
    """One LSTM layer unrolled over time (input projection for all steps at once, then a step loop)."""

    def __init__(self, d_in: int, d_hidden: int) -> None:
        super().__init__()
        self.d_hidden = d_hidden
        self.w_ih = nn.Linear(d_in, 4 * d_hidden)
        self.w_hh = nn.Linear(d_hidden, 4 * d_hidden, bias=False)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        xg = self.w_ih(x)
        if state is None:
            h = x.new_zeros(b, self.d_hidden)
            c = x.new_zeros(b, self.d_hidden)
        else:
            h, c = state
        outs = []
        for s in range(t):
            i, f, g, o = (xg[:, s] + self.w_hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1), (h, c)


class RNNLM(nn.Module):
    """LSTM language model (Zaremba et al. 2014), the RNNLM of Mirhoseini et al. (ICML 2017)."""

    def __init__(self, vocab: int = 10000, n_layer: int = 2, d_model: int = 2048) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(LSTMLayer(d_model, d_model) for _ in range(n_layer))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x, _ = layer(x)
        return self.head(x)


class NMT(nn.Module):
    """LSTM encoder-decoder with Luong (dot) attention (Wu et al. 2016 style), as in Mirhoseini et al.

    ``forward(src, tgt)`` returns the logits predicting ``tgt[:, 1:]`` from ``tgt[:, :-1]``.
    """

    def __init__(self, vocab: int = 32000, n_layer: int = 2, d_model: int = 1024) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model)
        self.encoder = nn.ModuleList(LSTMLayer(d_model, d_model) for _ in range(n_layer))
        self.decoder = nn.ModuleList(LSTMLayer(d_model, d_model) for _ in range(n_layer))
        self.attn_out = nn.Linear(2 * d_model, d_model, bias=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.src_embed(src)
        states = []
        for layer in self.encoder:
            x, st = layer(x)
            states.append(st)
        memory = x  # (B, S, D)
        y = self.tgt_embed(tgt[:, :-1])
        for layer, st in zip(self.decoder, states):
            y, _ = layer(y, st)
        scores = torch.softmax(torch.matmul(y, memory.transpose(1, 2)), dim=-1)  # (B, T, S)
        ctx = torch.matmul(scores, memory)
        return self.head(torch.tanh(self.attn_out(torch.cat((y, ctx), dim=-1))))


def nmt_loss(logits: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the decoder logits against the target shifted by one."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
