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
