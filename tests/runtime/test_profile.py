"""runtime.profile: the latency/bandwidth fit and the calibration file the cpu_N cluster reads."""

from __future__ import annotations

import pytest

from graphs.cpu_cluster import cpu_cluster
from runtime.profile import fit_latency_bandwidth, measure_ops, write_calibration

pytestmark = pytest.mark.timeout(60)


def test_fit_recovers_latency_and_bandwidth():
    sizes = [0, 1000, 1_000_000, 4_000_000]
    times = [50e-6 + s / 2e9 for s in sizes]  # 50 us + 2 GB/s
    lat, bw = fit_latency_bandwidth(sizes, times)
    assert lat == pytest.approx(50e-6, rel=1e-6)
    assert bw == pytest.approx(2e9, rel=1e-6)


def test_calibration_round_trip(tmp_path):
    device = {"peak_flops": 8e10, "mem_bw": 1.5e10, "efficiency": 1.0, "launch_overhead": 1e-5}
    cal = write_calibration(
        device, {"latency": 4e-5, "bandwidth": 1.8e9}, tmp_path / "c.json", memory=2**30
    )
    c = cpu_cluster(3, calibration=cal)
    assert c.devices[2].peak_flops == 8e10 and c.devices[0].memory == 2**30
    assert c.transfer_time(0, 1, 1.8e9) == pytest.approx(4e-5 + 1.0)


def test_measure_ops_times_every_op():
    ops = measure_ops({"factory": "runtime.toy:branchy"}, repeats=1)
    assert {"linear", "relu", "mean"} <= set(ops)
    assert all(t > 0 for t in ops.values())


def test_concurrency_factor_scales_cpu_cluster():
    from graphs.cpu_cluster import concurrency_factor

    dev = {"peak_flops": 8e10, "mem_bw": 2e10, "efficiency": 1.0, "launch_overhead": 1e-5}
    cal = {"device": dev, "concurrency": {"1": 1.0, "2": 0.5, "3": 0.4}}
    assert concurrency_factor(cal, 1) == 1.0
    assert concurrency_factor(cal, 2) == 0.5
    # beyond the measured counts: the 3-process total throughput (1.2) shared by 4
    assert concurrency_factor(cal, 4) == pytest.approx(0.3)
    assert concurrency_factor({"device": dev}, 4) == 1.0  # no measurement: independent
    assert concurrency_factor({"concurrency": {"1": 1.0, "2": 1.08}}, 2) == 1.0  # noise capped
    c = cpu_cluster(3, calibration=cal, processes=2)
    assert c.devices[1].peak_flops == pytest.approx(4e10)
    assert c.devices[1].mem_bw == pytest.approx(1e10)
    assert c.devices[1].launch_overhead == pytest.approx(2e-5)
    assert cpu_cluster(3, calibration=cal).devices[1].peak_flops == 8e10
    with pytest.raises(ValueError, match="processes must be >= 1"):
        concurrency_factor(cal, 0)


def test_measure_concurrent_speed_relative_to_one(tmp_path):
    from runtime.profile import measure_concurrent_speed

    conc = measure_concurrent_speed((2,), n=64, seconds=0.2)
    assert set(conc) == {"1", "2"} and conc["1"] == 1.0
    assert 0.0 < conc["2"] < 2.0
    cal = write_calibration(
        {"peak_flops": 1e10}, {"latency": 1e-5, "bandwidth": 1e9}, tmp_path / "c.json",
        concurrency=conc,
    )  # fmt: skip
    assert cal["concurrency"] == conc
    with pytest.raises(ValueError, match="counts must be >= 1"):
        measure_concurrent_speed((0,))


def test_measure_handoff_is_positive_and_ordered():
    from runtime.profile import measure_handoff

    h = measure_handoff(repeats=3, work=32)
    assert set(h) == {"mean", "median", "min"}
    assert 0.0 <= h["min"] <= h["median"] and h["min"] <= h["mean"] < 1.0
