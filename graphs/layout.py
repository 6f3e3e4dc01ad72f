"""HybridLayout: a data x tensor x pipeline parallel layout (ZeRO, recomputation, schedule) of a layered model."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

import numpy as np

from graphs.schema import is_number, is_whole, show

#: Recomputation modes: keep every activation, recompute attention's core
#: (Korthikanti et al. 2022, "selective"), or keep only each layer's input ("full").
RECOMPUTE = ("none", "selective", "full")
#: Pipeline schedules of a hybrid layout.
HYBRID_SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: ZeRO stages (0: none; 1: optimizer state; 2: + gradients; 3: + parameters, i.e. FSDP).
ZERO_STAGES = (0, 1, 2, 3)
#: Most microbatches per replica a layout may have (``graphs.plan.MAX_MICROBATCHES`` is the
#: same bound for an op-placement plan): the pipeline kernel steps through every one.
MAX_LAYOUT_MICROBATCHES = 2**20
#: Upper bounds of a parametric model's sizes (:class:`ModelDims`): 100,000 layers build in
#: about 2 s; every other size (hidden, ffn, vocab, seq, batch, heads) is at most 2**31 - 1.
MAX_MODEL_LAYERS = 100_000
MAX_MODEL_SIZE = 2**31 - 1
#: Names of the device-mesh dimensions, outermost first.
MESH_DIM_NAMES = ("pp", "dp", "tp")

_INT_FIELDS = ("dp", "tp", "pp", "microbatch_size", "global_batch", "virtual_stages", "zero")
_REQUIRED = ("dp", "tp", "pp", "microbatch_size", "global_batch", "stage_layers")
_FIELDS = (
    "dp",
    "tp",
    "pp",
    "microbatch_size",
    "global_batch",
    "virtual_stages",
    "recompute",
    "sequence_parallel",
    "zero",
    "schedule",
    "stage_layers",
    "stage_meshes",
    "stage_recompute",
    "stage_zero",
)


#: The switches of :class:`ModelDims` that describe torchtitan's stack (PyTorch FSDP2,
#: DTensor, pipelining).
_TORCHTITAN_SWITCHES = (
    "fsdp_root_unsharded",
    "fsdp_pipeline_unsharded",
    "sp_saves_gathered_input",
    "pp_keeps_stage_output",
    "pp_step_buffers",
    "op_level_sac",
)
#: Boolean framework switches of :class:`ModelDims` (off by default; written only when on).
_SWITCHES = ("flash_attention", *_TORCHTITAN_SWITCHES, "megatron_local")


@dataclass(frozen=True)
class ModelDims:
    """Dimensions of a decoder-only transformer, what the hybrid cost model needs.

    Attributes:
        arch: ``"gpt"`` (LayerNorm, GeLU MLP of two matrices, biases, learned
            positions) or ``"llama"`` (RMSNorm, SwiGLU MLP of three matrices, no
            biases, rotary positions, grouped-query attention).
        hidden, layers, heads, kv_heads, ffn, vocab, seq: the usual sizes.
        tied: input embedding and output head share one matrix.
        batch: samples the graph's costs are for (the graph's global batch).
        flash_attention: attention as one fused kernel (FlashAttention, Dao et al. 2022;
            PyTorch's ``scaled_dot_product_attention``) that keeps for backward only its
            output and the fp32 softmax log-sum-exp (``4 a s`` bytes per sequence), never
            the ``s x s`` scores. Memory only: the step time keeps the materialised
            attention's traffic (validated for Megatron-style runs only).
        loss_logit_bytes: bytes per logit (per token and vocabulary entry) the loss holds
            at its peak. 4 (default): fp32 logits kept for the cross-entropy, whose gradient
            is computed in place (Megatron-LM's fused vocab-parallel cross-entropy). 12:
            eager PyTorch ``cross_entropy(logits.float())`` (torchtitan), whose log-softmax
            backward holds its saved fp32 result, the NLL loss's dense fp32 gradient and
            its own fp32 output at once. 16: the same loss under PyTorch's ``loss_parallel``
            (torchtitan with TP): its fused NLL + log-softmax backward holds the saved fp32
            log-softmax, a zeroed fp32 gradient, ``exp`` of the log-softmax added to it and
            that sum times the incoming gradient (``torch/distributed/tensor/parallel/loss.py``).
        dropout: whether the model runs dropout in training, so that each layer keeps the
            1-byte masks of its two residual dropouts (after the attention projection and
            after the MLP) and of the attention probabilities (not with ``flash_attention``,
            which regenerates them), and the first stage the embedding's. ``None`` (default)
            takes the architecture's: on for ``"gpt"`` (Megatron-LM's defaults, 0.1), off for
            ``"llama"``; ``dropout=True`` with ``"llama"`` is a SwiGLU model trained with
            Megatron-LM's dropout (``--swiglu`` without ``--hidden-dropout 0``).

    The switches below (all off by default) are what PyTorch FSDP2, DTensor tensor
    parallelism and ``torch.distributed.pipelining`` keep, as torchtitan runs them; they
    change the memory only (docs/hybrid.md cites the code each follows):

        fsdp_root_unsharded: with ZeRO-3, FSDP2's root module (the embedding, final norm and
            output head: what no transformer block holds) is not resharded after forward
            (``fully_shard``: "the root FSDP state has its value specially set to False"),
            so its bf16 parameters stay gathered from the forward to the end of the
            backward, and the head's unsharded gradient from the head's backward on.
        fsdp_pipeline_unsharded: with ZeRO-3 and ``pp > 1``, each stage keeps all its
            parameters gathered (bf16) across microbatches (torchtitan:
            ``reshard_after_forward=False`` when PP is on) and accumulates unsharded
            gradients, in the fp32 reduce dtype, from its first backward to the step's
            end (``pipelining``'s ``backward_maybe_with_nosync`` turns gradient sync off
            until the last microbatch; FSDP2 upcasts the accumulated gradient).
        sp_saves_gathered_input: with sequence parallelism, the column-parallel linears
            (Q/K/V, the MLP's first matrices, the output head) save their all-gathered,
            full-sequence input for backward (DTensor: ``PrepareModuleInput`` to
            ``Replicate``), where Megatron-LM saves the shard and gathers it again.
        pp_keeps_stage_output: a pipeline stage keeps its output of each microbatch in
            flight (``PipelineStage.fwd_cache``) until its backward, besides what the
            layers keep.
        op_level_sac: ``recompute="selective"`` is torchtitan's op-level selective
            activation checkpointing (``--activation_checkpoint.mode selective
            --activation_checkpoint.selective_ac_option op``: save the outputs of matmuls and
            of the fused attention, recompute every second matmul and everything else; see
            :meth:`op_sac_saved`) instead of Korthikanti et al.'s (drop only the attention
            core). Memory only: the step time keeps Korthikanti's recomputation cost.
        pp_step_buffers: ``torch.distributed.pipelining`` allocates its receive buffers for
            every microbatch of the step up front (``_prepare_forward_infra`` /
            ``_prepare_backward_infra``: one ``_make_tensor_from_meta`` per microbatch):
            ``m`` input buffers on a non-first chunk (the first layer's kept input of a
            microbatch in flight is its buffer, not counted twice) and ``m`` gradient
            buffers on a non-last chunk, for the whole step; and the last stage keeps each
            microbatch's output (the bf16 logits) in ``output_chunks`` until the step ends.
        megatron_local: Megatron-LM's legacy layer code (``--transformer-impl local``,
            ``megatron/model/transformer.py`` and ``rms_norm.py`` of late 2023) keeps more
            than the fused kernels counted above (:meth:`megatron_local_saved`): its RMSNorm
            runs in Python on an fp32 copy of its input, its TorchScript bias-dropout-add
            keeps a 1-byte dropout mask per residual add even at dropout 0, and its rotary
            embedding keeps the cos / sin tables of Q and K; and since that norm does not
            keep its fp16 input, the input a pipeline stage receives for each microbatch in
            flight, which Megatron's 1F1B schedule holds (``input_tensors``) until that
            microbatch's backward, is kept besides (``2 s h``, sequence-sharded under SP, on
            every chunk but the first). Memory only.
    """

    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    tied: bool = True
    batch: int = 1
    flash_attention: bool = False
    loss_logit_bytes: float = 4.0
    fsdp_root_unsharded: bool = False
    fsdp_pipeline_unsharded: bool = False
    sp_saves_gathered_input: bool = False
    pp_keeps_stage_output: bool = False
    pp_step_buffers: bool = False
    op_level_sac: bool = False
    megatron_local: bool = False
    dropout: bool | None = None

    def __post_init__(self) -> None:
        if self.arch not in ("gpt", "llama"):
            raise ValueError(f"ModelDims.arch {self.arch!r}: expected 'gpt' or 'llama'")
        if not isinstance(self.tied, bool):
            raise ValueError(f"ModelDims.tied = {self.tied!r}: expected true or false")
        for f in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq", "batch"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelDims.{f} = {v!r}: expected an integer >= 1")
            # 10**7 layers hung zoo.build, seq = 10**200 overflowed a float, hidden = 10**40
            # built a model of 1e70-second steps (2 Dec 2026)
            hi = MAX_MODEL_LAYERS if f == "layers" else MAX_MODEL_SIZE
            if v > hi:
                raise ValueError(f"ModelDims.{f} = {show(v)}: expected an integer in [1, {hi:,}]")
        for f in _SWITCHES:
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"ModelDims.{f} = {getattr(self, f)!r}: expected true or false")
        other = [f for f in _TORCHTITAN_SWITCHES if getattr(self, f)]
        if self.megatron_local and other:
            raise ValueError(
                f"ModelDims: megatron_local (Megatron-LM's legacy layers) and {other} "
                "(PyTorch FSDP2 / DTensor / pipelining, as torchtitan runs them) describe two "
                "frameworks; set the switches of one"
            )
        if self.dropout is None:
            object.__setattr__(self, "dropout", self.arch == "gpt")
        if not isinstance(self.dropout, bool):
            raise ValueError(
                f"ModelDims.dropout = {self.dropout!r}: expected true, false or null "
                "(the architecture's default)"
            )
        lb = self.loss_logit_bytes
        if isinstance(lb, bool) or not isinstance(lb, (int, float)) or not 0 < lb < 64:
            raise ValueError(f"ModelDims.loss_logit_bytes = {lb!r}: expected a number in (0, 64)")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"ModelDims: heads ({self.heads}) must divide hidden ({self.hidden}) and be a "
                f"multiple of kv_heads ({self.kv_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        if self.arch == "gpt":
            # qkv + proj (+ biases), fc1 + fc2 (+ biases), two LayerNorms (weight + bias)
            return (
                h * (h + 2 * kv)
                + (h + 2 * kv)
                + h * h
                + h
                + 2 * h * self.ffn
                + self.ffn
                + h
                + 4 * h
            )
        return h * (h + 2 * kv) + h * h + 3 * h * self.ffn + 2 * h

    def embedding_params(self) -> int:
        """Token (and, for GPT, position) embedding parameters."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.arch == "gpt" else 0)

    def head_params(self) -> int:
        """Final norm plus the output head (0 for the head when tied)."""
        norm = 2 * self.hidden if self.arch == "gpt" else self.hidden
        return norm + (0 if self.tied else self.vocab * self.hidden)

    def num_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def activation_parts(self) -> tuple[float, float, float]:
        """Activation bytes one layer keeps for backward per sequence (fp16, 1-byte dropout
        masks, no recomputation), as ``(replicated, sharded, scores)``: ``replicated`` is
        what tensor parallelism leaves whole on every rank (LayerNorm/RMSNorm inputs, the
        inputs of the first linear of each block, dropout masks; sequence parallelism
        shards it too), ``sharded`` what it splits ``tp`` ways (Q, K, V, the projection
        input, the MLP's inner activations), ``scores`` the attention matrices
        (``tp``-sharded; dropped by selective recomputation).

        GPT at ffn = 4h is Korthikanti et al. 2022 eq. (1)-(2): ``s h (10 + 24 + 5 a s / h)``
        = ``10 s h`` + ``(8 s h + 4 s ffn)`` + ``5 a s^2``. LLaMA (no dropout): ``8 s h`` +
        ``(4 s h + 4 s kv + 8 s ffn)`` (SwiGLU keeps gate and up outputs, the SiLU output and
        the down-projection input) + ``2 a s^2`` (softmax output). :attr:`dropout` adds (or,
        off for GPT, removes) the two residual masks ``2 s h`` and the attention
        probabilities' mask and dropped output ``3 a s^2``.
        """
        s, h, a = self.seq, self.hidden, self.heads
        # dropout: two residual masks (s h, replicated) and the attention probabilities'
        # mask and output (3 a s^2; the softmax output alone is 2 a s^2)
        masks, probs = (2 * s * h, 3 * a * s * s) if self.dropout else (0, 0)
        if self.arch == "gpt":
            return (
                float(8 * s * h + masks),
                float(8 * s * h + 4 * s * self.ffn),
                float(2 * a * s * s + probs),
            )
        kv = self.kv_heads * self.head_dim
        return (
            float(8 * s * h + masks),
            float(4 * s * h + 4 * s * kv + 8 * s * self.ffn),
            float(2 * a * s * s + probs),
        )

    def op_sac_saved(self, tp: int = 1, sp_shards: int = 1) -> float:
        """Bytes per sequence one layer keeps for backward under torchtitan's op-level
        selective activation checkpointing (``recompute="selective"`` with
        :attr:`op_level_sac`): the block's input (``2 s h``, sequence-sharded under SP),
        the output of every matmul in the block whose running count is odd (the policy
        recomputes "every second mm", counting afresh in each block's forward: LLaMA's
        ``wq, wk, wv, wo, w1, w3, w2`` keep ``wq``, ``wv``, ``w1``, ``w2``; GPT's ``qkv,
        proj, fc1, fc2`` keep ``qkv`` and ``fc1``), and, with ``flash_attention``, the
        fused attention op's output (``2 s h``) and log-sum-exp (``4 a s``). Column-parallel
        outputs and the attention are ``tp``-sharded; a row-parallel matmul's output is a
        full-size partial sum on every rank."""
        s, h, f = self.seq, self.hidden, self.ffn
        kv = self.kv_heads * self.head_dim
        keep = 2.0 * s * h / sp_shards
        if self.flash_attention:
            keep += (2.0 * s * h + self.saved_scores()) / tp
        if self.arch == "llama":
            return keep + (2.0 * s * h + 2.0 * s * kv + 2.0 * s * f) / tp + 2.0 * s * h
        return keep + (2.0 * s * (h + 2 * kv) + 2.0 * s * f) / tp

    def megatron_local_saved(self) -> tuple[float, float]:
        """Bytes per sequence one layer of Megatron-LM's legacy ``local`` implementation
        keeps for backward beyond :meth:`activation_parts` (:attr:`megatron_local`), as
        ``(sequence-shardable, per rank)``, read off its code (late 2023):

        * ``RMSNorm.forward`` is ``self._norm(x.float()).type_as(x) * self.weight``: autograd
          keeps the fp32 copy ``x.float()`` (``pow`` and ``mul``, 4 bytes an element) and the
          normalised fp16 tensor before the weight (the weight's ``mul``, 2 bytes), where a
          fused norm keeps its fp16 input (2 bytes): ``+4 s h`` per norm, two per layer
          (LLaMA only: GPT's LayerNorm is Apex's fused kernel in that code);
        * ``bias_dropout_add_fused_train`` is ``@torch.jit.script``: TorchScript's autodiff
          formula for ``dropout`` draws and keeps a bool mask on CUDA even at ``p = 0``
          (``symbolic_script.cpp``), one per residual add: ``+2 s h`` when
          :attr:`dropout` is off (on, the masks are already counted);
        * ``apply_rotary_pos_emb`` multiplies Q and K by ``cos(freqs).to(dtype)`` and
          ``sin(freqs).to(dtype)``, made afresh per call and kept by ``mul``: ``4 x 2 s d``
          bytes (``d`` the head size) on every tensor-parallel rank (LLaMA only).

        The first two follow the residual stream, so sequence parallelism shards them."""
        if not self.megatron_local:
            return 0.0, 0.0
        s, h = float(self.seq), float(self.hidden)
        llama = self.arch == "llama"
        norms = 2 * 4.0 * s * h if llama else 0.0
        masks = 0.0 if self.dropout else 2.0 * s * h
        rope = 4 * 2.0 * s * self.head_dim if llama else 0.0
        return norms + masks, rope

    def gathered_inputs(self) -> float:
        """Bytes per sequence of the inputs of a layer's column-parallel linears (the
        attention's Q/K/V input and the MLP's input, ``2 s h`` each, fp16): part of the
        ``replicated`` activations; with sequence parallelism Megatron-LM keeps them
        ``tp``-sharded, DTensor (``sp_saves_gathered_input``) all-gathered."""
        return float(4 * self.seq * self.hidden)

    def saved_scores(self) -> float:
        """Bytes per sequence the attention core keeps for backward (``tp``-sharded): the
        scores of :meth:`activation_parts`, or with ``flash_attention`` the fp32 softmax
        log-sum-exp of each head and token (``4 a s``)."""
        if self.flash_attention:
            return float(4 * self.heads * self.seq)
        return self.activation_parts()[2]

    def attn_flops(self, tokens: float) -> float:
        """Forward FLOPs of one layer's attention for ``tokens`` tokens of length ``seq``:
        QKV and output projections (``2 * tokens * h * (2h + 2 kv)``) plus the scores and
        the weighted sum (``4 * tokens * seq * h``, no causal saving, as Narayanan et al.)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return 2.0 * tokens * h * (2 * h + 2 * kv) + 4.0 * tokens * self.seq * h

    def mlp_flops(self, tokens: float) -> float:
        """Forward FLOPs of one layer's MLP (2 matrices for GPT, 3 for SwiGLU)."""
        return (4.0 if self.arch == "gpt" else 6.0) * tokens * self.hidden * self.ffn

    def layer_flops(self, tokens: float) -> float:
        """Forward FLOPs of one transformer layer (``24 t h^2 + 4 t s h`` for GPT, ffn = 4h)."""
        return self.attn_flops(tokens) + self.mlp_flops(tokens)

    def head_flops(self, tokens: float) -> float:
        """Forward FLOPs of the output head (logits): ``2 * tokens * h * vocab``."""
        return 2.0 * tokens * self.hidden * self.vocab

    def model_flops(self, samples: float) -> float:
        """Forward + backward FLOPs of a step of ``samples`` sequences, no recomputation
        (3x forward): the "model FLOPs" of MFU (Chowdhery et al. 2022; Narayanan et al. 2021
        eq. 3 for GPT with ffn = 4h gives ``72 B s l h^2 (1 + s/6h + V/12lh)``)."""
        t = samples * self.seq
        return 3.0 * (self.layers * self.layer_flops(t) + self.head_flops(t))

    def to_dict(self) -> dict[str, Any]:
        """The fields; the framework fields only when not at their defaults (so graphs
        built before they existed keep their content hash)."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for f in _SWITCHES:
            if not d[f]:
                del d[f]
        if self.loss_logit_bytes == 4.0:
            del d["loss_logit_bytes"]
        if self.dropout == (self.arch == "gpt"):
            del d["dropout"]
        return d


def dims_from_mapping(d: Any) -> ModelDims:
    """:class:`ModelDims` from a mapping of its fields (``graph.meta["model_dims"]``, as
    :meth:`ModelDims.to_dict` writes it). Raises ``ValueError`` naming what is wrong: not a
    mapping, a missing or unknown field, or a bad value (:meth:`ModelDims.__post_init__`)."""
    if not isinstance(d, Mapping):
        raise ValueError(f"model_dims must be a mapping of ModelDims fields, got {d!r}")
    fields = ModelDims.__dataclass_fields__
    unknown = sorted(str(k) for k in d if k not in fields)
    if unknown:
        raise ValueError(f"model_dims: unknown field(s) {unknown}; known: {sorted(fields)}")
    missing = [k for k, f in fields.items() if k not in d and f.default is MISSING]
    if missing:
        raise ValueError(f"model_dims: missing field(s) {missing}")
    try:
        return ModelDims(**dict(d))
    except ValueError as exc:
        raise ValueError(f"model_dims: {exc}") from None


def model_dims(graph: Any) -> ModelDims:
    """The :class:`ModelDims` of a graph: ``graph.meta["model_dims"]`` (parametric zoo
    builders) or the config of an extracted ``gpt2*`` / ``llama`` zoo graph. Raises
    ``ValueError`` (naming the graph and the field) for a graph that has neither, or a
    malformed one."""
    meta = getattr(graph, "meta", {}) or {}
    name = str(meta.get("name", ""))
    if "model_dims" in meta:
        try:
            return dims_from_mapping(meta["model_dims"])
        except ValueError as exc:
            raise ValueError(f"graph {name or '?'!r}: meta.{exc}") from None
    cfg = meta.get("config") or {}
    if cfg and name.startswith(("gpt2", "llama")) and not cfg.get("n_expert"):
        try:
            dims = _dims_from_config(cfg, name, meta)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"graph {name!r}: meta.config does not give the model's dimensions "
                f"({type(exc).__name__}: {exc}); it needs d_model, n_layer, n_head, vocab and "
                "seq as integers >= 1 (n_kv_head, d_ff, batch optional)"
            ) from None
        _check_config_matches_graph(graph, dims, name, meta)
        return dims
    raise ValueError(
        f"graph {name or '?'!r} is not a layered transformer with known dimensions "
        "(hybrid layouts need graph.meta['model_dims'], as zoo.build('gpt'/'llama', ...) sets, "
        "or an extracted gpt2*/llama zoo graph)"
    )


def _check_config_matches_graph(
    graph: Any, dims: ModelDims, name: str, meta: Mapping[str, Any]
) -> None:
    """``ValueError`` when an extracted graph's ``meta.config`` disagrees with its nodes: the
    hybrid model scores by the config, so a graph file with an edited ``d_model``,
    ``n_layer`` or batch scored 1220 against 83 ms under one content hash (fuzzing, 2 Dec
    2026). Checked: the transformer blocks (``graph.layer`` ids; at most that many in a
    coarsened graph), the forward nodes' parameter bytes against the config's parameter
    count (the graph's bytes per parameter, within 0.1 %), ``meta.batch`` against
    ``config.batch``, and, in an uncoarsened graph, the attention's sizes against
    ``n_head`` and ``seq``. Not seen: edits that keep every one of these (``n_head`` doubled
    with ``seq`` halved, say)."""
    where = f"graph {name!r}: meta.config"
    layer = np.asarray(getattr(graph, "layer", []))
    blocks = int(layer.max()) + 1 if layer.size else 0
    # a coarsened graph's node takes its heaviest member's block, so it may show fewer
    # (a Llama-2-7B in 24 groups shows 30 of 32; refused until 2 Dec 2026), never more
    coarse = "coarsened_from" in meta
    if layer.size and (blocks > dims.layers if coarse else blocks != dims.layers):
        raise ValueError(
            f"{where} says n_layer = {dims.layers}, but the graph's nodes hold {blocks} "
            "transformer blocks (graph.layer); the file's config was edited, or belongs to "
            "another model"
        )
    kind, pb = getattr(graph, "kind", None), getattr(graph, "param_bytes", None)
    if kind is not None and pb is not None and dims.num_params() > 0:
        # a GPT-2 holds n_ctx learned positions, the model counts seq of them
        n_ctx = (meta.get("config") or {}).get("n_ctx")
        extra = (
            (int(n_ctx) - dims.seq) * dims.hidden
            if dims.arch == "gpt" and is_whole(n_ctx, dims.seq, floats=True)
            else 0
        )
        params = dims.num_params() + extra
        per = float(np.asarray(pb)[np.asarray(kind) == 0].sum()) / params
        bpp = meta.get("bytes_per_param")
        whole = float(bpp) if is_number(bpp) and float(bpp) >= 1 else float(round(per))
        # to 0.1 %: an edited n_kv_head or d_ff of a small Llama moves the count by 0.4 %
        # (the 2 % of before let it pass, 2 Dec 2026)
        if per > 0 and not (whole >= 1 and abs(per - whole) <= 1e-3 * whole):
            raise ValueError(
                f"{where} gives {params:,} parameters, but the graph's forward nodes hold "
                f"{per:.4g} bytes per parameter of them ({whole:g} expected: d_model, "
                "n_kv_head, d_ff, vocab or n_layer edited, or another model's config)"
            )
    batch = meta.get("batch")
    if is_whole(batch, 1) and int(batch) != dims.batch:
        raise ValueError(
            f"{where} says batch = {dims.batch}, but meta.batch = {batch}: the graph was "
            "extracted with one batch"
        )
    if kind is not None and layer.size and not coarse:  # coarse nodes' sizes are the groups'
        _check_attention_shape(graph, np.asarray(kind), layer, dims, where)


def _check_attention_shape(
    graph: Any, kind: np.ndarray, layer: np.ndarray, dims: ModelDims, where: str
) -> None:
    """The first block's attention scores (its ``softmax`` node: ``batch x n_head x seq^2``
    elements) and the attention's output (the ``matmul`` that reads them: ``batch x seq x
    d_model``) have the sizes the config gives: an edited ``n_head`` or ``seq`` changes no
    parameter and was not seen (2 Dec 2026). Graphs without a ``softmax`` node (a fused
    attention op) are not checked this way."""
    names = getattr(graph, "name", ())
    out = getattr(graph, "out_bytes", None)
    if not names or out is None:
        return
    out = np.asarray(out)
    first = np.flatnonzero((kind == 0) & (layer == 0))
    sm = next((int(i) for i in first if names[i].split("_")[0] == "softmax"), None)
    if sm is None:
        return
    reads = [int(j) for j in graph.successors(sm) if kind[j] == 0 and "matmul" in names[j]]
    if not reads:
        return
    b, h, a, s = dims.batch, dims.hidden, dims.heads, dims.seq
    elem = float(out[reads[0]]) / (b * s * h)  # bytes per element of the activations
    scores = b * a * s * s * elem
    if not (is_whole(elem, 1, floats=True) and abs(float(out[sm]) - scores) <= 1e-6 * scores):
        raise ValueError(
            f"{where} says n_head = {a} and seq = {s} (batch {b}, d_model {h}), but the "
            f"graph's attention scores ({names[sm]}: {float(out[sm]):,.0f} bytes) and "
            f"output ({names[reads[0]]}: {float(out[reads[0]]):,.0f} bytes) are not "
            "batch x n_head x seq^2 and batch x seq x d_model elements of one size; the "
            "file's config was edited, or belongs to another model"
        )


def _dims_from_config(cfg: Mapping[str, Any], name: str, meta: Mapping[str, Any]) -> ModelDims:
    """:class:`ModelDims` of an extracted ``gpt2*`` / ``llama`` zoo graph from its config."""

    def whole(key: str, default: Any = None) -> int:
        v = cfg.get(key, default) if default is not None else cfg[key]
        if not is_whole(v, floats=True):  # (int() of an infinite float raised OverflowError)
            raise ValueError(f"{key} = {v!r} is not an integer")
        return int(v)

    llama = name.startswith("llama")
    return ModelDims(
        arch="llama" if llama else "gpt",
        hidden=whole("d_model"),
        layers=whole("n_layer"),
        heads=whole("n_head"),
        kv_heads=whole("n_kv_head", cfg.get("n_head")),
        ffn=whole("d_ff", 4 * whole("d_model")),
        vocab=whole("vocab"),
        seq=whole("seq"),
        tied=not llama,
        batch=whole("batch", meta.get("batch", 1)),
    )


def balanced_stage_layers(num_layers: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """``chunks`` contiguous half-open layer ranges covering ``[0, num_layers)`` as evenly as
    possible (the first ``num_layers % chunks`` chunks get one layer more)."""
    if chunks < 1 or num_layers < chunks:
        raise ValueError(
            f"balanced_stage_layers: cannot split {num_layers} layers into {chunks} non-empty chunks"
        )
    q, r = divmod(num_layers, chunks)
    out, a = [], 0
    for c in range(chunks):
        b = a + q + (1 if c < r else 0)
        out.append((a, b))
        a = b
    return tuple(out)


class StageMeshes:
    """Rank arithmetic of a pipeline whose stage ``p`` runs on a ``dp_p x tp_p`` submesh of
    consecutive ranks (``stage_meshes``; empty: every stage on ``dp x tp``), rank order
    ``(p, d, t)`` with ``t`` innermost. Shared by :class:`HybridLayout` and the runtime's
    ``runtime.hybrid.HybridSpec`` (dataclasses with ``dp``, ``tp``, ``pp``, ``stage_meshes``)."""

    dp: int
    tp: int
    pp: int
    stage_meshes: tuple[tuple[int, int], ...]

    @property
    def meshes(self) -> tuple[tuple[int, int], ...]:
        """``(dp_p, tp_p)`` of every pipeline stage (``(dp, tp)`` each when uniform)."""
        return self.stage_meshes or ((self.dp, self.tp),) * self.pp

    @property
    def world_size(self) -> int:
        if self.stage_meshes:
            return sum(d * t for d, t in self.stage_meshes)
        return self.dp * self.tp * self.pp

    def stage_offset(self, p: int) -> int:
        """Global rank of the first device of pipeline rank ``p``'s submesh."""
        if not self.stage_meshes:
            return p * self.dp * self.tp
        return sum(d * t for d, t in self.stage_meshes[:p])

    def rank(self, p: int, d: int, t: int) -> int:
        """Global rank of pipeline rank ``p``, data-parallel rank ``d``, tensor rank ``t``."""
        if not self.stage_meshes:
            return (p * self.dp + d) * self.tp + t
        return self.stage_offset(p) + d * self.stage_meshes[p][1] + t

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(p, d, t)`` of a global rank (inverse of :meth:`rank`)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(
                f"{type(self).__name__}.coords: rank {rank} not in [0, {self.world_size})"
            )
        if self.stage_meshes:
            for p, (dp, tp) in enumerate(self.stage_meshes):
                if rank < dp * tp:
                    d, t = divmod(rank, tp)
                    return p, d, t
                rank -= dp * tp
        pd, t = divmod(rank, self.tp)
        p, d = divmod(pd, self.dp)
        return p, d, t

    def stage_ranks(self, p: int) -> range:
        """Global ranks of pipeline rank ``p`` (its ``dp_p * tp_p`` submesh)."""
        dp, tp = self.meshes[p]
        a = self.stage_offset(p)
        return range(a, a + dp * tp)


