"""Hybrid memory model, by hand on tiny dimensions: the recomputation / loss peak and the
torchtitan switches of ``ModelDims`` (FSDP2 root and pipeline unsharding, SP's gathered
inputs, the pipeline stage output, loss-parallel logits)."""

from __future__ import annotations

import pytest

from graphs import clusters, zoo
from graphs.plan import Plan
from placement_env.oracles import Simulator

S, H, A, L = 16, 64, 2, 4  # tiny GPT: seq, hidden, heads, layers (ffn = 4h)


def _mem(vocab, pp=1, m=2, **kw):
    """Per-pipeline-rank memory breakdown of a tiny GPT, full recomputation, tp = dp = 1."""
    g = zoo.build("gpt", hidden=H, layers=L, heads=A, vocab=vocab, seq=S)
    cl = clusters.load("dgx_a100_80g").subset(range(pp))
    plan = Plan.hybrid(
        g, cl, dp=1, tp=1, pp=pp, microbatch_size=1, global_batch=m, recompute="full", **kw
    )
    return Simulator(g, cl).evaluate(plan)


def _recomputed_layer():
    # Korthikanti et al. eq. 1 at ffn = 4h, one sequence: s h (34 + 5 a s / h)
    return S * H * 34 + 5 * A * S * S


@pytest.mark.parametrize("vocab", [64, 100_000])
def test_recomputed_layer_and_loss_peak_are_not_summed(vocab):
    """One stage: the kept layer inputs plus the larger of the loss's peak and the layer
    being recomputed (which runs only after the loss's and head's backward freed theirs)."""
    r = _mem(vocab)
    inputs = L * 2 * S * H + S * H  # each layer's input, the embedding dropout mask
    loss = 4 * S * H + 4 * S * vocab  # final LN and head inputs, fp32 logits
    state = r.breakdown["memory_state"][0]
    assert r.breakdown["memory_activations"][0] == pytest.approx(inputs + loss)
    want = state + inputs + max(loss, _recomputed_layer())
    assert r.peak_memory.max() == pytest.approx(want, rel=1e-12)
    # the small vocabulary is the recomputation-bound case, the large one loss-bound
    assert (loss < _recomputed_layer()) == (vocab == 64)


