"""Hybrid step model: hand-computed collectives, TP traffic, ZeRO and activation memory, pipeline bubbles."""

from __future__ import annotations

import time

import numpy as np
import pytest

from graphs import clusters, zoo
from graphs.plan import Plan
from placement_env.oracles import Simulator
from placement_env.oracles.collectives import Topology, ring_allreduce_time
from placement_env.oracles.hybrid import OPTIMIZER_BYTES, HybridModel
from placement_env.oracles.pipeline import bubble_fraction, simulate_pipeline

GB = 1e9
NV_BW, NV_LAT = 300e9, 2e-6  # dgx_a100_80g: GPU -> NVSwitch -> GPU, 1 us per hop
IB_BW, IB_LAT = 25e9, 5e-6  # one HDR NIC per GPU, 2.5 us per hop through the fabric


@pytest.fixture(scope="module")
def a100x2():
    return clusters.load("dgx_a100_80g", nodes=2)


def _gpt(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200):
    return zoo.build("gpt", hidden=hidden, layers=layers, heads=heads, vocab=vocab, seq=seq)


# ------------------------------------------------------------------ collectives
def test_ring_allreduce_in_one_node(a100x2):
    topo = Topology.from_cluster(a100x2)
    assert (topo.gpus_per_node, topo.intra.bw, topo.intra.lat) == (8, NV_BW, NV_LAT)
    assert (topo.inter.bw, topo.inter.lat) == (IB_BW, IB_LAT)
    # 2 (n-1)/n S / B + 2 (n-1) lat
    want = 2 * 7 / 8 * GB / NV_BW + 14 * NV_LAT
    assert topo.allreduce(GB, np.arange(8)) == pytest.approx(want)
    assert want == pytest.approx(ring_allreduce_time(GB, 8, NV_BW, NV_LAT))
    assert topo.allreduce(GB, np.arange(1)) == 0.0


def test_hierarchical_allreduce_over_two_nodes(a100x2):
    topo = Topology.from_cluster(a100x2)
    # reduce-scatter in each node, 8 parallel rings of S/8 across the 2 nodes, all-gather
    intra = 7 / 8 * GB / NV_BW + 7 * NV_LAT
    inter = 2 * 1 / 2 * (GB / 8) / IB_BW + 2 * 1 * IB_LAT
    assert topo.allreduce(GB, np.arange(16)) == pytest.approx(2 * intra + inter)
    # one rank per node (a DP group when TP fills the node): a flat ring over the NICs
    assert topo.allreduce(GB, np.array([0, 8])) == pytest.approx(GB / IB_BW + 2 * IB_LAT)
    # 2 ranks per node in 2 nodes
    two = 1 / 2 * GB / NV_BW + NV_LAT
    assert topo.allreduce(GB, np.array([0, 4, 8, 12])) == pytest.approx(
        2 * two + (GB / 2) / IB_BW + 2 * IB_LAT
    )


def test_ring_on_the_dgx1_cube_mesh_uses_nvlink():
    topo = Topology.from_cluster(clusters.load("dgx1_v100_8"))
    # the best Hamiltonian ring through the 8 V100s uses only NV2 pairs (50 GB/s): 0-3-2-1-5-6-7-4
    assert topo.ring_link(tuple(range(8))).bw == pytest.approx(50e9)
    # GPUs 0 and 5 share no NVLink: PCIe through both sockets (12 GB/s)
    assert topo.ring_link((0, 5)).bw == pytest.approx(12e9)


# ------------------------------------------------------------------ per-layer TP traffic
def test_layer_tp_communication():
    g = _gpt(layers=4, hidden=1024, heads=16, seq=1024)
    cl = clusters.load("dgx_a100_80g")
    b, s, h = 2, 1024, 1024
    plan = Plan.hybrid(g, cl, dp=1, tp=8, pp=1, microbatch_size=b, global_batch=4)
    r = Simulator(g, cl).evaluate(plan)
    # Megatron: 2 all-reduces of the (b, s, h) fp16 hidden state forward, 2 backward
    ar = 2 * 7 / 8 * (2 * b * s * h) / NV_BW + 14 * NV_LAT
    assert r.breakdown["tp_collective"] == pytest.approx(ar)
    model = HybridModel(g, cl)
    no_tp = Plan.hybrid(g, cl, dp=8, tp=1, pp=1, microbatch_size=b, global_batch=16)
    r1 = model.evaluate(no_tp.layout)
    # compute scales by 1/8 with TP (activation traffic too, but for the 10sh the TP does not split)
    assert r.breakdown["layer_fwd"] - 2 * ar < r1.breakdown["layer_fwd"] / 4
    # sequence parallelism: reduce-scatter + all-gather, the same ring time
    sp = Plan.hybrid(
        g, cl, dp=1, tp=8, pp=1, microbatch_size=b, global_batch=4, sequence_parallel=True
    )
    assert model.evaluate(sp.layout).breakdown["tp_collective"] == pytest.approx(ar)