@dataclass(frozen=True)
class HybridLayout(StageMeshes):
    """How a layered model is split over ``dp x tp x pp`` devices.

    The device mesh has shape ``(pp, dp, tp)`` (names ``("pp", "dp", "tp")``):
    global rank ``(p * dp + d) * tp + t``, so a tensor-parallel group is ``tp``
    consecutive ranks (inside one node when ``tp`` divides the node size) and a
    pipeline stage ``p`` owns the ``dp * tp`` ranks starting at ``p * dp * tp``.

    Attributes:
        dp, tp, pp: data-, tensor- and pipeline-parallel degrees (>= 1).
        microbatch_size: samples per microbatch per data-parallel replica.
        global_batch: samples per step over all replicas; must be a multiple of
            ``dp * microbatch_size`` (:attr:`num_microbatches` per replica).
        virtual_stages: model chunks per pipeline rank (``> 1`` only with the
            ``"interleaved"`` schedule, Narayanan et al. SC'21).
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
        sequence_parallel: shard LayerNorm/dropout activations over the TP group
            (Korthikanti et al. 2022); needs ``tp > 1``.
        zero: ZeRO stage 0-3 over the data-parallel group.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        stage_layers: half-open transformer-layer ranges, one per model chunk,
            ``pp * virtual_stages`` chunks in pipeline order, contiguous from 0;
            chunk ``c`` runs on pipeline rank ``c % pp``.
        stage_meshes: empty (the default: every stage on a ``dp x tp`` submesh), or one
            ``(dp_p, tp_p)`` per pipeline stage: stage ``p`` runs on its own submesh of
            ``dp_p * tp_p`` devices (Alpa's inter-op stages on submeshes of different
            shapes, Zheng et al. OSDI'22). Then ``dp``, ``tp`` and ``microbatch_size`` are
            the first stage's (``stage_meshes[0] == (dp, tp)``), the step has
            ``global_batch / (dp * microbatch_size)`` microbatches of ``dp *
            microbatch_size`` samples, and stage ``p`` splits each into ``dp_p`` parts of
            ``dp * microbatch_size / dp_p`` samples (which must be whole). The submeshes
            take consecutive device ranges in stage order; recomputation, SP and ZeRO
            apply on every stage (SP and ZeRO where the stage's ``tp``, resp. ``dp``, is
            above 1); ``virtual_stages`` must be 1.
        stage_recompute: empty (the default: every stage under ``recompute``), or one
            recomputation mode per pipeline stage (Aceso's per-stage recomputation, Liu et
            al. EuroSys'24: a 1F1B stage near the end keeps fewer microbatches in flight
            and may need none); ``stage_recompute[0] == recompute``; ``virtual_stages``
            must be 1.
        stage_zero: empty (the default: every stage under ``zero``), or one ZeRO stage per
            pipeline stage, each over that stage's own data-parallel group (e.g. ZeRO-3 on
            the first stages of a 1F1B pipeline, which keep the most microbatches in
            flight, and ZeRO-1 on the rest, whose all-gathers it spares);
            ``stage_zero[0] == zero``; ``virtual_stages`` must be 1.
    """

    dp: int
    tp: int
    pp: int
    microbatch_size: int
    global_batch: int
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    stage_layers: tuple[tuple[int, int], ...] = ()
    stage_meshes: tuple[tuple[int, int], ...] = ()
    stage_recompute: tuple[str, ...] = ()
    stage_zero: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_fields(self, "HybridLayout")
        object.__setattr__(self, "stage_recompute", tuple(self.stage_recompute))
        object.__setattr__(self, "stage_zero", tuple(self.stage_zero))
        object.__setattr__(
            self, "stage_layers", tuple((int(a), int(b)) for a, b in self.stage_layers)
        )
        object.__setattr__(
            self, "stage_meshes", tuple((int(a), int(b)) for a, b in self.stage_meshes)
        )

    # ------------------------------------------------------------ properties
    @property
    def num_microbatches(self) -> int:
        """Microbatches per step per data-parallel replica."""
        return self.global_batch // (self.dp * self.microbatch_size)

    @property
    def heterogeneous(self) -> bool:
        """True when the stages differ: their own submeshes (:attr:`stage_meshes`),
        recomputation modes (:attr:`stage_recompute`) or ZeRO stages (:attr:`stage_zero`)."""
        return bool(self.stage_meshes) or bool(self.stage_recompute) or bool(self.stage_zero)

    @property
    def recomputes(self) -> tuple[str, ...]:
        """The recomputation mode of every pipeline stage."""
        return self.stage_recompute or (self.recompute,) * self.pp

    @property
    def zeros(self) -> tuple[int, ...]:
        """The ZeRO stage of every pipeline stage."""
        return self.stage_zero or (self.zero,) * self.pp

    @property
    def stage_microbatch_sizes(self) -> tuple[int, ...]:
        """Samples per microbatch on each data-parallel rank of each pipeline stage."""
        g = self.dp * self.microbatch_size
        return tuple(g // d for d, _ in self.meshes)

    def stage_view(self, p: int) -> HybridLayout:
        """The uniform layout that runs every stage on stage ``p``'s submesh, with stage
        ``p``'s microbatch size, recomputation and ZeRO stage (same microbatch count,
        stages, schedule and switches):
        what stage ``p`` of a heterogeneous layout computes and keeps, stage for stage."""
        dp, tp = self.meshes[p]
        d = self.to_dict()
        d.pop("stage_meshes", None)
        d.pop("stage_recompute", None)
        d.pop("stage_zero", None)
        d.update(
            dp=dp,
            tp=tp,
            microbatch_size=self.stage_microbatch_sizes[p],
            recompute=self.recomputes[p],
            zero=self.zeros[p],
        )
        if tp == 1:
            d["sequence_parallel"] = False
        return HybridLayout.from_dict(d)

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        """``(pp, dp, tp)``: the device mesh (``ValueError`` when the stages have their own
        submeshes: there is no single mesh then)."""
        if self.stage_meshes:
            raise ValueError(
                "HybridLayout.mesh_shape: the stages have their own submeshes (stage_meshes); "
                "see meshes and stage_ranks"
            )
        return (self.pp, self.dp, self.tp)

    @property
    def mesh_dim_names(self) -> tuple[str, str, str]:
        return MESH_DIM_NAMES

    @property
    def num_chunks(self) -> int:
        """Model chunks in the pipeline (``pp * virtual_stages``)."""
        return self.pp * self.virtual_stages

    @property
    def num_layers(self) -> int:
        """Transformer layers covered by :attr:`stage_layers`."""
        return self.stage_layers[-1][1]

    def chunk_of_layer(self, layer: int) -> int:
        """Index of the model chunk that holds transformer layer ``layer``."""
        for c, (a, b) in enumerate(self.stage_layers):
            if a <= layer < b:
                return c
        raise ValueError(f"HybridLayout: layer {layer} is in no stage_layers range")

    # ------------------------------------------------------------ validation
    def validate(
        self, num_layers: int, num_heads: int, num_devices: int, num_kv_heads: int | None = None
    ) -> None:
        """Raise ``ValueError`` unless this layout fits a model of ``num_layers`` layers and
        ``num_heads`` attention heads (``num_kv_heads`` key/value heads, when given: a
        grouped-query LLaMA's) on ``num_devices`` devices (names the field)."""
        if self.world_size != num_devices:
            if self.stage_meshes:
                raise ValueError(
                    f"HybridLayout.stage_meshes: the stages' dp*tp sum to {self.world_size} "
                    f"devices, but the cluster has {num_devices}"
                )
            raise ValueError(
                f"HybridLayout: dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.world_size} "
                f"must equal the cluster's {num_devices} devices"
            )
        for p, (_, tp) in enumerate(self.meshes):
            what = f"stage_meshes[{p}] tp" if self.stage_meshes else "tp"
            if num_heads % tp:
                raise ValueError(
                    f"HybridLayout.{what} = {tp} must divide the model's {num_heads} attention heads"
                )
            if num_kv_heads is not None and num_kv_heads % tp:
                # accepted here and by Plan.load, refused only by the simulator (2 Dec 2026)
                raise ValueError(
                    f"HybridLayout.{what} = {tp} must divide the model's {num_kv_heads} kv "
                    "heads (as Megatron-LM's num_query_groups; the runtime splits whole heads)"
                )
        if self.num_chunks > num_layers:
            raise ValueError(
                f"HybridLayout: pp*virtual_stages = {self.num_chunks} chunks exceed the model's "
                f"{num_layers} layers"
            )
        if self.num_layers != num_layers:
            raise ValueError(
                f"HybridLayout.stage_layers covers layers [0, {self.num_layers}) but the model "
                f"has {num_layers} layers"
            )

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON; ``stage_meshes``, ``stage_recompute`` and ``stage_zero``
        only when set (so uniform layouts read and hash as before)."""
        out = {
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "microbatch_size": self.microbatch_size,
            "global_batch": self.global_batch,
            "virtual_stages": self.virtual_stages,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "zero": self.zero,
            "schedule": self.schedule,
            "stage_layers": [[a, b] for a, b in self.stage_layers],
        }
        if self.stage_meshes:
            out["stage_meshes"] = [[d, t] for d, t in self.stage_meshes]
        if self.stage_recompute:
            out["stage_recompute"] = list(self.stage_recompute)
        if self.stage_zero:
            out["stage_zero"] = list(self.stage_zero)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "layout") -> HybridLayout:
        """Parse the :meth:`to_dict` form strictly: unknown or missing keys, wrong types and
        inconsistent values are one ``ValueError`` naming ``source``, the field and the value."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: layout must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ValueError(
                f"{source}: layout has unknown key(s) {unknown}; valid keys: {list(_FIELDS)}"
            )
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{source}: layout is missing required key(s) {missing}")
        sl = d["stage_layers"]
        if not isinstance(sl, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 for r in sl
        ):
            raise ValueError(
                f"{source}: layout.stage_layers must be a list of [start, stop] pairs, got {sl!r}"
            )
        kw = {
            k: d[k]
            for k in _FIELDS
            if k in d and k not in ("stage_layers", "stage_meshes", "stage_recompute", "stage_zero")
        }
        kw["stage_layers"] = tuple(tuple(r) for r in sl)
        sm = d.get("stage_meshes", ())
        if not isinstance(sm, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 for r in sm
        ):
            raise ValueError(
                f"{source}: layout.stage_meshes must be a list of [dp, tp] pairs, got {sm!r}"
            )
        kw["stage_meshes"] = tuple(tuple(r) for r in sm)
        sr = d.get("stage_recompute", ())
        if not isinstance(sr, (list, tuple)):
            raise ValueError(
                f"{source}: layout.stage_recompute must be a list of recomputation modes, "
                f"got {sr!r}"
            )
        kw["stage_recompute"] = tuple(sr)
        sz = d.get("stage_zero", ())
        if not isinstance(sz, (list, tuple)):
            raise ValueError(
                f"{source}: layout.stage_zero must be a list of ZeRO stages, got {sz!r}"
            )
        kw["stage_zero"] = tuple(sz)
        # type checks happen before construction so that the message names the source
        _check_fields(kw, source)
        return cls(**kw)


