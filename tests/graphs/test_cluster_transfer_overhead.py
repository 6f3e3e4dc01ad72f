"""Device.transfer_overhead: validation, JSON/YAML round trip, hash unchanged when 0, cpu_N calibration."""

from __future__ import annotations

import pytest

from graphs.cluster import Cluster, Device, Link
from graphs.clusters import load
from graphs.cpu_cluster import cpu_cluster


def two(ovh: float) -> Cluster:
    devs = tuple(
        Device(f"d{i}", "x", peak_flops=1e12, mem_bw=1e9, memory=1e9, transfer_overhead=ovh)
        for i in range(2)
    )
    return Cluster("two", devs, (Link(0, 1, 1e9, 1e-6), Link(1, 0, 1e9, 1e-6)))


def test_zero_overhead_is_left_out_and_keeps_the_hash() -> None:
    c0 = two(0.0)
    d = c0.to_dict()
    assert all("transfer_overhead" not in dv for dv in d["devices"])
    # the preset's hash as computed before the field existed
    assert load("dgx1_v100_8").content_hash() == "6e8f1685e9322627"
    assert two(3e-5).content_hash() != c0.content_hash()
    dv = Device("r", "x", peak_flops=1, mem_bw=1, memory=1, receive_overhead=1e-3)
    assert dv.to_dict()["receive_overhead"] == 1e-3 and "transfer_overhead" not in dv.to_dict()


def test_round_trip_and_yaml_form() -> None:
    c = two(2.5e-5)
    back = Cluster.from_dict(c.to_dict())
    assert [dv.transfer_overhead for dv in back.devices] == [2.5e-5, 2.5e-5]
    assert back.content_hash() == c.content_hash()
    y = Cluster.from_dict(
        {
            "name": "y",
            "device_types": {"t": {"kind": "cpu", "peak_flops": "1e10", "mem_bw": 1e9,
                                   "memory": 1e9, "transfer_overhead": "4e-5"}},
            "devices": [{"name": "a", "type": "t"}, {"name": "b", "type": "t"}],
            "links": [{"src": "a", "dst": "b", "bandwidth": 1e9, "latency": 0.0}],
        }
    )  # fmt: skip
    assert y.devices[1].transfer_overhead == 4e-5


def test_bad_overhead_is_refused() -> None:
    with pytest.raises(ValueError, match="d0.*transfer_overhead must be finite and >= 0"):
        two(-1e-6)
    with pytest.raises(
        ValueError,
        match=r"field 'devices\[0\].transfer_overhead' is 'fast'; expected a finite number",
    ):
        Cluster.from_dict(
            {"name": "z", "devices": [{"name": "a", "kind": "x", "peak_flops": 1, "mem_bw": 1,
                                       "memory": 1, "transfer_overhead": "fast"}]}
        )  # fmt: skip


def test_cpu_cluster_reads_and_scales_calibrated_overhead() -> None:
    cal = {"device": {"transfer_overhead": 1e-4}, "concurrency": {"1": 1.0, "2": 0.5}}
    assert cpu_cluster(2, calibration=cal).devices[0].transfer_overhead == 1e-4
    assert cpu_cluster(2, calibration=cal, processes=2).devices[1].transfer_overhead == 2e-4
    assert cpu_cluster(2, calibration={}).devices[0].transfer_overhead == 0.0


def test_with_endpoint_costs_sets_every_device_and_keeps_the_rest() -> None:
    c = two(1e-5)
    w = c.with_endpoint_costs(3e-5, 2e-5)
    assert [d.transfer_overhead for d in w.devices] == [3e-5, 3e-5]
    assert [d.receive_overhead for d in w.devices] == [2e-5, 2e-5]
    assert w.links == c.links and w.name == c.name and w.devices[0].peak_flops == 1e12
    assert c.devices[0].transfer_overhead == 1e-5  # the original is unchanged
    assert c.with_endpoint_costs(0.0).content_hash() == two(0.0).content_hash()
