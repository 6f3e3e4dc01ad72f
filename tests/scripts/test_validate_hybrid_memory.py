"""scripts/validate_hybrid_memory.py: torchtitan's published runs that fit, and the one that did not."""

from __future__ import annotations

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def vm():
    return load_script("validate_hybrid_memory")


def test_every_a100_run_fits_or_runs_out_of_memory_as_published(vm):
    # torchtitan's docs/performance.md: six FSDP-64 runs on A100 80GB ran; Llama 2 70B with
    # op-level selective checkpointing at local batch 2 ran out of memory (its footnote)
    md, agree = vm.a100_table()
    assert agree == len(vm.A100_RUNS) == 7
    assert "**no**" not in md


def test_the_a100_oom_boundary_lies_between_local_batch_one_and_two(vm):
    # the same Llama 2 70B run with op-level SAC: batch 1 fits, batch 2 does not; with full
    # recomputation batch 2 fits again, and keeps far less than batch 1 with SAC
    sac1, oom1 = vm.a100_run(vm.LLAMA2["70B"], 4096, 1, "selective")
    sac2, oom2 = vm.a100_run(vm.LLAMA2["70B"], 4096, 2, "selective")
    full2, oom_full = vm.a100_run(vm.LLAMA2["70B"], 4096, 2, "full")
    assert not oom1 and oom2 and not oom_full
    assert sac1 < 80 < sac2 and full2 < sac1


def test_megatron_runs_allocated_memory_within_five_percent(vm):
    # Megatron-LM PR #482's measured torch.cuda.max_memory_allocated of four layouts of one
    # SwiGLU GPT on 8 H800s: with Megatron's bf16 defaults (fp32 gradient buffer, dropout
    # masks) every prediction is within 5 %; with the model's defaults (fp16 gradients, no
    # dropout for the SwiGLU model) every one is more than 10 % under
    md, errors = vm.megatron_table()
    assert len(errors) == len(vm.MEGATRON_RUNS) == 4
    assert all(abs(e) <= 0.05 for e in errors), errors
    for _, layout, published, _ in vm.MEGATRON_RUNS:
        assert vm.megatron_run(layout, megatron=False) < 0.9 * published
    assert "4 of 4 runs within 10 %" in md


def test_bloom_rows_are_all_under_their_nvidia_smi_readings(vm):
    # the BLOOM log's readings are nvidia-smi snapshots (the caching allocator's reserved
    # memory, the CUDA context, NCCL and DeepSpeed buffers); the model counts allocated bytes,
    # so it stays under every one -- by 18-36 % on the 54 runs that ran (the full table, 43 s,
    # is python scripts/validate_hybrid_memory.py); three representative rows here
    rows = {r[:8]: r for r in vm.BLOOM_RUNS if r[8] == 2048}
    for key in [("02-21", 14336, 72, 64, 4, 8, 12, 1), ("02-21", 14336, 72, 64, 4, 8, 12, 8),
                ("02-28", 14336, 70, 64, 8, 4, 12, 2)]:  # fmt: skip
        row = rows[key]
        assert 0.6 * row[-1] < vm.bloom_run(row) < 0.85 * row[-1], row
    # the activations grow with the microbatch as published: 29, 37, 49, 69 GiB for 1, 2, 4, 8
    mbs = [vm.bloom_run(rows[("02-21", 14336, 72, 64, 4, 8, 12, m)]) for m in (1, 2, 4, 8)]
    assert mbs == sorted(mbs) and mbs[3] - mbs[2] > mbs[2] - mbs[1] > mbs[1] - mbs[0] > 0


def test_bloom_out_of_memory_rows_fit_only_with_headroom(vm):
    # the published OOM of DP 32 x TP 2 x PP 6 at micro-batch 1: predicted 73 GiB, under the
    # 80 GiB capacity but over 80 % of it (the headroom Fujii et al. recommend)
    row = next(r for r in vm.BLOOM_RUNS if r[4:8] == (32, 2, 6, 1))
    assert row[-1] is None
    assert 0.8 * 80 < vm.bloom_run(row) < 80
    # BLOOM's training layout, which ran (176B, DP 8 x TP 4 x PP 12, MBS 2): under both
    ran = next(r for r in vm.BLOOM_RUNS if r[1:8] == (14336, 70, 112, 8, 4, 12, 2))
    assert vm.bloom_run(ran) < 0.8 * 80


def test_zero_bubble_paper_1f1b_memory_within_ten_percent(vm):
    # Qi et al., ICLR 2024, Tables 4, 6, 11 and 12: measured memory of Megatron-LM's 1F1B on
    # 8-32 A100s (pure pipeline, fp16, no FlashAttention), 20 figures; all under the published
    # figure, 18 within 10 % read as GiB (1.5B at micro-batch 12, -10.2 %, and at 2
    # microbatches, -11.3 %, are not), all 20 within 10 % read as 10^9 bytes
    md, errors = vm.zb_table()
    assert len(errors) == len(vm.ZB_1F1B) == 20
    assert all(-0.12 < e < 0 for e in errors), errors
    assert sum(abs(e) <= 0.10 for e in errors) == 18
    assert all(abs((1 + e) * 2**30 / 1e9 - 1) <= 0.10 for e in errors)
    assert "18 of 20 within 10 %" in md and "20 of 20 read as 10^9 bytes" in md
    # fewer microbatches than stages: fewer in flight, less memory, as published (Table 12)
    small = [vm.zb_run(r) for r in vm.ZB_1F1B if r[0] == "1.5B" and r[3] == "Table 12"]
    assert small == sorted(small) and small[0] < 0.4 * small[-1]
    # the same runs with FlashAttention (not what the authors ran): far under every figure
    for row in vm.ZB_1F1B[:4]:
        assert vm.zb_run(row, flash_attention=True) < 0.7 * row[4], row