def stage_recompute_problem(
    stage_recompute: Any, pp: int, virtual_stages: int, recompute: str
) -> tuple[str, Any, str] | None:
    """What is wrong with a layout's ``stage_recompute`` as ``(field, value, expected)``, or
    ``None`` when it is valid (empty, or one known mode per pipeline stage, ``virtual_stages``
    1, the first stage's mode equal to ``recompute``). Shared by :class:`HybridLayout` and the
    runtime's ``HybridSpec``."""
    return _per_stage_problem(
        "recompute", stage_recompute, pp, virtual_stages, recompute, RECOMPUTE,
        "recomputation modes", "modes",
    )  # fmt: skip


def stage_zero_problem(
    stage_zero: Any, pp: int, virtual_stages: int, zero: int
) -> tuple[str, Any, str] | None:
    """What is wrong with a layout's ``stage_zero`` as ``(field, value, expected)``, or
    ``None`` when it is valid (empty, or one ZeRO stage 0-3 per pipeline stage,
    ``virtual_stages`` 1, the first stage's equal to ``zero``). Shared by
    :class:`HybridLayout` and the runtime's ``HybridSpec``."""
    return _per_stage_problem(
        "zero", stage_zero, pp, virtual_stages, zero, ZERO_STAGES, "ZeRO stages", "ZeRO stages"
    )


