"""Transformer models of the zoo, written from their configs: GPT-2, BERT, LLaMA, Mixtral, ViT."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's ``gelu_new``, written out op by op as in the reference implementation.

    Eager autograd saves what these ops need (``x`` for ``pow``, the ``tanh``
    output, both factors of the final product); the scalar multiplications and
    additions save nothing, and the extractor counts exactly that.
    """
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def _split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, drop: nn.Dropout
) -> torch.Tensor:
    """Eager attention: ``softmax(q k^T / sqrt(d) [masked]) v``."""
    att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        att = torch.where(mask, att, torch.finfo(att.dtype).min)
    return torch.matmul(drop(torch.softmax(att, dim=-1)), v)


# --------------------------------------------------------------------------- GPT-2
class GPT2Attention(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_ctx: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer(
            "bias", torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool)), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)
        q, k, v = (_split_heads(z, self.n_head) for z in (q, k, v))
        y = _attend(q, k, v, self.bias[:t, :t], self.attn_dropout)
        return self.resid_dropout(self.c_proj(_merge_heads(y)))


class GPT2MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(gelu_tanh(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_ctx: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.attn = GPT2Attention(d_model, n_head, n_ctx, dropout)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.mlp = GPT2MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 (Radford et al. 2019): pre-LN decoder, learned positions, tied LM head."""

    def __init__(
        self,
        vocab: int = 50257,
        n_ctx: int = 1024,
        n_layer: int = 12,
        d_model: int = 768,
        n_head: int = 12,
        dropout: float = 0.0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"GPT2: d_model={d_model} must be divisible by n_head={n_head}")
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(n_ctx, d_model)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(
            GPT2Block(d_model, n_head, n_ctx, dropout, eps) for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(d_model, eps=eps)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------- BERT
class BertLayer(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.attn_out = nn.Linear(d_model, d_model)
        self.ln_attn = nn.LayerNorm(d_model, eps=eps)
        self.intermediate = nn.Linear(d_model, d_ff)
        self.output = nn.Linear(d_ff, d_model)
        self.ln_out = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_split_heads(f(x), self.n_head) for f in (self.query, self.key, self.value))
        a = self.attn_out(_merge_heads(_attend(q, k, v, None, self.dropout)))
        x = self.ln_attn(x + self.dropout(a))
        return self.ln_out(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class Bert(nn.Module):
    """BERT (Devlin et al. 2019): post-LN encoder with a masked-LM head tied to the embeddings."""

    def __init__(
        self,
        vocab: int = 30522,
        n_ctx: int = 512,
        n_layer: int = 12,
        d_model: int = 768,
        n_head: int = 12,
        d_ff: int = 3072,
        dropout: float = 0.0,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(n_ctx, d_model)
        self.ln_emb = nn.LayerNorm(d_model, eps=eps)
        self.layers = nn.ModuleList(
            BertLayer(d_model, n_head, d_ff, dropout, eps) for _ in range(n_layer)
        )
        self.head_dense = nn.Linear(d_model, d_model)
        self.head_ln = nn.LayerNorm(d_model, eps=eps)
        self.decoder = nn.Linear(d_model, vocab)
        self.decoder.weight = self.word.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.ln_emb(self.word(idx) + self.position(pos))
        for layer in self.layers:
            x = layer(x)
        return self.decoder(self.head_ln(F.gelu(self.head_dense(x))))


# --------------------------------------------------------------------------- LLaMA / Mixtral
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        if d_model % n_head or n_head % n_kv_head:
            raise ValueError(
                f"LlamaAttention: need d_model % n_head == 0 and n_head % n_kv_head == 0, got "
                f"d_model={d_model}, n_head={n_head}, n_kv_head={n_kv_head}"
            )
        self.n_head, self.n_kv_head, self.hd = n_head, n_kv_head, d_model // n_head
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.n_head // self.n_kv_head
        if rep > 1:
            k = k[:, :, None].expand(b, self.n_kv_head, rep, t, self.hd).reshape(b, -1, t, self.hd)
            v = v[:, :, None].expand(b, self.n_kv_head, rep, t, self.hd).reshape(b, -1, t, self.hd)
        y = _attend(q, k, v, mask, nn.Identity())  # type: ignore[arg-type]
        return self.o_proj(_merge_heads(y))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Mixtral-style sparse MoE: top-k of E SwiGLU experts with a fixed per-expert capacity.

    Each expert takes the ``capacity = ceil(capacity_factor * top_k * tokens / E)``
    tokens with the highest routing weight for it (GShard-style token
    dropping), so shapes are static and FLOPs are those of top-k routing.
    """

    def __init__(
        self, d_model: int, d_ff: int, n_expert: int, top_k: int, capacity_factor: float
    ) -> None:
        super().__init__()
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.gate = nn.Linear(d_model, n_expert, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(n_expert))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        probs = torch.softmax(self.gate(flat), dim=-1)
        top_w, top_i = torch.topk(probs, self.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        n_exp = len(self.experts)
        weights = torch.zeros_like(probs).scatter(1, top_i, top_w)  # (tokens, E)
        cap = min(b * t, math.ceil(self.capacity_factor * self.top_k * b * t / n_exp))
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            w, idx = torch.topk(weights[:, e], cap)
            y = expert(flat.index_select(0, idx)) * w.unsqueeze(-1)
            out = out.index_add(0, idx, y)
        return out.view(b, t, d)


class LlamaBlock(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_kv_head: int,
        d_ff: int,
        eps: float,
        n_expert: int,
        top_k: int,
        capacity_factor: float,
    ) -> None:
        super().__init__()
        self.input_norm = RMSNorm(d_model, eps)
        self.attn = LlamaAttention(d_model, n_head, n_kv_head)
        self.post_norm = RMSNorm(d_model, eps)
        self.mlp: nn.Module = (
            MoE(d_model, d_ff, n_expert, top_k, capacity_factor)
            if n_expert
            else SwiGLU(d_model, d_ff)
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, mask)
        return x + self.mlp(self.post_norm(x))


class Llama(nn.Module):
    """LLaMA-style decoder (Touvron et al. 2023): RMSNorm, rotary positions, SwiGLU, GQA.

    With ``n_expert > 0`` each MLP is a Mixtral-style top-``top_k`` MoE.
    """

    def __init__(
        self,
        vocab: int = 32000,
        n_ctx: int = 2048,
        n_layer: int = 32,
        d_model: int = 4096,
        n_head: int = 32,
        n_kv_head: int = 32,
        d_ff: int = 11008,
        eps: float = 1e-5,
        rope_theta: float = 10000.0,
        n_expert: int = 0,
        top_k: int = 2,
        capacity_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            LlamaBlock(d_model, n_head, n_kv_head, d_ff, eps, n_expert, top_k, capacity_factor)
            for _ in range(n_layer)
        )
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        hd = d_model // n_head
        inv = 1.0 / rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.outer(torch.arange(n_ctx, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.register_buffer(
            "causal", torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool)), persistent=False
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin, mask = self.cos[:t], self.sin[:t], self.causal[:t, :t]
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


# --------------------------------------------------------------------------- ViT
class ViTBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_ff: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln_1(x)).split(x.shape[-1], dim=2)
        q, k, v = (_split_heads(z, self.n_head) for z in (q, k, v))
        x = x + self.dropout(self.proj(_merge_heads(_attend(q, k, v, None, self.dropout))))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln_2(x)))))


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al. 2021): patch embedding, class token, pre-LN encoder."""

    def __init__(
        self,
        image_size: int = 224,
        patch: int = 16,
        n_layer: int = 12,
        d_model: int = 768,
        n_head: int = 12,
        d_ff: int = 3072,
        num_classes: int = 1000,
        dropout: float = 0.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"ViT: image_size={image_size} must be divisible by patch={patch}")
        self.patch_embed = nn.Conv2d(3, d_model, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2 + 1, d_model))
        self.blocks = nn.ModuleList(
            ViTBlock(d_model, n_head, d_ff, dropout, eps) for _ in range(n_layer)
        )
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])
