"""Parametric GPT and LLaMA training graphs built from their dimensions (analytic costs, any size)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphs.compgraph import CompGraph
from graphs.layout import ModelDims
from graphs.schema import is_whole
from graphs.training import with_backward

#: Names the parametric builders answer to in :func:`graphs.zoo.build`.
PARAMETRIC = ("gpt", "llama")
#: Keywords of the parametric builders (``llama`` also takes ``ffn``, ``kv_heads``, ``tied``).
PARAM_KEYS = (
    "hidden", "layers", "heads", "vocab", "seq", "ffn", "kv_heads", "tied", "batch",
    "flash_attention", "loss_logit_bytes", "fsdp_root_unsharded", "fsdp_pipeline_unsharded",
    "sp_saves_gathered_input", "pp_keeps_stage_output", "pp_step_buffers", "op_level_sac",
    "megatron_local", "dropout", "grad_bytes",
)  # fmt: skip


def is_parametric(name: str, config: Mapping[str, Any]) -> bool:
    """Whether ``graphs.zoo.build(name, **config)`` builds a parametric model: ``gpt``
    always, ``llama`` when a keyword only the parametric builder takes is given (the
    extracted models also take ``batch``, ``seq`` and ``vocab``)."""
    only = set(PARAM_KEYS) - {"batch", "seq", "vocab"}
    return name in PARAMETRIC and (name == "gpt" or bool(set(config) & only))


#: Mixed-precision Adam: fp16 weights and gradients, fp32 master weights, momentum, variance.
BYTES_PER_PARAM = 16.0
GRAD_BYTES_PER_PARAM = 2.0
ACT_ELEM_BYTES = 2


def dims_from_kwargs(name: str, kw: dict[str, Any]) -> ModelDims:
    """:class:`ModelDims` of ``zoo.build(name, **kw)``; unknown keys raise ``ValueError``."""
    bad = sorted(set(kw) - set(PARAM_KEYS))
    if bad:
        raise ValueError(
            f"graphs.zoo: parametric {name!r} has no key(s) {bad}; valid keys: {list(PARAM_KEYS)}"
        )
    missing = [k for k in ("hidden", "layers", "heads", "vocab", "seq") if k not in kw]
    if missing:
        raise ValueError(f"graphs.zoo: parametric {name!r} needs {missing}")

    def whole(key: str, default: Any = None) -> int:
        """``kw[key]`` as an int: an integer or an integral float, never a bool or a string
        (``int()`` would read ``"12288"``, truncate ``1600.5`` and fail on ``"abc"`` without
        naming the key)."""
        v = kw.get(key, default)
        if not is_whole(v, floats=True):
            raise ValueError(f"graphs.zoo: parametric {name!r}: {key} = {v!r}; expected an integer")
        return int(v)

    h = whole("hidden")
    gpt = name == "gpt"
    if gpt and ("kv_heads" in kw or "tied" in kw):
        raise ValueError("graphs.zoo: 'gpt' has full multi-head attention and a tied head")
    tied = kw.get("tied", gpt)
    if not isinstance(tied, bool):
        raise ValueError(
            f"graphs.zoo: parametric {name!r}: tied = {tied!r}; expected true or false"
        )
    return ModelDims(
        arch=name,
        hidden=h,
        layers=whole("layers"),
        heads=whole("heads"),
        kv_heads=whole("kv_heads", kw["heads"]),
        ffn=whole("ffn", 4 * h),
        vocab=whole("vocab"),
        seq=whole("seq"),
        tied=tied,
        batch=whole("batch", 8),
        flash_attention=kw.get("flash_attention", False),
        loss_logit_bytes=kw.get("loss_logit_bytes", 4.0),
        fsdp_root_unsharded=kw.get("fsdp_root_unsharded", False),
        fsdp_pipeline_unsharded=kw.get("fsdp_pipeline_unsharded", False),
        sp_saves_gathered_input=kw.get("sp_saves_gathered_input", False),
        pp_keeps_stage_output=kw.get("pp_keeps_stage_output", False),
        pp_step_buffers=kw.get("pp_step_buffers", False),
        op_level_sac=kw.get("op_level_sac", False),
        megatron_local=kw.get("megatron_local", False),
        dropout=kw.get("dropout"),
    )


def grad_bytes_from_kwargs(name: str, kw: dict[str, Any]) -> float:
    """``kw["grad_bytes"]``: bytes per parameter of the gradients the framework keeps
    (default 2, fp16 gradients; 4 for Megatron-LM with ``--bf16``, which accumulates and
    reduces gradients in an fp32 buffer: ``accumulate_allreduce_grads_in_fp32``)."""
    v = kw.get("grad_bytes", GRAD_BYTES_PER_PARAM)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 16:
        raise ValueError(
            f"graphs.zoo: parametric {name!r}: grad_bytes = {v!r}; expected a number in (0, 16]"
        )
    return float(v)


def build_parametric(dims: ModelDims, grad_bytes: float = GRAD_BYTES_PER_PARAM) -> CompGraph:
    """Training graph of a decoder LM from its dimensions, with analytic costs.

    Forward nodes: ``embed``; per layer ``l``: ``h.l.attn`` and ``h.l.mlp`` (``layer = l``);
    ``head`` (final norm, logits and loss). Then :func:`graphs.training.with_backward`
    (backward = 2x forward, Adam optimizer nodes). Costs are for ``dims.batch`` sequences:
    FLOPs from :meth:`ModelDims.attn_flops` / ``mlp_flops`` / ``head_flops``; bytes
    accessed = fp16 weights + activations saved; ``out_bytes`` = the hidden state
    ``2 * b * s * h`` (logits for the head); ``meta["grad_bytes_per_param"]`` =
    ``grad_bytes``; ``act_bytes`` per Korthikanti et al. 2022
    (``s b h (34 + 5 a s / h)`` bytes per GPT layer, split 11+5as/h attention / 23 MLP;
    LLaMA: SwiGLU keeps ``3 ffn`` instead of ``2 ffn + ...``, see :func:`layer_act_split`).
    Building is O(layers): a 100-layer model takes milliseconds.
    """
    b, s, h, L = dims.batch, dims.seq, dims.hidden, dims.layers
    tok = float(b * s)
    hid_bytes = ACT_ELEM_BYTES * tok * h
    lp = dims.layer_params()
    kv = dims.kv_heads * dims.head_dim
    attn_params = h * (h + 2 * kv) + h * h + (h + 2 * kv + h + 2 * h if dims.arch == "gpt" else h)
    mlp_params = lp - attn_params
    act_attn, act_mlp = layer_act_split(dims)
    names, flops, acc, out, par, act, layer, module = [], [], [], [], [], [], [], []

    def add(nm: str, f: float, p: float, a: float, o: float, lay: int, mod: str) -> None:
        names.append(nm)
        flops.append(f)
        par.append(p * BYTES_PER_PARAM)
        act.append(a)
        out.append(o)
        acc.append(2.0 * p + a + o)
        layer.append(lay)
        module.append(mod)

    add("embed", 0.0, dims.embedding_params(), 0.0, hid_bytes, -1, "embed")
    for i in range(L):
        add(f"h.{i}.attn", dims.attn_flops(tok), attn_params, act_attn * b, hid_bytes, i, f"h.{i}")
        add(f"h.{i}.mlp", dims.mlp_flops(tok), mlp_params, act_mlp * b, hid_bytes, i, f"h.{i}")
    logits = ACT_ELEM_BYTES * tok * dims.vocab
    add("head", dims.head_flops(tok), dims.head_params(), 2.0 * logits, 4.0 * b, -1, "head")
    n = len(names)
    edges = [(i, i + 1) for i in range(n - 1)]
    if dims.tied:  # the head reads the embedding matrix
        edges.append((0, n - 1))
    fwd = CompGraph.build(
        n,
        edges,
        flops=flops,
        bytes_accessed=acc,
        out_bytes=out,
        param_bytes=par,
        act_bytes=act,
        layer=layer,
        name=names,
        module=module,
        edge_bytes=[out[a] if a + 1 == c else 0.0 for a, c in edges],
        meta={
            "name": dims.arch,
            "batch": b,
            "bytes_per_param": BYTES_PER_PARAM,
            "grad_bytes_per_param": float(grad_bytes),
            "precision": "mixed",
            "optimizer": "adam",
            "act_elem_bytes": ACT_ELEM_BYTES,
            "source": "parametric",
            "model_dims": dims.to_dict(),
        },
    )
    return with_backward(fwd)


def layer_act_split(dims: ModelDims) -> tuple[float, float]:
    """Activation bytes one layer keeps for backward per sequence, no TP and no
    recomputation, split (attention block, MLP block), fp16 with 1-byte dropout masks.

    GPT (Korthikanti et al. 2022, section 4.1, total ``s h (34 + 5 a s / h)`` at ffn = 4h):
    attention block ``13 s h + 5 a s^2`` (LayerNorm input 2sh, QKV input 2sh, Q and K 4sh,
    softmax output 2as^2, its dropout mask as^2 and output 2as^2, V 2sh, projection input
    2sh, dropout mask sh); MLP block ``5 s h + 4 s ffn`` (LayerNorm input 2sh, first linear
    input 2sh, GeLU input ``2 s ffn``, second linear input ``2 s ffn``, dropout mask sh).
    LLaMA (no dropout): attention ``8 s h + 4 s kv + 2 a s^2`` (RMSNorm input 2sh, QKV
    input 2sh, Q 2sh, K and V ``4 s kv``, softmax output 2as^2, projection input 2sh);
    SwiGLU ``4 s h + 8 s ffn`` (RMSNorm input 2sh, input 2sh, gate and up outputs
    ``4 s ffn`` (the gate output is the SiLU's input), SiLU output ``2 s ffn``, product =
    down-projection input ``2 s ffn``). ``dims.dropout`` adds (LLaMA) or removes (GPT) each
    block's residual dropout mask ``s h`` and the probabilities' mask and output ``3 a s^2``.
    """
    s, h, a = dims.seq, dims.hidden, dims.heads
    # dropout: one residual mask per block (s h) and the attention probabilities' mask and
    # dropped output (3 a s^2)
    mask, probs = (s * h, 3 * a * s * s) if dims.dropout else (0, 0)
    if dims.arch == "gpt":
        return float(12 * s * h + 2 * a * s * s + mask + probs), float(
            4 * s * h + 4 * s * dims.ffn + mask
        )
    kv = dims.kv_heads * dims.head_dim
    return float(8 * s * h + 4 * s * kv + 2 * a * s * s + mask + probs), float(
        4 * s * h + 8 * s * dims.ffn + mask
    )


def build_named(name: str, **kw: Any) -> CompGraph:
    """``zoo.build("gpt" | "llama", hidden=..., layers=..., heads=..., vocab=..., seq=...)``.
    ``meta["config"]`` keeps the keywords as given (what a hybrid calibration of the model,
    ``runners.profile hybrid.model={name: gpt, config: ...}``, is checked against)."""
    g = build_parametric(dims_from_kwargs(name, kw), grad_bytes_from_kwargs(name, kw))
    g.meta["config"] = dict(kw)
    return g


def module_spec(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The zoo model whose PyTorch module computes the parametric ``name`` of ``config``:
    ``{"name": "gpt2" | "llama", "config": {...}}`` for :func:`graphs.zoo.build_module`.

    ``gpt`` -> ``gpt2`` (pre-LN, learned positions, GeLU MLP of ``4 hidden``, tied head:
    the architecture the parametric GPT's costs are counted for); ``llama`` -> the zoo's
    ``llama`` (RMSNorm, rotary positions, SwiGLU of ``ffn``, ``kv_heads`` grouped-query
    heads, untied head). The module has one transformer block per ``layers`` (``h.<l>`` /
    ``layers.<l>``), the batch ``batch`` and the sequence ``seq``, so a hybrid plan of the
    parametric graph (stage layer ranges, TP over heads, the global batch) runs on it with
    :mod:`runtime.hybrid`. Dropout is off in the module (it changes the values, not the
    plan). Shapes no zoo module has are refused by name: a ``gpt`` whose ``ffn`` is not
    ``4 hidden``, a ``tied`` ``llama``. ``ValueError`` names the key.
    """
    kw = dict(config)
    dims = dims_from_kwargs(name, kw)  # the same checks as zoo.build
    if name == "gpt":
        if dims.ffn != 4 * dims.hidden:
            raise ValueError(
                f"graphs.zoo: parametric 'gpt' with ffn = {dims.ffn} has no PyTorch module here: "
                f"the runtime's GPT-2 module has an MLP of 4 x hidden = {4 * dims.hidden}"
            )
        cfg = {"n_layer": dims.layers, "d_model": dims.hidden, "n_head": dims.heads,
               "vocab": dims.vocab, "n_ctx": dims.seq}  # fmt: skip
        zoo_name = "gpt2"
    else:
        if dims.tied:
            raise ValueError(
                "graphs.zoo: parametric 'llama' with tied = true has no PyTorch module here: "
                "the runtime's LLaMA module has an untied output head"
            )
        cfg = {"n_layer": dims.layers, "d_model": dims.hidden, "n_head": dims.heads,
               "n_kv_head": dims.kv_heads, "d_ff": dims.ffn, "vocab": dims.vocab,
               "n_ctx": dims.seq}  # fmt: skip
        zoo_name = "llama"
    return {"name": zoo_name, "config": dict(cfg, batch=dims.batch, seq=dims.seq)}


__all__ = [
    "PARAMETRIC",
    "build_named",
    "build_parametric",
    "dims_from_kwargs",
    "grad_bytes_from_kwargs",
    "layer_act_split",
    "module_spec",
]