# ------------------------------------------------------------------ memory
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_memory_per_device(zero):
    g = _gpt(layers=4, hidden=1024, heads=16, seq=512)
    cl = clusters.load("dgx_a100_80g")
    N = 8
    plan = Plan.hybrid(g, cl, dp=N, tp=1, pp=1, microbatch_size=1, global_batch=8, zero=zero)
    r = Simulator(g, cl).evaluate(plan)
    phi = r.breakdown["rank_params"][0]
    d = g.meta["model_dims"]
    assert phi == pytest.approx(
        d["layers"] * HybridModel(g, cl).dims.layer_params()
        + HybridModel(g, cl).dims.embedding_params()
        + HybridModel(g, cl).dims.head_params()
    )
    # ZeRO paper (Rajbhandari et al. 2020) with K = 12: 16 phi, 4 phi + 12 phi / N,
    # 2 phi + 14 phi / N, 16 phi / N (+ two gathered layers of fp16 weights for ZeRO-3)
    want = {0: 16 * phi, 1: 4 * phi + 12 * phi / N, 2: 2 * phi + 14 * phi / N, 3: 16 * phi / N}
    lp = HybridModel(g, cl).dims.layer_params()
    extra = 2 * lp * 2 if zero == 3 else 0.0
    assert OPTIMIZER_BYTES == 12.0
    assert r.breakdown["memory_state"][0] == pytest.approx(want[zero] + extra)


def test_activation_memory_with_and_without_recompute():
    L, h, a, s, V, b = 4, 1024, 16, 512, 51200, 2
    g = _gpt(layers=L, hidden=h, heads=a, seq=s, vocab=V)
    cl = clusters.load("dgx_a100_80g")
    model = HybridModel(g, cl)

    def act(tp, recompute, sp=False):
        p = Plan.hybrid(
            g, cl, dp=8 // tp, tp=tp, pp=1, microbatch_size=b, global_batch=b * 8 // tp,
            recompute=recompute, sequence_parallel=sp,
        )  # fmt: skip
        return model.evaluate(p.layout).breakdown["memory_activations"][0]

    ends = (
        b * s * h + b * 4 * s * h + 4 * b * s * V
    )  # embedding mask; final LN, head input, fp32 logits
    # Korthikanti et al. 2022: s b h (34 + 5 a s / h) per layer, 2 s b h with full recomputation
    assert act(1, "none") == pytest.approx(L * s * b * h * (34 + 5 * a * s / h) + ends)
    assert act(1, "full") == pytest.approx(L * 2 * s * b * h + ends)
    assert act(1, "selective") == pytest.approx(L * s * b * h * 34 + ends)
    t = 8
    ends_t = b * s * h + b * 4 * s * h + 4 * b * s * V / t
    assert act(t, "none") == pytest.approx(
        L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + ends_t
    )
    ends_sp = (b * s * h + b * 4 * s * h) / t + 4 * b * s * V / t
    assert act(t, "none", sp=True) == pytest.approx(
        L * s * b * h * (34 / t + 5 * a * s / (h * t)) + ends_sp
    )
    assert act(t, "selective", sp=True) == pytest.approx(L * s * b * h * 34 / t + ends_sp)