def test_recomputed_layer_adds_in_full_on_stages_without_the_loss():
    """Two stages, 1F1B, m = 2: stage 0 keeps both microbatches' layer inputs and adds the
    whole recomputed layer; stage 1 (the loss) keeps one and takes the max."""
    vocab = 100_000
    r = _mem(vocab, pp=2, m=2)
    per_mb = (L // 2) * 2 * S * H
    st = r.breakdown["memory_state"]
    m0, m1 = r.breakdown["memory_per_rank"]
    assert m0 == pytest.approx(st[0] + 2 * (per_mb + S * H) + _recomputed_layer(), rel=1e-12)
    loss = 4 * S * H + 4 * S * vocab
    assert m1 == pytest.approx(st[1] + per_mb + max(loss, _recomputed_layer()), rel=1e-12)


# ------------------------------------------------------------------ torchtitan switches
LS, LH, LL, LF = 16, 64, 4, 128  # tiny LLaMA: seq, hidden, layers, ffn


def _llama(vocab=32, heads=2, **kw):
    return zoo.build(
        "llama", hidden=LH, layers=LL, heads=heads, kv_heads=heads, ffn=LF, vocab=vocab,
        seq=LS, **kw,
    )  # fmt: skip


def _run(g, n, **layout):
    cl = clusters.load("dgx_a100_80g").subset(range(n))
    return Simulator(g, cl).evaluate(Plan.hybrid(g, cl, microbatch_size=1, **layout))


def _layer_params(heads=2):
    h, kv = LH, LH  # kv_heads == heads: full multi-head attention
    return h * (h + 2 * kv) + h * h + 3 * h * LF + 2 * h


def _layer_act(heads=2):
    # LLaMA, one sequence, no recomputation: 8 s h + (4 s h + 4 s kv + 8 s ffn) + 2 a s^2
    return 8 * LS * LH + 4 * LS * LH + 4 * LS * LH + 8 * LS * LF + 2 * heads * LS * LS


def test_fsdp_root_unsharded_keeps_embedding_and_head_gathered():
    V = 32
    lay = dict(dp=8, tp=1, pp=1, global_batch=8, zero=3)
    base = _run(_llama(V), 8, **lay).peak_memory.max()
    root = _run(_llama(V, fsdp_root_unsharded=True), 8, **lay).peak_memory.max()
    # bf16 embedding, output head and final norm (untied): 2 B each
    assert root - base == pytest.approx(2 * (V * LH + V * LH + LH), rel=1e-12)
    # full recomputation, small vocabulary: the peak is in the backward, where the head's
    # unsharded bf16 gradient (output matrix + final norm) is alive as well
    lay["recompute"] = "full"
    base = _run(_llama(V), 8, **lay).peak_memory.max()
    root = _run(_llama(V, fsdp_root_unsharded=True), 8, **lay).peak_memory.max()
    assert root - base == pytest.approx(2 * (2 * V * LH + LH) + 2 * (V * LH + LH), rel=1e-12)
    # without ZeRO-3 (or with one replica) there is nothing to reshard: no change
    lay.update(zero=1)
    assert _run(_llama(V, fsdp_root_unsharded=True), 8, **lay).peak_memory.max() == (
        pytest.approx(_run(_llama(V), 8, **lay).peak_memory.max(), rel=1e-12)
    )


def test_fsdp_pipeline_unsharded_gathers_the_stage_and_accumulates_fp32_grads():
    """dp 2 x pp 2, ZeRO-3, 1F1B over m = 2 microbatches, no recomputation. Each stage
    keeps all its bf16 parameters gathered (2 B) and, from its first backward, fp32
    unsharded gradients (4 B); the sharded state is 16 B / dp."""
    V = 32
    lay = dict(dp=2, tp=1, pp=2, global_batch=4, zero=3)
    r = _run(_llama(V, fsdp_pipeline_unsharded=True), 4, **lay)
    lp = _layer_params()
    rp0 = 2 * lp + V * LH  # two layers + embedding
    rp1 = 2 * lp + V * LH + LH  # two layers + output head + final norm
    a0 = 2 * _layer_act()  # one microbatch of stage 0
    a1 = 2 * _layer_act() + 4 * LS * LH + 4 * LS * V  # + final norm, head input, fp32 logits
    # stage 0 runs F0 F1 B0 B1: max(2 a0, a0 + grads after B0); stage 1 F0 B0 F1 B1: a1 + grads
    assert 4 * rp0 > a0
    m0, m1 = r.breakdown["memory_per_rank"]
    assert m0 == pytest.approx(16 * rp0 / 2 + 2 * rp0 + a0 + 4 * rp0, rel=1e-12)
    assert m1 == pytest.approx(16 * rp1 / 2 + 2 * rp1 + a1 + 4 * rp1, rel=1e-12)
    # off: ZeRO-3's two gathered layers and the two microbatches in flight on stage 0
    off = _run(_llama(V), 4, **lay).breakdown["memory_per_rank"]
    assert off[0] == pytest.approx(16 * rp0 / 2 + 2 * 2 * lp + 2 * a0, rel=1e-12)
    # without pipeline parallelism the switch changes nothing
    flat = dict(dp=4, tp=1, pp=1, global_batch=4, zero=3)
    assert _run(_llama(V, fsdp_pipeline_unsharded=True), 4, **flat).peak_memory.max() == (
        pytest.approx(_run(_llama(V), 4, **flat).peak_memory.max(), rel=1e-12)
    )


def test_sp_saves_gathered_input_keeps_the_column_linear_inputs_whole():
    """tp 2 with SP, no recomputation, one sequence: each layer keeps its attention and
    MLP inputs (2 s h each) whole instead of halved, and the head its input (2 s h)."""
    V, t, heads = 32, 2, 8
    lay = dict(dp=1, tp=t, pp=1, global_batch=1, sequence_parallel=True)
    base = _run(_llama(V, heads=heads), t, **lay).peak_memory.max()
    sp = _run(_llama(V, heads=heads, sp_saves_gathered_input=True), t, **lay).peak_memory.max()
    assert sp - base == pytest.approx(
        LL * 4 * LS * LH * (1 - 1 / t) + 2 * LS * LH * (1 - 1 / t), rel=1e-12
    )
    # without SP the inputs are whole anyway: no change
    lay["sequence_parallel"] = False
    assert _run(
        _llama(V, heads=heads, sp_saves_gathered_input=True), t, **lay
    ).peak_memory.max() == (
        pytest.approx(_run(_llama(V, heads=heads), t, **lay).peak_memory.max(), rel=1e-12)
    )


def test_pp_keeps_stage_output_per_microbatch_in_flight():
    """pp 2, 1F1B, m = 2: stage 0 holds two microbatches' outputs (2 s h each), the last
    stage sends nothing."""
    lay = dict(dp=1, tp=1, pp=2, global_batch=2)
    base = _run(_llama(), 2, **lay).breakdown["memory_per_rank"]
    kept = _run(_llama(pp_keeps_stage_output=True), 2, **lay).breakdown["memory_per_rank"]
    assert kept[0] - base[0] == pytest.approx(2 * 2 * LS * LH, rel=1e-12)
    assert kept[1] == pytest.approx(base[1], rel=1e-12)


def test_pp_step_buffers_hold_every_microbatch_for_the_step():
    """pp 2, 1F1B, m = 2, one sequence per microbatch: stage 0 holds two gradient receive
    buffers (2 s h each); the last stage two input buffers (its one microbatch in flight
    keeps its first layer's input in one of them) and both microbatches' bf16 logits."""
    V = 32
    lay = dict(dp=1, tp=1, pp=2, global_batch=2)
    base = _run(_llama(V), 2, **lay).breakdown["memory_per_rank"]
    r = _run(_llama(V, pp_step_buffers=True), 2, **lay)
    m0, m1 = r.breakdown["memory_per_rank"]
    assert m0 - base[0] == pytest.approx(2 * 2 * LS * LH, rel=1e-12)
    assert m1 - base[1] == pytest.approx(2 * 2 * LS * LH - 2 * LS * LH + 2 * 2 * LS * V, rel=1e-12)
    assert r.breakdown["memory_pipeline_buffers"] == pytest.approx(
        [2 * 2 * LS * LH, 2 * 2 * LS * LH + 2 * 2 * LS * V]
    )
    # one stage: nothing to receive, nothing kept beyond the step's usual terms
    one = dict(dp=1, tp=1, pp=1, global_batch=2)
    assert _run(_llama(V, pp_step_buffers=True), 1, **one).peak_memory.max() == (
        pytest.approx(_run(_llama(V), 1, **one).peak_memory.max(), rel=1e-12)
    )


@pytest.mark.parametrize("flash", [True, False])
def test_op_level_sac_keeps_the_odd_matmuls_and_the_fused_attention(flash):
    """torchtitan's op-level SAC, tiny LLaMA (kv = h), one sequence, tp = 1: each layer keeps
    its input and the outputs of wq, wv, w1, w2 (wk, wo, w3 recomputed), and with the fused
    attention its output and fp32 log-sum-exp -- against full recomputation (the input
    only): the kept activations differ by L x (that - 2 s h). Korthikanti's selective
    (switch off) keeps every activation but the attention core."""
    heads, V = 2, 32
    lay = dict(dp=1, tp=1, pp=1, global_batch=1)
    kw = dict(heads=heads, flash_attention=flash)

    def run(recompute, **more):
        return _run(_llama(V, **kw, **more), 1, recompute=recompute, **lay)

    def act(r):
        return r.breakdown["memory_activations"][0]

    full = act(run("full", op_level_sac=True))
    r = run("selective", op_level_sac=True)
    sac = act(r)
    kept = 2 * LS * LH + 2 * LS * LH + 2 * LS * LH + 2 * LS * LF + 2 * LS * LH  # in, wq, wv, w1, w2
    if flash:
        kept += 2 * LS * LH + 4 * heads * LS  # attention output, log-sum-exp
    assert sac - full == pytest.approx(LL * (kept - 2 * LS * LH), rel=1e-12)
    kor = act(run("selective"))
    no_scores = _layer_act(heads) - 2 * heads * LS * LS
    assert kor - full == pytest.approx(LL * (no_scores - 2 * LS * LH), rel=1e-12)
    assert sac < kor
    # in the last layer's backward the recomputed rest of the layer (a whole layer less what
    # it keeps) is alive beside every layer's kept tensors, after the loss has freed its own
    layer = _layer_act(heads) - (2 * heads * LS * LS - 4 * heads * LS if flash else 0)
    loss = sac - LL * kept  # final norm and head inputs, fp32 logits
    state = r.breakdown["memory_state"][0]
    assert layer - kept > loss  # the recomputation-bound case
    assert r.peak_memory.max() == pytest.approx(state + LL * kept + (layer - kept), rel=1e-12)


def test_op_level_sac_gpt_keeps_qkv_and_fc1():
    """GPT's matmuls run qkv, proj, fc1, fc2: op-level SAC keeps the block input and the
    qkv (2 s 3h) and fc1 (2 s 4h) outputs, 16 s h per layer and sequence (no fused attention)."""

    def act(recompute, **kw):
        g = zoo.build("gpt", hidden=H, layers=L, heads=A, vocab=64, seq=S, **kw)
        cl = clusters.load("dgx_a100_80g").subset(range(1))
        r = Simulator(g, cl).evaluate(
            Plan.hybrid(g, cl, dp=1, tp=1, pp=1, microbatch_size=1, global_batch=1,
                        recompute=recompute)
        )  # fmt: skip
        return r.breakdown["memory_activations"][0]

    assert act("selective", op_level_sac=True) - act("full") == pytest.approx(
        L * (16 * S * H - 2 * S * H), rel=1e-12
    )


def test_loss_parallel_logit_bytes():
    """16 B per logit (loss_parallel's fused backward), sharded over tp."""
    V, t, heads = 1000, 2, 8
    lay = dict(dp=1, tp=t, pp=1, global_batch=1)
    a = _run(_llama(V, heads=heads), t, **lay).peak_memory.max()
    b = _run(_llama(V, heads=heads, loss_logit_bytes=16.0), t, **lay).peak_memory.max()
    assert b - a == pytest.approx((16 - 4) * LS * V / t, rel=1e-12)


def test_model_dims_switches_round_trip_and_validation():
    import json

    from graphs.layout import ModelDims, model_dims

    on = dict(
        fsdp_root_unsharded=True, fsdp_pipeline_unsharded=True, sp_saves_gathered_input=True,
        pp_keeps_stage_output=True, pp_step_buffers=True, flash_attention=True,
        loss_logit_bytes=16.0, op_level_sac=True,
    )  # fmt: skip
    g = _llama(**on)
    d = model_dims(g)
    back = ModelDims(**json.loads(json.dumps(d.to_dict())))
    assert back == d and all(getattr(back, k) == v for k, v in on.items())
    # defaults are not written, so graphs built before the switches keep their hash
    plain = model_dims(_llama()).to_dict()
    assert not set(on) & set(plain)
    assert _llama().content_hash() == _llama(fsdp_root_unsharded=False).content_hash()
    for k in ("fsdp_root_unsharded", "fsdp_pipeline_unsharded", "sp_saves_gathered_input",
              "pp_keeps_stage_output", "pp_step_buffers", "op_level_sac"):  # fmt: skip
        with pytest.raises(ValueError, match=k):
            ModelDims(**{**plain, k: "yes"})
        with pytest.raises(ValueError, match=k):
            _llama(**{k: 1})


@pytest.mark.parametrize(
    ("t", "sp"), [(1, False), (2, False), (2, True)], ids=["tp1", "tp2", "tp2-sp"]
)
def test_megatron_local_keeps_fp32_norm_copies_dropout_masks_and_rope_tables(t, sp):
    """Megatron-LM's legacy layers, one sequence in flight, no recomputation, by hand per
    layer: two RMSNorms each keep an fp32 copy of their input and their fp16 output before
    the weight (+4 s h bytes each over a fused norm), two TorchScript bias-dropout-adds each
    a 1-byte mask at dropout 0 (+s h each) -- both on the residual stream, which sequence
    parallelism shards -- and RoPE the cos / sin tables of Q and K (4 x 2 s d, every rank)."""
    heads = 2
    lay = dict(dp=1, tp=t, pp=1, global_batch=1, sequence_parallel=sp, recompute="none")
    kw = dict(flash_attention=True, dropout=False)
    base = _run(_llama(heads=heads, **kw), t, **lay).peak_memory
    legacy = _run(_llama(heads=heads, megatron_local=True, **kw), t, **lay).peak_memory
    residual = 2 * 4 * LS * LH + 2 * LS * LH
    rope = 4 * 2 * LS * (LH // heads)
    want = LL * (residual / (t if sp else 1) + rope)
    assert list(legacy - base) == pytest.approx([want] * t, rel=1e-12)
    # with dropout on, the masks are counted already; GPT's LayerNorm is Apex's fused one
    on = _llama(heads=heads, megatron_local=True, flash_attention=True, dropout=True)
    assert on.meta["model_dims"]["megatron_local"] is True
    from graphs.layout import model_dims

    assert model_dims(on).megatron_local_saved() == (2 * 4 * LS * LH, rope)
    gpt = zoo.build("gpt", hidden=LH, layers=LL, heads=heads, vocab=32, seq=LS,
                    megatron_local=True)  # fmt: skip
    assert model_dims(gpt).megatron_local_saved() == (0.0, 0.0)  # GPT: dropout on, fused LN


def test_megatron_local_keeps_each_received_stage_input():
    """pp 2, 1F1B, m = 2, one sequence per microbatch, no recomputation, 2 layers a stage:
    stage 0 holds two microbatches in flight, stage 1 one. Each layer keeps the legacy terms
    (2 x 4 s h + 2 s h + 4 x 2 s d, as above), and the last stage also the input it received
    for its microbatch (2 s h), which Megatron's schedule holds and the legacy RMSNorm does
    not keep; the first stage receives nothing."""
    lay = dict(dp=1, tp=1, pp=2, global_batch=2, recompute="none")
    kw = dict(flash_attention=True, dropout=False)
    base = _run(_llama(**kw), 2, **lay).breakdown["memory_per_rank"]
    legacy = _run(_llama(megatron_local=True, **kw), 2, **lay).breakdown["memory_per_rank"]
    layer = 10 * LS * LH + 8 * LS * (LH // 2)
    per_stage = LL // 2
    assert legacy[0] - base[0] == pytest.approx(2 * per_stage * layer, rel=1e-12)
    assert legacy[1] - base[1] == pytest.approx(per_stage * layer + 2 * LS * LH, rel=1e-12)


def test_megatron_local_with_a_torchtitan_switch_is_refused():
    """Two frameworks' switches at once gave a mix (op-level SAC's kept tensors with the
    legacy layers' recomputation transient): refused, naming both."""
    with pytest.raises(ValueError, match=r"megatron_local .* and \['op_level_sac'\]"):
        _llama(megatron_local=True, op_level_sac=True)
