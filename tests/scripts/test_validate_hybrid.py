"""scripts/validate_hybrid.py: the published Megatron-LM rows it checks, and its one fit."""

from __future__ import annotations

import pytest

from placement_env.oracles.hybrid import DEFAULT_GEMM_EFFICIENCY
from tests.scripts import load_script


@pytest.fixture(scope="module")
def vh():
    return load_script("validate_hybrid")


def test_the_default_efficiency_is_the_fit_on_the_trillion_parameter_row(vh):
    fit = vh.fit_gemm_efficiency(tol=1e-4)
    assert fit == pytest.approx(DEFAULT_GEMM_EFFICIENCY, abs=1e-3)
    hw, _ = vh.narayanan_tflops(vh.NARAYANAN[-1], fit)
    assert hw == pytest.approx(163, rel=1e-3)


def test_narayanan_table1_rows_are_predicted_within_ten_percent(vh):
    errors = {}
    for row in vh.NARAYANAN[:-1]:  # the 1T row is the fitted one
        hw, res = vh.narayanan_tflops(row)
        errors[row[0]] = hw / row[-1] - 1
        assert not res.oom
        assert res.layout.dp == row[6] // (row[4] * row[5])
    assert max(abs(e) for e in errors.values()) <= 0.10, errors


def test_megatron_rows_reduce_gradients_after_the_backward(vh):
    cl = vh.megatron_cluster(2)
    assert cl.meta["overlap_grad_reduce"] is False and cl.num_devices == 16
    _, res = vh.narayanan_tflops(vh.NARAYANAN[0])
    # 1.7B on 32 GPUs, t = p = 1: the whole all-reduce is exposed
    assert res.breakdown["dp_exposed"] == pytest.approx(res.breakdown["dp_comm"], rel=1e-12)


def test_korthikanti_table5_iteration_times_within_ten_percent(vh):
    rows = vh.korthikanti_table5_rows()
    assert len(rows) == 8
    for (name, *_), mode, pub, res in rows:
        assert not res.oom, (name, mode)
        assert res.layout.dp == 1 and res.layout.tp == 8
        assert abs(res.step_time / pub - 1) <= 0.10, (name, mode, res.step_time, pub)
    # the doc's headline is the TFLOP/s error (the same FLOPs over each time): 8 of 8 within
    # 10 % since the optimizer step counts Megatron-LM's fp16 traffic (54 bytes per parameter;
    # 32 before 1 Dec 2026, when the 22B model with SP + selective recomputation was +10.5 %)
    tflops = {(row[0], m): pub / res.step_time - 1 for row, m, pub, res in rows}
    assert max(abs(v) for v in tflops.values()) <= 0.10
    assert tflops[("22B", "SP + selective")] == pytest.approx(0.073, abs=0.0015)
    # the 22B row on 8 GPUs is where the step weighs most: 2.75e9 parameters per GPU
    res22 = next(r for row, m, _, r in rows if row[0] == "22B" and m == "SP + selective")
    phi = res22.breakdown["rank_params"][0]
    assert res22.breakdown["optimizer"][0] == pytest.approx(phi * 54 / 2.039e12, rel=1e-3)
    # selective recomputation with SP is faster than full recomputation for every model
    by = {(row[0], m): r.step_time for row, m, _, r in rows}
    for name, *_ in vh.KORTHIKANTI_TAB5:
        assert by[(name, "SP + selective")] < by[(name, "full recompute")]


def test_zero_bubble_paper_1f1b_throughput_within_ten_percent(vh):
    # Qi et al., ICLR 2024, Tables 4, 6, 11 and 12: Megatron-LM's 1F1B on pure pipelines of
    # 8-32 A100s; 40 cells, none fitted
    rows = vh.zero_bubble_rows()
    assert len(rows) == 40
    for row, m, pub, pred, res in rows:
        assert not res.oom, (row[0], m)
        assert res.layout.pp == row[1] and res.layout.dp == res.layout.tp == 1
        assert abs(pred / pub - 1) <= 0.10, (row[0], row[1], m, pred, pub)
    # more microbatches, a smaller 1F1B bubble: the throughput grows with m, as published
    by: dict = {}
    for row, m, pub, pred, _ in rows:
        by.setdefault(row[:3], []).append((m, pub, pred))
    for key, cells in by.items():
        cells.sort()
        assert [c[2] for c in cells] == sorted(c[2] for c in cells), key
        assert [c[1] for c in cells] == sorted(c[1] for c in cells), key
