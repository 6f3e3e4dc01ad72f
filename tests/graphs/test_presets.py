"""Tests of the cluster presets under conf/cluster/ and graphs.clusters.load."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from graphs import clusters
from graphs.cpu_cluster import DEFAULT_CPU, calibration_digest, cpu_cluster

EXPECTED = {
    "dgx1_v100_8": (8, {"v100"}),
    "dgx_a100_8": (8, {"a100"}),
    "h100_2x8": (16, {"h100"}),
    "k40_2": (2, {"k40"}),
    "k40_4": (4, {"k40"}),
    "hetero_v100_t4": (8, {"v100", "t4"}),
}


def hops(c, a: int, b: int) -> list[str]:
    """Network-node names along the route from device a to device b."""
    names = c.node_names
    r = c.route(a, b)
    return [names[c.links[r[0]].src]] + [names[c.links[i].dst] for i in r]


def test_all_presets_listed():
    assert set(EXPECTED) | {"cpu_N"} <= set(clusters.names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_loads_and_every_pair_routes(name):
    c = clusters.load(name)
    n, kinds = EXPECTED[name]
    assert c.name == name and c.num_devices == n and set(c.kinds) == kinds
    bw = c.bandwidth_matrix()
    off = ~np.eye(n, dtype=bool)
    assert np.isfinite(bw[off]).all() and (bw[off] > 0).all()
    for a in range(n):
        for b in range(n):
            if a != b:
                # interior nodes of a route are switches, never devices
                assert all(h not in c.node_names[:n] for h in hops(c, a, b)[1:-1])
    assert all(math.isfinite(d.memory) for d in c.devices)
    assert "source" in c.meta and "description" in c.meta


def test_dgx1_hand_computed_routes():
    c = clusters.load("dgx1_v100_8")
    # NV2 pair: 2 bonded NVLink 2.0 links = 50 GB/s, one hop of 2 us
    assert c.bandwidth_matrix()[0, 3] == 50e9
    assert c.transfer_time(0, 3, 1e8) == pytest.approx(2e-6 + 1e8 / 50e9)
    # NV1 pair: 25 GB/s
    assert hops(c, 0, 1) == ["gpu0", "gpu1"]
    assert c.transfer_time(0, 1, 1e8) == pytest.approx(2e-6 + 1e8 / 25e9)
    # no NVLink between gpu0 and gpu5: PCIe through both host sockets
    assert hops(c, 0, 5) == ["gpu0", "plx0", "cpu0", "cpu1", "plx2", "gpu5"]
    assert c.transfer_time(0, 5, 12e6) == pytest.approx(4 * 2.5e-6 + 1e-6 + 12e6 / 12e9)
    # the cube-mesh: each GPU has 6 NVLink lanes, 4 NVLink neighbours, 3 non-NVLink peers
    nv = np.array([[len(c.route(a, b)) == 1 for b in range(8)] for a in range(8)])
    assert (nv.sum(1) == 4).all()
    lanes = c.bandwidth_matrix()[nv.astype(bool)].reshape(8, 4).sum(1)
    np.testing.assert_allclose(lanes, 6 * 25e9)
    assert c.devices[0].memory == 16 * 2**30 and c.devices[0].peak_flops == 125e12


def test_dgx_a100_nvswitch():
    c = clusters.load("dgx_a100_8")
    assert hops(c, 0, 7) == ["gpu0", "nvswitch", "gpu7"]
    assert c.transfer_time(2, 5, 3e8) == pytest.approx(2e-6 + 1e-3)
    assert c.devices[0].peak_flops == 312e12 and c.devices[0].mem_bw == 2039e9


def test_h100_two_nodes():
    c = clusters.load("h100_2x8")
    assert hops(c, 0, 7) == ["gpu0", "nvswitch0", "gpu7"]
    assert hops(c, 8, 15) == ["gpu8", "nvswitch1", "gpu15"]
    assert c.bandwidth_matrix()[0, 1] == 450e9
    # across nodes: the GPU's own 400 Gb/s NIC into the IB fabric
    assert hops(c, 3, 12) == ["gpu3", "ib", "gpu12"]
    assert c.transfer_time(0, 8, 5e9) == pytest.approx(5e-6 + 0.1)
    # different GPU pairs use different NIC links (aggregate 8 x 50 GB/s per node)
    assert not set(c.route(0, 8)) & set(c.route(1, 9))


@pytest.mark.parametrize("name, n", [("k40_2", 2), ("k40_4", 4)])
def test_k40_through_host(name, n):
    c = clusters.load(name)
    assert hops(c, 0, n - 1) == ["gpu0", "host", f"gpu{n - 1}"]
    assert c.transfer_time(0, n - 1, 12e6) == pytest.approx(5e-6 + 1e-3)
    assert c.devices[0].peak_flops == 4.29e12 and c.devices[0].mem_bw == 288e9


def test_hetero_mixed_speeds():
    c = clusters.load("hetero_v100_t4")
    v100, t4 = c.devices[0], c.devices[4]
    assert (v100.kind, t4.kind) == ("v100", "t4")
    assert v100.peak_flops * v100.efficiency > t4.peak_flops * t4.efficiency
    assert v100.mem_bw > t4.mem_bw and v100.memory == t4.memory
    assert hops(c, 0, 4) == ["gpu0", "pcie0", "gpu4"]
    assert hops(c, 0, 2) == ["gpu0", "pcie0", "cpu0", "cpu1", "pcie1", "gpu2"]
    assert c.latency_matrix()[0, 2] == pytest.approx(11e-6)


def test_cpu_n(tmp_path, monkeypatch):
    # a calibration in the home folder is never read implicitly: cpu_N is the defaults
    home = tmp_path / "home"
    (home / ".cache" / "devplace").mkdir(parents=True)
    (home / ".cache" / "devplace" / "cpu_calibration.json").write_text(
        json.dumps({"device": {"peak_flops": 1e9}})
    )
    monkeypatch.setenv("HOME", str(home))
    c = clusters.load("cpu_3")
    assert c.num_devices == 3 and c.kinds == ("cpu",) * 3
    assert c.meta["calibrated"] is False and c.meta["calibration"] == "defaults"
    assert c.devices[0].peak_flops == DEFAULT_CPU["peak_flops"]
    assert c.content_hash() == cpu_cluster(3).content_hash()
    with pytest.raises(ValueError, match="N >= 1"):
        clusters.load("cpu_0")


def test_cpu_n_with_a_named_calibration_records_it(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"device": {"peak_flops": 1e9, "memory": 2**30}}))
    c = clusters.load(f"cpu_2@{path}")
    assert c.name == f"cpu_2@{path}" and c.devices[1].peak_flops == 1e9
    assert c.devices[0].memory == 2**30 and c.devices[0].mem_bw == DEFAULT_CPU["mem_bw"]
    assert c.meta["calibrated"] is True and c.meta["calibration"] == str(path)
    assert c.meta["calibration_sha256"] == calibration_digest(json.loads(path.read_text()))
    # the figures differ from the defaults, so plans made for one are refused by the other
    assert c.content_hash() != clusters.load("cpu_2").content_hash()
    assert c.content_hash() == clusters.load(c.name).content_hash()
    with pytest.raises(ValueError, match="missing.json.*no such file.*runners.profile"):
        clusters.load(f"cpu_2@{tmp_path / 'missing.json'}")


def test_unknown_preset_lists_choices():
    with pytest.raises(ValueError, match="unknown cluster 'dgx9'.*dgx1_v100_8"):
        clusters.load("dgx9")


def test_load_from_file_and_bad_file(tmp_path):
    src = clusters.preset_dir() / "k40_2.yaml"
    f = tmp_path / "mine.yaml"
    f.write_text(src.read_text())
    assert clusters.load(str(f)).content_hash() == clusters.load("k40_2").content_hash()
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="expected a mapping at the top level"):
        clusters.load(str(bad))