def test_zero_bubble_stages_hold_one_layer_fewer_at_both_ends(vm):
    # Megatron-LM with --allow-padding-num-layers: 22 layers on 8 stages -> 2, 3, ..., 3, 2
    assert vm.zb_stage_layers(22, 8) == [(0, 2), (2, 5), (5, 8), (8, 11), (11, 14), (14, 17),
                                         (17, 20), (20, 22)]  # fmt: skip
    sizes = [b - a for a, b in vm.zb_stage_layers(62, 32)]
    assert sizes[0] == sizes[-1] == 1 and set(sizes[1:-1]) == {2}
    with pytest.raises(ValueError, match="do not split evenly"):
        vm.zb_stage_layers(23, 8)


def test_open_sci_ref_252_gpu_run_allocated_memory_within_five_percent(vm):
    # the open-sci-ref 1.7B run on 252 LEONARDO A100s (Megatron-LM, DP 252 with the
    # distributed optimizer, selective recomputation): its logged max allocated, 50,277 MiB,
    # predicted within 5 % with Megatron's bf16 defaults, as the 8-GPU PR #482 rows are
    md, err = vm.opensci_table()
    assert abs(err) <= 0.05, err
    assert vm.opensci_run(megatron=False) < vm.opensci_run() < 64  # fits its 64 GiB
    assert "| 49.10 |" in md  # 50,277.16 MiB
    # the log's "weight and optimizer=9884.48 MB": 1.7138 B parameters x (2 + 4 + 12 / 252) B
    _, shapes, seq, *_ = vm.OPENSCI_RUN
    from graphs import zoo

    g = zoo.build("llama", seq=seq, **shapes)
    assert abs(g.num_params / 1.7138e9 - 1) < 1e-3  # the log's most loaded shard
    assert g.num_params * (2 + 4 + 12 / 252) / 2**20 == pytest.approx(9884.48, rel=1e-3)


def test_llama13b_logs_stage_by_stage(vm):
    # three Megatron-LM Llama-2-13B runs (TP 2, SP, ZeRO-1, selective recomputation,
    # transformer_impl local). The reading of 29 Nov 2026 (fused layers, steady state): the
    # 64-GPU run, whose report follows a resume with the optimizer state loaded, 13-23 %
    # under on every stage. With Megatron's legacy layers (megatron_local) and the two
    # first-step reports read as peaks before Adam's moments exist: 9 of 16 within 10 %,
    # every figure 8-12 % under, the 64-GPU run -10.04 % (stage 0, the target still missed)
    # to -8.1 %.
    md, points = vm.llama13b_table()
    assert len(points) == 16 and "9 of 16 stage figures within 10 %" in md
    assert all(-0.12 < e < -0.08 for _, e in points), points
    big = [e for g, e in points if g == 64]
    assert len(big) == 4 and -0.101 < big[0] < -0.10 and all(-0.10 < e < -0.08 for e in big[1:])
    before = [vm.llama13b_run(vm.LLAMA13B_RUNS[0], legacy=False, first_step=False)[k] /
              vm.LLAMA13B_RUNS[0][5][k] - 1 for k in range(4)]  # fmt: skip
    assert all(-0.23 < e < -0.13 for e in before), before
    # the published memory falls by more per stage than predicted: the activations of one
    # microbatch are larger than the model's (~564 against ~480 MiB per layer, 376 before)
    row = vm.LLAMA13B_RUNS[2]  # okazaki: 8 stages of 5 layers, stage k holds 8 - k in flight
    pub = row[5]
    pub_step = (pub[1] - pub[5]) / 4 / 5  # MiB per layer and microbatch, middle stages
    for legacy, lo, hi in ((True, 470, 490), (False, 360, 390)):
        pred = vm.llama13b_run(row, legacy=legacy)
        assert lo < (pred[1] - pred[5]) / 4 / 5 < hi
    assert 550 < pub_step < 580
    # the first-step reading leaves out 8 / dp bytes per parameter of each stage (the
    # logged parameter counts: 1,586,073,600 on a middle stage of the 64-GPU run)
    assert vm.stage_params(vm.LLAMA13B_RUNS[0])[1] == pytest.approx(1_586_073_600, rel=1e-4)
    steady = vm.llama13b_run(row, first_step=False)
    first = vm.llama13b_run(row)
    moments = [n * 8 / 2 / 2**20 for n in vm.stage_params(row)]  # dp 2
    assert [a - b for a, b in zip(steady, first)] == pytest.approx(moments)
