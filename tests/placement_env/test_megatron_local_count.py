"""`ModelDims.megatron_local` against autograd: one layer of Megatron-LM's legacy
(``transformer_impl local``) code path, rebuilt here in plain torch on the CPU (RMSNorm in
Python on an fp32 copy, column / row linears that keep their sequence shard under SP, the GQA
split of the fused QKV, RoPE, ``.contiguous()`` copies, a stand-in for FlashAttention-2 that
keeps what its autograd function keeps, the TorchScript bias-dropout-add at dropout 0, the
unfused SwiGLU), its saved tensors counted with ``saved_tensors_hooks``, equals the bytes the
hybrid model charges a layer with the switch on (``activation_parts`` + ``saved_scores`` +
``megatron_local_saved``) to within the two norms' per-token fp32 ``rsqrt`` columns."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from graphs.layout import ModelDims

S, H, NH, FFN, T = 64, 64, 4, 96, 2  # seq, hidden, heads, ffn, tensor-parallel degree
HD, NP, FT = H // NH, NH // T, FFN // T
DT = torch.bfloat16


class _RMSNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-5
        self.weight = torch.nn.Parameter(torch.ones(H, dtype=DT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.float()
        return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(
            x
        ) * self.weight


def _bda(x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, prob: float,  # noqa: UP045
         training: bool) -> torch.Tensor:  # fmt: skip
    if bias is not None:
        x = x + bias
    return residual + torch.nn.functional.dropout(x, p=prob, training=training)


@torch.jit.script
def _bda_train(x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,  # noqa: UP045
               prob: float) -> torch.Tensor:  # fmt: skip
    return _bda(x, bias, residual, prob, True)


class _Column(torch.autograd.Function):
    """Keeps its sequence shard and gathers it (here: repeats it ``T`` times) inside."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.matmul(torch.cat([x] * T, 0), w.t())

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g.matmul(w)[: x.shape[0]], g.flatten(0, 1).t() @ torch.cat([x] * T, 0).flatten(0, 1)


class _Row(torch.autograd.Function):
    """Keeps its full-sequence input, reduce-scatters (here: slices) its output."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.matmul(x, w.t())[: x.shape[0] // T].contiguous()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gf = torch.cat([g] * T, 0)
        return gf.matmul(w), gf.flatten(0, 1).t() @ x.flatten(0, 1)


class _Flash(torch.autograd.Function):
    """What ``flash_attn_varlen_func`` keeps: q, k, v, the output and fp32 log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = F.scaled_dot_product_attention(
            *(u.transpose(1, 2) for u in (q, k, v)), is_causal=True
        )
        out = out.transpose(1, 2).contiguous()
        lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, *_ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    t, t_pass = t[..., : freqs.shape[-1]], t[..., freqs.shape[-1] :]
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    a, b = torch.chunk(t, 2, dim=-1)
    return torch.cat(((t * cos) + (torch.cat((-b, a), dim=-1) * sin), t_pass), dim=-1)


def _layer(x, n1, n2, wqkv, wo, w1, w2, freqs):
    mixed = _Column.apply(n1(x), wqkv).view(S, 1, NP, 3 * HD)
    q, k, v = torch.split(mixed, [HD, HD, HD], dim=3)
    q = _rope(q.reshape(S, 1, -1, HD), freqs)
    k = _rope(k, freqs)
    q, k, v = [u.permute(1, 0, 2, 3).contiguous() for u in (q, k, v)]
    ctx = _Flash.apply(q, k, v).permute(1, 0, 2, 3).reshape(S, 1, H // T).contiguous()
    mid = _bda_train(_Row.apply(ctx, wo), None, x, 0.0)
    gate, up = torch.chunk(_Column.apply(n2(mid), w1), 2, dim=-1)
    return _bda_train(_Row.apply(F.silu(gate) * up, w2), None, mid, 0.0)


def test_the_legacy_layers_saved_tensors_are_what_megatron_local_charges():
    torch.manual_seed(0)
    n1, n2 = _RMSNorm(), _RMSNorm()
    weights = [torch.nn.Parameter(torch.randn(*sh, dtype=DT) * 0.02)
               for sh in ((3 * H // T, H), (H, H // T), (2 * FT, H), (H, FT))]  # fmt: skip
    freqs = torch.randn(S, 1, 1, HD)

    def run():
        x = torch.randn(S // T, 1, H, dtype=DT, requires_grad=True)
        return _layer(x, n1, n2, *weights, freqs)

    for _ in range(3):  # let TorchScript's profiling executor build its autodiff graph
        run().float().sum().backward()
    kept: dict[int, int] = {}
    skip = {p.untyped_storage().data_ptr() for p in [n1.weight, n2.weight, *weights, freqs]}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            kept[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = run()
    assert y.shape == (S // T, 1, H)
    counted = sum(kept.values())
    d = ModelDims("llama", H, 1, NH, NH, FFN, 32, S, flash_attention=True, dropout=False,
                  megatron_local=True)  # fmt: skip
    R, Sh, _ = d.activation_parts()
    residual, per_rank = d.megatron_local_saved()
    charged = R / T + (Sh + d.saved_scores()) / T + residual / T + per_rank
    rsqrt = 2 * 4 * S // T  # each norm's fp32 per-token scale, not charged
    assert counted == pytest.approx(charged + rsqrt, abs=0.5)
    # without the switch the same code path keeps 10 s h / t + 8 s d more than is charged
    plain = R / T + (Sh + d.saved_scores()) / T
    assert counted - rsqrt - plain == pytest.approx(10 * S * H / T + 8 * S * HD)