def test_1f1b_keeps_p_microbatches_on_the_first_stage():
    g = _gpt(layers=8, hidden=1024, heads=16, seq=512)
    cl = clusters.load("dgx_a100_80g")
    model = HybridModel(g, cl)
    one = model.evaluate(
        Plan.hybrid(g, cl, dp=1, tp=2, pp=4, microbatch_size=1, global_batch=4).layout
    )
    many = model.evaluate(
        Plan.hybrid(g, cl, dp=1, tp=2, pp=4, microbatch_size=1, global_batch=16).layout
    )
    gp = model.evaluate(
        Plan.hybrid(
            g, cl, dp=1, tp=2, pp=4, microbatch_size=1, global_batch=16, schedule="gpipe"
        ).layout
    )
    a1, a16, ag = (r.breakdown["memory_activations"] for r in (one, many, gp))
    # 1F1B: stage p holds min(P - p, m) microbatches; GPipe holds all m
    assert a16[0] == pytest.approx(a1[0])  # m = 4 = P already fills stage 0
    assert a16[1] == pytest.approx(a1[1])
    assert ag[1] == pytest.approx(a1[1] / 3 * 16)  # stage 1 under 1F1B with m >= P: 3 microbatches


# ------------------------------------------------------------------ pipeline schedules
@pytest.mark.parametrize("code, v", [(0, 1), (1, 1), (2, 2), (2, 4)])
def test_uniform_bubble_is_p_minus_1_over_v_m(code, v):
    P, m, f, bw = 4, 8, 1.0, 2.0
    C = P * v
    fd, bd = np.full(C, f / v), np.full(C, bw / v)
    z = np.zeros(C)
    makespan, *_ = simulate_pipeline(code, P, v, m, fd, bd, z, z, np.ones(C))
    ideal = m * (f + bw)
    assert (makespan - ideal) / ideal == pytest.approx(bubble_fraction(P, v, m))
    assert bubble_fraction(P, v, m) == (P - 1) / (v * m)


# ------------------------------------------------------------------ data parallelism
def test_one_replica_equals_the_plan_without_dp():
    g = _gpt(layers=8, hidden=1024, heads=16, seq=512)
    node = clusters.load("dgx_a100_80g")
    half = node.subset(range(4))
    solo = Simulator(g, half).evaluate(
        Plan.hybrid(g, half, dp=1, tp=2, pp=2, microbatch_size=1, global_batch=8)
    )
    assert sum(solo.breakdown["dp_comm"]) == 0.0 and max(solo.breakdown["zero_allgather"]) == 0.0
    assert max(solo.breakdown["dp_exposed"]) == 0.0
    two = Simulator(g, node).evaluate(
        Plan.hybrid(g, node, dp=2, tp=2, pp=2, microbatch_size=1, global_batch=16)
    )
    # each replica runs the same pipeline (same microbatches, same links); DP adds only
    # its exposed gradient all-reduce
    assert two.breakdown["pipeline"] == pytest.approx(solo.breakdown["pipeline"], rel=1e-12)
    assert solo.breakdown["memory_activations"] == pytest.approx(
        two.breakdown["memory_activations"]
    )
    extra = two.step_time - solo.step_time
    assert 0 < extra <= max(two.breakdown["dp_comm"]) + 1e-12
    assert extra == pytest.approx(max(two.breakdown["dp_exposed"]), rel=1e-3)


def test_gradient_allreduce_after_the_backward_when_not_overlapped():
    import dataclasses

    g = _gpt(layers=8, hidden=1024, heads=16, seq=512)
    node = clusters.load("dgx_a100_80g")
    plan = Plan.hybrid(g, node, dp=4, tp=1, pp=2, microbatch_size=1, global_batch=16)
    on = Simulator(g, node).evaluate(plan)
    late = dataclasses.replace(node, meta={**node.meta, "overlap_grad_reduce": False})
    sim = Simulator(g, late)
    off = sim.evaluate(Plan.hybrid(g, late, dp=4, tp=1, pp=2, microbatch_size=1, global_batch=16))
    assert sim._hybrid.overlap_grad_reduce is False
    # same pipeline and the same collectives; every rank waits for all of its chunk
    # all-reduces after its last backward: exposed = their sum
    assert off.breakdown["pipeline"] == pytest.approx(on.breakdown["pipeline"], rel=1e-12)
    assert off.breakdown["dp_comm"] == pytest.approx(on.breakdown["dp_comm"], rel=1e-12)
    assert off.breakdown["dp_exposed"] == pytest.approx(off.breakdown["dp_comm"], rel=1e-12)
    # rank 0 holds the embedding and 4 layers: one all-reduce of their fp16 gradients
    topo = Topology.from_cluster(node)
    d = sim._hybrid.dims
    nbytes = (d.embedding_params() + 4 * d.layer_params()) * 2.0
    assert off.breakdown["dp_comm"][0] == pytest.approx(
        topo.allreduce(nbytes, np.arange(4)), rel=1e-9
    )
    assert max(on.breakdown["dp_exposed"]) < max(off.breakdown["dp_exposed"])
    assert off.step_time > on.step_time
    # the constructor's argument wins over the cluster's meta
    assert HybridModel(g, late, overlap_grad_reduce=True).overlap_grad_reduce is True
    bad = dataclasses.replace(node, meta={**node.meta, "overlap_grad_reduce": "no"})
    with pytest.raises(ValueError, match=r"meta\.overlap_grad_reduce.*'no'"):
        HybridModel(g, bad)