def _per_stage_problem(
    field: str,
    values: Any,
    pp: int,
    virtual_stages: int,
    first: Any,
    allowed: Sequence[Any],
    noun: str,
    short: str,
) -> tuple[str, Any, str] | None:
    """The checks of a per-stage field ``stage_<field>`` (one value of ``allowed`` per
    pipeline stage, ``v = 1``, stage 0's equal to ``<field>``); ``noun`` names the values."""
    name = f"stage_{field}"
    vals: Any = values or ()
    if not isinstance(vals, (list, tuple)):
        return (name, vals, f"a sequence of {noun}, one per pipeline stage")
    if not vals:
        return None
    if len(vals) != pp:
        return (name, list(vals), f"pp = {pp} {short}, one per pipeline stage")
    if virtual_stages != 1:
        return ("virtual_stages", virtual_stages, f"1 when the stages have their own {noun}")
    for c, x in enumerate(vals):
        # 2.0 compared equal to the ZeRO stage 2 and was kept as a float (2 Dec 2026)
        kinds = {type(a) for a in allowed}
        if isinstance(x, bool) or not isinstance(x, tuple(kinds)) or x not in allowed:
            return (f"{name}[{c}]", x, f"one of {tuple(allowed)}")
    if vals[0] != first:
        return (f"{name}[0]", vals[0], f"{field} = {first!r}: {field} is the first stage's")
    return None


def _check_fields(obj: Any, source: str) -> None:
    """Shared checks of a layout's fields (an instance or a mapping of them)."""

    def get(k: str) -> Any:
        if isinstance(obj, Mapping):
            return obj.get(k, getattr(HybridLayout, k, None))
        return getattr(obj, k)

    def bad(field: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{source}: layout.{field} = {value!r}: expected {expected}")

    for f in _INT_FIELDS:
        v = get(f)
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(f, v, "an integer")
    for f in ("dp", "tp", "pp", "microbatch_size", "global_batch", "virtual_stages"):
        if get(f) < 1:
            raise bad(f, get(f), "an integer >= 1")
    if get("zero") not in ZERO_STAGES:
        raise bad("zero", get("zero"), f"one of {ZERO_STAGES}")
    if not isinstance(get("sequence_parallel"), bool):
        raise bad("sequence_parallel", get("sequence_parallel"), "true or false")
    if get("recompute") not in RECOMPUTE:
        raise bad("recompute", get("recompute"), f"one of {RECOMPUTE}")
    if get("schedule") not in HYBRID_SCHEDULES:
        raise bad("schedule", get("schedule"), f"one of {HYBRID_SCHEDULES}")
    dp, tp, pp, mbs, gb, v = (
        get(k) for k in ("dp", "tp", "pp", "microbatch_size", "global_batch", "virtual_stages")
    )
    meshes_in: Any = get("stage_meshes") or ()
    top_tp = tp
    if isinstance(meshes_in, (list, tuple)) and meshes_in:
        tps = [r[1] for r in meshes_in if isinstance(r, (list, tuple)) and len(r) == 2]
        top_tp = max([tp] + [t for t in tps if isinstance(t, int) and not isinstance(t, bool)])
    if get("sequence_parallel") and top_tp == 1:
        raise bad(
            "sequence_parallel",
            True,
            "false when tp == 1 on every stage (it shards over the TP group)",
        )
    if gb % (dp * mbs):
        raise bad(
            "global_batch",
            gb,
            f"a multiple of dp * microbatch_size = {dp} * {mbs} = {dp * mbs} "
            "(the global batch must split into whole microbatches per replica)",
        )
    m = gb // (dp * mbs)
    if m > MAX_LAYOUT_MICROBATCHES:
        raise bad(
            "global_batch",
            gb,
            f"at most {MAX_LAYOUT_MICROBATCHES:,} microbatches per replica (global_batch / "
            f"(dp * microbatch_size) = {m:,}; the pipeline is simulated microbatch by "
            "microbatch)",
        )
    if (v > 1) != (get("schedule") == "interleaved"):
        raise bad(
            "virtual_stages",
            v,
            f"> 1 exactly when schedule is 'interleaved' (schedule is {get('schedule')!r})",
        )
    if get("schedule") == "interleaved":
        if pp < 2:
            raise bad("schedule", "interleaved", "'gpipe' or '1f1b' when pp == 1")
        if m % pp:
            raise bad(
                "global_batch",
                gb,
                f"microbatches per replica ({m}) divisible by pp = {pp} for the interleaved "
                "schedule (as Megatron-LM requires)",
            )
    sl: Sequence[Any] = get("stage_layers")
    if not isinstance(sl, (list, tuple)):
        raise bad("stage_layers", sl, "a sequence of (start, stop) pairs")
    if len(sl) != pp * v:
        raise bad(
            "stage_layers",
            sl,
            f"pp * virtual_stages = {pp * v} (start, stop) ranges, one per model chunk "
            "(graphs.layout.balanced_stage_layers makes an even split)",
        )
    prev = 0
    for c, r in enumerate(sl):
        if (
            not isinstance(r, (list, tuple))
            or len(r) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in r)
        ):
            raise bad(f"stage_layers[{c}]", r, "a pair of integers (start, stop)")
        a, b = r
        if a != prev or b <= a:
            raise bad(
                f"stage_layers[{c}]",
                list(r),
                f"a non-empty range starting at {prev} (ranges are contiguous from layer 0)",
            )
        prev = b
    problem = stage_recompute_problem(get("stage_recompute"), pp, v, get("recompute"))
    if problem is not None:
        raise bad(*problem)
    problem = stage_zero_problem(get("stage_zero"), pp, v, get("zero"))
    if problem is not None:
        raise bad(*problem)
    problem = stage_meshes_problem(get("stage_meshes"), pp, v, dp, tp, mbs)
    if problem is not None:
        raise bad(*problem)