# ------------------------------------------------------------------ scale and dispatch
def test_trillion_parameter_plan_on_3072_gpus_scores_fast():
    g = zoo.build("gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048)
    cl = clusters.load("dgx_a100_80g", nodes=384)
    sim = Simulator(g, cl)
    plan = Plan.hybrid(
        g, cl, dp=6, tp=8, pp=64, microbatch_size=1, global_batch=3072, recompute="full"
    )
    sim.evaluate(plan)  # warm (numba)
    t0 = time.perf_counter()
    r = sim.evaluate(plan)
    assert time.perf_counter() - t0 < 0.1
    assert not r.oom and 0.3 < r.mfu < 0.6
    assert r.model_flops_per_device == pytest.approx(r.mfu * 312e12)
    assert r.peak_memory.shape == (3072,)


def test_op_plans_still_use_the_op_level_simulator():
    g = _gpt(layers=2, hidden=256, heads=4, seq=128, vocab=1000)
    cl = clusters.load("dgx_a100_80g")
    r = Simulator(g, cl).evaluate(np.zeros(g.num_nodes, np.int64))
    assert type(r).__name__ == "SimResult" and r.step_time > 0


def test_torchtitan_llama3_8b_fsdp_memory_terms_by_hand():
    """The validated configuration of docs/hybrid.md (torchtitan, Llama 3.1 8B, FSDP on 8
    H100s, sequence 32,768, local batch 1, full activation checkpointing): FlashAttention
    keeps no scores and eager ``cross_entropy(logits.float())`` holds 12 bytes per logit."""
    s, h, a, kv, f, V, L, dp = 32768, 4096, 32, 1024, 14336, 128256, 32, 8
    g = zoo.build(
        "llama", hidden=h, layers=L, heads=a, kv_heads=8, ffn=f, vocab=V, seq=s,
        flash_attention=True, loss_logit_bytes=12.0,
    )  # fmt: skip
    cl = clusters.load("dgx_h100", nodes=1)
    plan = Plan.hybrid(
        g, cl, dp=dp, tp=1, pp=1, microbatch_size=1, global_batch=8, recompute="full", zero=3
    )
    res = Simulator(g, cl).evaluate(plan)
    layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h  # q, k, v, o; SwiGLU; two RMSNorms
    params = L * layer + 2 * V * h + h  # + embedding, head, final norm (untied)
    state = params * (2 + 2 + 12) / dp + 2 * layer * 2  # ZeRO-3 shards + two gathered layers
    inputs = L * 2 * s * h  # each layer's input (full recomputation)
    loss = 4 * s * h + 12 * s * V  # final norm and head inputs, the eager loss's peak
    recomputed = 8 * s * h + (4 * s * h + 4 * s * kv + 8 * s * f) + 4 * a * s  # one layer, LSE
    # the layer is recomputed after the loss's backward has freed its buffers: never both
    assert loss > recomputed
    assert res.peak_memory.max() == pytest.approx(state + inputs + loss, rel=1e-12)
    assert res.peak_memory.max() / 2**30 == pytest.approx(71.2, abs=0.05)  # published: 83.9 GiB
    # FSDP2's root (embedding, final norm, output head) stays gathered in bf16: the
    # validated prediction (docs/hybrid.md); the peak is the loss's, before the head's
    # gradient exists
    root = zoo.build(
        "llama", hidden=h, layers=L, heads=a, kv_heads=8, ffn=f, vocab=V, seq=s,
        flash_attention=True, loss_logit_bytes=12.0, fsdp_root_unsharded=True,
    )  # fmt: skip
    r2 = Simulator(root, cl).evaluate(
        Plan.hybrid(root, cl, dp=dp, tp=1, pp=1, microbatch_size=1, global_batch=8,
                    recompute="full", zero=3)
    )  # fmt: skip
    assert r2.peak_memory.max() == pytest.approx(
        state + inputs + loss + 2 * (2 * V * h + h), rel=1e-12
    )
    assert r2.peak_memory.max() / 2**30 == pytest.approx(73.2, abs=0.05)
    # the Megatron-style defaults: materialised scores (2 a s^2 in the recomputed layer), 4 B/logit
    base = zoo.build(
        "llama", hidden=h, layers=L, heads=a, kv_heads=8, ffn=f, vocab=V, seq=s
    )  # fmt: skip
    res0 = Simulator(base, cl).evaluate(
        Plan.hybrid(base, cl, dp=dp, tp=1, pp=1, microbatch_size=1, global_batch=8,
                    recompute="full", zero=3)
    )  # fmt: skip
    recomputed0 = recomputed - 4 * a * s + 2 * a * s * s
    assert recomputed0 > 4 * s * h + 4 * s * V
    assert res0.peak_memory.max() == pytest.approx(state + inputs + recomputed0, rel=1e-12)


def test_framework_fields_keep_old_graph_hashes_and_refuse_bad_values():
    from graphs.layout import ModelDims

    g = _gpt()
    assert "flash_attention" not in g.meta["model_dims"]  # defaults are not written
    assert g.content_hash() == _gpt().content_hash()
    assert ModelDims(**g.meta["model_dims"]).saved_scores() == 5 * 16 * 1024 * 1024
    fl = zoo.build("gpt", hidden=1024, layers=8, heads=16, vocab=51200, seq=1024,
                   flash_attention=True)  # fmt: skip
    assert ModelDims(**fl.meta["model_dims"]).saved_scores() == 4 * 16 * 1024
    with pytest.raises(ValueError, match="loss_logit_bytes"):
        zoo.build("gpt", hidden=64, layers=2, heads=2, vocab=64, seq=8, loss_logit_bytes=0)
    with pytest.raises(ValueError, match="flash_attention"):
        zoo.build("gpt", hidden=64, layers=2, heads=2, vocab=64, seq=8, flash_attention="yes")


@pytest.mark.parametrize("grad_bytes, zero", [(2, 0), (4, 0), (4, 1), (4, 2), (2, 3)])
def test_optimizer_step_time_by_hand(grad_bytes, zero):
    # Megatron-LM's mixed-precision step per parameter the rank updates: fp16 (16-bit
    # gradients): cast to fp32 2 + 4, unscale 4 + 4, norm 4, Adam 16 + 12, fp32 -> fp16 weight
    # 4 + 2 = 52 bytes; bf16 (fp32 gradients): norm 4, Adam 28, weight copy 6 = 38 bytes; plus
    # zeroing the gradient buffer (grad_bytes per parameter of the buffer: all of the rank's
    # unless ZeRO-2/3 shard the gradients)
    g = zoo.build("gpt", hidden=1024, layers=4, heads=16, seq=512, vocab=51200,
                  grad_bytes=grad_bytes)  # fmt: skip
    cl = clusters.load("dgx_a100_80g")
    N = 8
    plan = Plan.hybrid(g, cl, dp=N, tp=1, pp=1, microbatch_size=1, global_batch=8, zero=zero)
    r = Simulator(g, cl).evaluate(plan)
    phi = r.breakdown["rank_params"][0]
    per_update = {2: 52.0, 4: 38.0}[grad_bytes]
    shard = N if zero >= 1 else 1
    grad_shard = N if zero >= 2 else 1
    want = (phi / shard * per_update + phi / grad_shard * grad_bytes) / cl.devices[0].mem_bw
    assert r.breakdown["optimizer"][0] == pytest.approx(want, rel=1e-12)
    assert (per_update + grad_bytes) == {2: 54.0, 4: 42.0}[grad_bytes]


def test_dropout_masks_and_fp32_gradients_by_hand():
    # a tied SwiGLU model with Megatron-LM's dropout and fp32 gradient buffer (its bf16
    # defaults) against the same model without: the difference is, by hand, the two residual
    # masks of every layer (1 byte per element), the probabilities' mask and dropped output
    # (3 a s^2 per sequence), the embedding's mask on the first stage, and 2 more bytes of
    # gradient per parameter
    L, h, a, s, V, b, f = 4, 512, 8, 256, 1024, 2, 1408
    kw = dict(hidden=h, layers=L, heads=a, kv_heads=a, ffn=f, vocab=V, seq=s, tied=True)
    plain = zoo.build("llama", **kw)
    meg = zoo.build("llama", **kw, dropout=True, grad_bytes=4)
    assert plain.meta["grad_bytes_per_param"] == 2.0 and meg.meta["grad_bytes_per_param"] == 4.0
    assert "dropout" not in plain.meta["model_dims"] and meg.meta["model_dims"]["dropout"]
    cl = clusters.load("dgx_a100_80g")
    lay = dict(dp=8, tp=1, pp=1, microbatch_size=b, global_batch=8 * b, zero=0)
    r0 = Simulator(plain, cl).evaluate(Plan.hybrid(plain, cl, **lay))
    r1 = Simulator(meg, cl).evaluate(Plan.hybrid(meg, cl, **lay))
    phi = r0.breakdown["rank_params"][0]
    assert r1.breakdown["memory_state"][0] - r0.breakdown["memory_state"][0] == pytest.approx(
        2 * phi
    )
    masks = L * b * (2 * s * h + 3 * a * s * s) + b * s * h
    assert r1.breakdown["memory_activations"][0] - r0.breakdown["memory_activations"][
        0
    ] == pytest.approx(masks)
    # FlashAttention regenerates the probabilities' mask: only the residual and embedding masks
    fl0, fl1 = (zoo.build("llama", **kw, flash_attention=True, dropout=d) for d in (False, True))
    m0, m1 = (
        Simulator(g, cl).evaluate(Plan.hybrid(g, cl, **lay)).breakdown["memory_activations"][0]
        for g in (fl0, fl1)
    )
    assert m1 - m0 == pytest.approx(L * b * 2 * s * h + b * s * h)


def test_gpt_without_dropout_keeps_what_llama_keeps_for_attention():
    # GPT's default is Megatron-LM's dropout (Korthikanti et al.'s 34 s h + 5 a s^2); without
    # it a layer keeps 2 s h less (the residual masks) and 3 a s^2 less (probabilities' mask
    # and dropped output)
    kw = dict(hidden=256, layers=2, heads=4, vocab=512, seq=128)
    on, off = zoo.build("gpt", **kw), zoo.build("gpt", **kw, dropout=False)
    d_on, d_off = HybridModel(on, clusters.load("dgx_a100_80g")).dims, model_dims_of(off)
    s, h, a = 128, 256, 4
    assert d_on.dropout and not d_off.dropout
    assert sum(d_on.activation_parts()) - sum(d_off.activation_parts()) == pytest.approx(
        2 * s * h + 3 * a * s * s
    )
    assert sum(d_on.activation_parts()) == pytest.approx(s * h * (34 + 5 * a * s / h))
    # the op-level graph's per-node activation bytes agree with the hybrid model's parts
    per_layer = lambda g: float(g.act_bytes[g.layer == 0].sum())  # noqa: E731
    assert per_layer(on) - per_layer(off) == pytest.approx(8 * (2 * s * h + 3 * a * s * s))


def model_dims_of(g):
    from graphs.layout import model_dims

    return model_dims(g)


def test_evaluate_layout_names_an_argument_that_is_not_a_layout() -> None:
    """A layout's dict (or None) failed with "'dict' object has no attribute 'validate'"."""
    from graphs import clusters, zoo
    from graphs.plan import Plan
    from placement_env.oracles import Simulator

    g = zoo.build("gpt", hidden=1024, layers=8, heads=16, vocab=51200, seq=1024)
    cl = clusters.load("dgx_a100_80g", nodes=2)
    lay = Plan.hybrid(g, cl, dp=4, tp=2, pp=2, microbatch_size=1, global_batch=64).layout
    sim = Simulator(g, cl)
    with pytest.raises(
        TypeError, match=r"HybridLayout \(HybridLayout.from_dict\(...\) reads one\), got dict"
    ):
        sim.evaluate_layout(lay.to_dict())
    with pytest.raises(TypeError, match="got NoneType"):
        sim.evaluate_layout(None)
    assert sim.evaluate_layout(lay).step_time > 0