def stage_meshes_problem(
    stage_meshes: Any, pp: int, virtual_stages: int, dp: int, tp: int, microbatch_size: int
) -> tuple[str, Any, str] | None:
    """What is wrong with a layout's ``stage_meshes`` as ``(field, value, expected)``, or
    ``None`` when it is valid (empty, or one ``(dp, tp)`` pair of integers >= 1 per pipeline
    stage, ``virtual_stages`` 1, each dp dividing the ``dp * microbatch_size`` samples of a
    microbatch, the first pair equal to ``(dp, tp)``). Shared by :class:`HybridLayout` and
    the runtime's ``HybridSpec``."""
    sm: Any = stage_meshes or ()
    if not isinstance(sm, (list, tuple)):
        return ("stage_meshes", sm, "a sequence of (dp, tp) pairs, one per pipeline stage")
    if not sm:
        return None
    if len(sm) != pp:
        return ("stage_meshes", sm, f"pp = {pp} (dp, tp) pairs, one per pipeline stage")
    if virtual_stages != 1:
        return (
            "virtual_stages",
            virtual_stages,
            "1 when the stages have their own submeshes (stage_meshes)",
        )
    for c, r in enumerate(sm):
        if (
            not isinstance(r, (list, tuple))
            or len(r) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in r)
        ):
            return (f"stage_meshes[{c}]", r, "a pair of integers (dp, tp), each >= 1")
        if (dp * microbatch_size) % r[0]:
            return (
                f"stage_meshes[{c}]",
                list(r),
                f"a dp that divides the microbatch of dp * microbatch_size = "
                f"{dp * microbatch_size} samples (each data-parallel rank of the stage takes a "
                "whole share of it)",
            )
    if tuple(sm[0]) != (dp, tp):
        return (
            "stage_meshes[0]",
            list(sm[0]),
            f"(dp, tp) = ({dp}, {tp}): dp, tp and microbatch_size are the first stage's",
        )
    return None


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def tp_fits(tp: int, *, heads: int, kv_heads: int, max_tp: int) -> bool:
    """A tensor-parallel degree the model and a node allow: at most ``max_tp`` (GPUs per
    node), dividing the attention ``heads`` and the ``kv_heads`` (Megatron-LM's
    ``divide(num_query_groups, tp)``; the runtime splits whole kv heads too). Until 27 Nov
    2026 a multiple of ``kv_heads`` was allowed as well (kv heads replicated), which
    neither Megatron-LM nor the runtime runs: such plans failed at execution."""
    return tp <= max_tp and heads % tp == 0 and kv_heads % tp == 0


def submesh_tps(n: int, samples: int, *, heads: int, kv_heads: int, max_tp: int) -> list[int]:
    """The ``tp`` values (ascending) of a submesh of ``n`` GPUs taking microbatches of
    ``samples`` samples: :func:`tp_fits`, dividing ``n``, and leaving a ``dp = n / tp`` that
    divides ``samples`` (each data-parallel rank gets a whole share)."""
    return [
        t
        for t in divisors(n)
        if tp_fits(t, heads=heads, kv_heads=kv_heads, max_tp=max_tp) and samples % (n // t) == 0
    ]


def stage_tp_choices(
    layout: HybridLayout, p: int, *, heads: int, kv_heads: int, max_tp: int
) -> list[int]:
    """The ``tp`` values pipeline stage ``p`` of ``layout`` may take on its own submesh (its
    GPU count kept, ``dp`` following), ascending, its current one included
    (:func:`submesh_tps` of its GPUs and the microbatch of ``dp * microbatch_size``
    samples). Empty when ``p`` is no stage or ``virtual_stages > 1``."""
    if not 0 <= p < layout.pp or layout.virtual_stages != 1:
        return []
    dp, tp = layout.meshes[p]
    return submesh_tps(
        dp * tp, layout.dp * layout.microbatch_size, heads=heads, kv_heads=kv_heads, max_tp=max_tp
    )


def with_stage_tp(layout: HybridLayout, p: int, tp: int) -> HybridLayout:
    """``layout`` with stage ``p`` on the same GPUs at tensor-parallel degree ``tp`` (``dp``
    following; a value of :func:`stage_tp_choices`): ``stage_meshes`` set, or dropped when
    every stage is back on one shape; SP off when no stage has ``tp > 1`` left."""
    g = layout.dp * layout.microbatch_size
    meshes = [list(m) for m in layout.meshes]
    n = meshes[p][0] * meshes[p][1]
    meshes[p] = [n // tp, tp]
    out = layout.to_dict()
    out.pop("stage_meshes", None)
    out.update(dp=meshes[0][0], tp=meshes[0][1], microbatch_size=g // meshes[0][0])
    if len({tuple(m) for m in meshes}) > 1:
        out["stage_meshes"] = meshes
    if out["sequence_parallel"] and max(m[1] for m in meshes) == 1:
        out["sequence_parallel"] = False
    return HybridLayout.from_dict(out)


def with_stage_recompute(layout: HybridLayout, p: int, mode: str) -> HybridLayout:
    """``layout`` with pipeline stage ``p`` under recomputation ``mode`` (``v = 1``):
    ``stage_recompute`` set, or dropped when every stage is back on one mode; ``recompute``
    follows stage 0."""
    if mode not in RECOMPUTE:
        raise ValueError(f"with_stage_recompute: mode {mode!r}: expected one of {RECOMPUTE}")
    return _with_stage_value(layout, p, mode, "recompute", layout.recomputes)


def with_stage_zero(layout: HybridLayout, p: int, zero: int) -> HybridLayout:
    """``layout`` with pipeline stage ``p`` under ZeRO stage ``zero`` (``v = 1``):
    ``stage_zero`` set, or dropped when every stage is back on one stage; ``zero`` follows
    stage 0."""
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise ValueError(f"with_stage_zero: zero {zero!r}: expected one of {ZERO_STAGES}")
    return _with_stage_value(layout, p, zero, "zero", layout.zeros)


def _with_stage_value(
    layout: HybridLayout, p: int, value: Any, field: str, current: Sequence[Any]
) -> HybridLayout:
    """``layout`` with stage ``p``'s ``field`` (``"recompute"`` or ``"zero"``) set to
    ``value``: the per-stage field (``stage_<field>``) written only while the stages differ,
    and ``field`` following stage 0."""
    if not 0 <= p < layout.pp:
        raise ValueError(f"with_stage_{field}: stage {p} not in [0, {layout.pp})")
    values = list(current)
    values[p] = value
    out = layout.to_dict()
    out.pop(f"stage_{field}", None)
    out[field] = values[0]
    if len(set(values)) > 1:
        out[f"stage_{field}"] = values
    return HybridLayout.from_dict(out)


#: Default microbatch sizes and virtual-stage counts of :func:`layout_grid`.
GRID_MICROBATCH_SIZES = (1, 2, 4, 8)
GRID_VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)


def check_axis(who: str, name: str, values: Any, ok: Any, expected: str) -> tuple[Any, ...]:
    """A planner's grid-axis option (``microbatch_sizes=[1, 2]``, ``recompute=["full"]``...)
    checked: a non-empty list or tuple of distinct values, each passing ``ok``; else
    ``ValueError`` naming ``who``'s option ``name``. A scalar used to be iterated (an
    integer raised ``TypeError``, ``"full"`` became ``['f', 'u', 'l', 'l']``), a 0 to divide
    by zero, a repeated value to be searched twice."""
    seq = values.tolist() if hasattr(values, "tolist") and not isinstance(values, str) else values
    if not isinstance(seq, (list, tuple, range)):
        raise ValueError(f"{who}: {name} must be a list of {expected}, got {values!r}")
    seq = tuple(seq)
    bad = [v for v in seq if not ok(v)]
    if not seq or bad:
        raise ValueError(
            f"{who}: {name} must be a non-empty list of {expected}, got {list(seq)!r}"
            + (f" ({bad[0]!r} is not)" if bad else "")
        )
    twice = sorted({repr(v) for v in seq if seq.count(v) > 1})
    if twice:
        raise ValueError(f"{who}: {name} lists {', '.join(twice)} more than once")
    return seq


def check_grid_axes(who: str, **axes: Any) -> dict[str, Any]:
    """The :func:`layout_grid` axes a planner was given (any of ``microbatch_sizes``,
    ``virtual_stages``, ``recompute``, ``zero``, ``sequence_parallel``, ``max_tp``), checked
    by :func:`check_axis` (``max_tp``: ``None`` or an integer >= 1, which used to be searched
    with no layout at all and reported as out of memory); returns them as tuples."""
    kinds = {
        "microbatch_sizes": (lambda v: is_whole(v, 1), "integers >= 1"),
        "virtual_stages": (lambda v: is_whole(v, 1), "integers >= 1"),
        "recompute": (lambda v: isinstance(v, str) and v in RECOMPUTE, f"modes among {RECOMPUTE}"),
        "zero": (lambda v: is_whole(v) and v in ZERO_STAGES, f"ZeRO stages among {ZERO_STAGES}"),
        "sequence_parallel": (lambda v: isinstance(v, bool), "true / false"),
    }
    out: dict[str, Any] = {}
    for name, values in axes.items():
        if name == "max_tp":
            if values is not None and not is_whole(values, 1):
                raise ValueError(
                    f"{who}: max_tp must be an integer >= 1 (None: the GPUs per node), "
                    f"got {values!r}"
                )
            out[name] = None if values is None else int(values)
            continue
        if name not in kinds:
            raise TypeError(f"check_grid_axes: unknown axis {name!r}")
        ok, expected = kinds[name]
        out[name] = tuple(
            int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
            for v in check_axis(who, name, values, ok, expected)
        )
    return out


def layout_grid(
    graph: Any,
    cluster: Any,
    *,
    global_batch: int,
    microbatch_sizes: Sequence[int] = GRID_MICROBATCH_SIZES,
    virtual_stages: Sequence[int] = GRID_VIRTUAL_STAGES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO_STAGES,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
) -> Iterator[HybridLayout]:
    """Every valid layout of the grid (balanced stages): ``t`` divides the heads and
    the kv heads (:func:`tp_fits`) and is at most ``max_tp`` (default: GPUs per node),
    ``p`` at most the layers, ``d = D / (t p)``, microbatch sizes that split the
    batch, ``v`` with ``p v <= layers`` (interleaved when ``v > 1``), every
    recomputation, SP (when ``t > 1``) and ZeRO stage."""
    d = model_dims(graph)
    D = cluster.num_devices
    if max_tp is None:
        max_tp = int(cluster.meta.get("gpus_per_node", min(D, 8)))
    for t in divisors(D):
        if not tp_fits(t, heads=d.heads, kv_heads=d.kv_heads, max_tp=max_tp):
            continue
        for p in divisors(D // t):
            if p > d.layers:
                continue
            dp = D // (t * p)
            for mbs in microbatch_sizes:
                if global_batch % (dp * mbs):
                    continue
                m = global_batch // (dp * mbs)
                for v in virtual_stages:
                    if v > 1 and (p == 1 or m % p or p * v > d.layers):
                        continue
                    stages = balanced_stage_layers(d.layers, p * v)
                    sched = "interleaved" if v > 1 else "1f1b"
                    for rc, sp, z in itertools.product(recompute, sequence_parallel, zero):
                        if sp and t == 1:
                            continue
                        if z and dp == 1:
                            continue
                        yield HybridLayout(
                            dp=dp, tp=t, pp=p, microbatch_size=mbs, global_batch=global_batch,
                            virtual_stages=v, recompute=rc, sequence_parallel=sp, zero=z,
                            schedule=sched, stage_layers=stages,
                        )  # fmt: skip


__all__ = [
    "HYBRID_SCHEDULES",
    "check_axis",
    "check_grid_axes",
    "MESH_DIM_NAMES",
    "RECOMPUTE",
    "ZERO_STAGES",
    "HybridLayout",
    "ModelDims",
    "balanced_stage_layers",
    "layout_grid",
    "model_dims",
    "stage_tp_choices",
    "submesh_tps",
    "tp_fits",
    "stage_recompute_problem",
    "stage_zero_problem",
    "with_stage_recompute",
    "with_stage_zero",
    "with_stage_tp",
]
