"""Tests of Cluster: devices, links, routing through switches, transfer times, YAML form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs.cluster import Cluster, Device, Link


def dev(name: str, kind: str = "gpu", **kw) -> Device:
    args = dict(peak_flops=1e12, mem_bw=1e11, memory=1e9)
    args.update(kw)
    return Device(name, kind, **args)


def both(a: int, b: int, bw: float, lat: float = 0.0, name: str = "") -> list[Link]:
    return [Link(a, b, bw, lat, name), Link(b, a, bw, lat, name)]


# ---------------------------------------------------------------- devices
@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"peak_flops": 0.0}, "peak_flops must be finite and > 0"),
        ({"peak_flops": math.inf}, "peak_flops must be finite"),
        ({"mem_bw": -1.0}, "mem_bw must be finite and > 0"),
        ({"memory": 0.0}, "memory must be > 0"),
        ({"efficiency": 1.5}, r"efficiency must be in \(0, 1\]"),
        ({"efficiency": 0.0}, r"efficiency must be in \(0, 1\]"),
        ({"launch_overhead": -1e-6}, "launch_overhead must be finite and >= 0"),
    ],
)
def test_device_validation_names_device(kw, msg):
    with pytest.raises(ValueError, match=f"Device 'g0': {msg}"):
        dev("g0", **kw)


def test_device_unbounded_memory_ok():
    assert dev("c", "cpu", memory=math.inf).memory == math.inf


@pytest.mark.parametrize("bw, lat", [(0.0, 0.0), (math.inf, 0.0), (1e9, -1.0), (1e9, math.nan)])
def test_link_validation(bw, lat):
    with pytest.raises(ValueError, match="Link 0->1"):
        Link(0, 1, bw, lat)


def test_cluster_structure_errors():
    with pytest.raises(ValueError, match="needs at least one device"):
        Cluster("empty", (), ())
    with pytest.raises(ValueError, match="name 'a' is used twice"):
        Cluster("dup", (dev("a"), dev("b")), tuple(both(0, 1, 1e9)), ("a",))
    with pytest.raises(ValueError, match=r"link 2 \(0->5\) must join two distinct nodes"):
        Cluster("bad", (dev("a"), dev("b")), (*both(0, 1, 1e9), Link(0, 5, 1e9, 0.0)))
    with pytest.raises(ValueError, match=r"link 0 \(1->1\)"):
        Cluster("loop", (dev("a"), dev("b")), (Link(1, 1, 1e9, 0.0), *both(0, 1, 1e9)))


# ---------------------------------------------------------------- routing
def test_direct_link_preferred_over_equal_speed_switch():
    # a - b direct at 10 GB/s; a - s - b also at 10 GB/s per hop: the direct route costs half
    links = (
        both(0, 1, 10e9, 1e-6, "nv")
        + both(0, 2, 10e9, 1e-6, "pcie")
        + both(2, 1, 10e9, 1e-6, "pcie")
    )
    c = Cluster("tri", (dev("a"), dev("b")), tuple(links), ("s",))
    r = c.route(0, 1)
    assert len(r) == 1 and c.links[r[0]].name == "nv"
    assert c.route(1, 0) == (1,)
    assert c.route(0, 0) == ()


def test_faster_two_hop_route_beats_slow_direct_link():
    # direct 1 GB/s vs two hops of 100 GB/s: 1 MiB/1e9 > 2 * 1 MiB/100e9
    links = (
        both(0, 1, 1e9, 0.0, "slow")
        + both(0, 2, 100e9, 0.0, "fast")
        + both(2, 1, 100e9, 0.0, "fast")
    )
    c = Cluster("tri", (dev("a"), dev("b")), tuple(links), ("s",))
    r = c.route(0, 1)
    assert [c.links[i].name for i in r] == ["fast", "fast"]
    assert [(c.links[i].src, c.links[i].dst) for i in r] == [(0, 2), (2, 1)]


def test_multi_hop_through_switches_and_transfer_time():
    # g0 - pcie - h0 - qpi - h1 - pcie - g1
    devs = (dev("g0"), dev("g1"))
    links = (
        both(0, 2, 12e9, 5e-6, "pcie")
        + both(2, 3, 20e9, 1e-6, "qpi")
        + both(3, 1, 12e9, 5e-6, "pcie")
    )
    c = Cluster("two_socket", devs, tuple(links), ("h0", "h1"))
    r = c.route(0, 1)
    names = c.node_names
    assert [(names[c.links[i].src], names[c.links[i].dst]) for i in r] == [
        ("g0", "h0"),
        ("h0", "h1"),
        ("h1", "g1"),
    ]
    # 11 us of latency + 12e6 bytes at the 12 GB/s bottleneck = 1 ms
    assert c.transfer_time(0, 1, 12e6) == pytest.approx(11e-6 + 1e-3)
    assert c.transfer_time(1, 0, 0.0) == pytest.approx(11e-6)
    assert c.transfer_time(0, 0, 1e9) == 0.0
    bw = c.bandwidth_matrix()
    assert bw[0, 1] == bw[1, 0] == 12e9 and math.isinf(bw[0, 0])
    lat = c.latency_matrix()
    assert lat[0, 1] == pytest.approx(11e-6) and lat[0, 0] == 0.0


def test_no_forwarding_through_devices():
    # a - b - c in a line, no switch: a cannot reach c because b does not forward
    links = both(0, 1, 1e9) + both(1, 2, 1e9)
    with pytest.raises(ValueError, match="no route from device 'a' to 'c'"):
        Cluster("line", (dev("a"), dev("b"), dev("c")), tuple(links))
    fwd = Cluster(
        "line", (dev("a"), dev("b"), dev("c")), tuple(links), (), {"device_forwarding": True}
    )
    assert len(fwd.route(0, 2)) == 2


def test_device_not_used_as_relay_even_if_faster():
    # a - b slow direct; a - c - b fast but c is a device: the slow direct link must be used
    links = both(0, 1, 1e9, 0.0, "slow") + both(0, 2, 100e9, 0.0, "f") + both(2, 1, 100e9, 0.0, "f")
    c = Cluster("tri", (dev("a"), dev("b"), dev("c")), tuple(links))
    assert [c.links[i].name for i in c.route(0, 1)] == ["slow"]


def test_directed_links_unreachable_one_way():
    with pytest.raises(ValueError, match="no route from device 'b' to 'a'"):
        Cluster("oneway", (dev("a"), dev("b")), (Link(0, 1, 1e9, 0.0),))


def test_route_index_out_of_range():
    c = Cluster("pair", (dev("a"), dev("b")), tuple(both(0, 1, 1e9)))
    with pytest.raises(ValueError, match=r"route\(0, 2\); have 2 devices"):
        c.route(0, 2)


def test_properties():
    c = Cluster(
        "mix",
        (dev("a", "v100", efficiency=0.5), dev("b", "t4", peak_flops=2e12, memory=math.inf)),
        tuple(both(0, 1, 1e9)),
    )
    assert c.num_devices == 2 and c.kinds == ("v100", "t4")
    np.testing.assert_array_equal(c.peak_flops, [1e12, 2e12])
    np.testing.assert_array_equal(c.effective_flops, [0.5e12, 2e12])
    np.testing.assert_array_equal(c.memory, [1e9, math.inf])


def test_subset_keeps_switch_routes():
    devs = tuple(dev(f"g{i}") for i in range(3))
    links = sum((both(i, 3, 10e9, 1e-6) for i in range(3)), [])
    c = Cluster("star", devs, tuple(links), ("sw",))
    s = c.subset([2, 0])
    assert [d.name for d in s.devices] == ["g2", "g0"]
    assert s.transfer_time(0, 1, 10e9) == pytest.approx(2e-6 + 1.0)


# ------------------------------------------------------------ dict form
YAML_LIKE = {
    "name": "toy",
    "description": "two GPUs and a host",
    "device_types": {
        "g": {"kind": "v100", "peak_flops": "125e12", "mem_bw": 900e9, "memory": 16e9}
    },
    "devices": [{"name": "gpu0", "type": "g"}, {"name": "gpu1", "type": "g", "efficiency": 0.5}],
    "switches": ["host"],
    "link_types": {"nvlink": {"bandwidth": 25e9, "latency": 2e-6}},
    "links": [
        {"src": "gpu0", "dst": "gpu1", "type": "nvlink", "mult": 2},
        {"src": "gpu0", "dst": "host", "bandwidth": 12e9, "latency": 5e-6},
        {"src": "host", "dst": "gpu1", "bandwidth": 6e9, "latency": 5e-6, "directed": True},
    ],
}


def test_from_dict_expands_types_mult_and_directions():
    c = Cluster.from_dict(YAML_LIKE)
    assert c.devices[0].peak_flops == 125e12 and c.devices[1].efficiency == 0.5
    assert len(c.links) == 5  # 2 + 2 + 1 directed
    assert c.bandwidth_matrix()[0, 1] == 50e9
    assert c.meta["description"] == "two GPUs and a host"


def test_to_dict_from_dict_round_trip_hash():
    c = Cluster.from_dict(YAML_LIKE)
    back = Cluster.from_dict(c.to_dict())
    assert back.content_hash() == c.content_hash()
    assert [(ln.src, ln.dst, ln.bandwidth) for ln in back.links] == [
        (ln.src, ln.dst, ln.bandwidth) for ln in c.links
    ]


def test_content_hash_sensitive_to_figures_not_name():
    c = Cluster.from_dict(YAML_LIKE)
    renamed = Cluster.from_dict({**YAML_LIKE, "name": "other"})
    assert renamed.content_hash() == c.content_hash()
    faster = Cluster.from_dict(
        {**YAML_LIKE, "link_types": {"nvlink": {"bandwidth": 26e9, "latency": 2e-6}}}
    )
    assert faster.content_hash() != c.content_hash()


@pytest.mark.parametrize(
    "patch, msg",
    [
        (
            {"devices": [{"name": "x", "type": "nope"}]},
            r"field 'devices\[0\].type' is 'nope'; expected a key of device_types",
        ),
        (
            {"devices": [{"name": "x", "kind": "k", "peak_flops": 1, "mem_bw": 1}]},
            r"field 'devices\[0\].memory' is missing",
        ),
        (
            {"devices": [{"name": "x", "type": "g", "colour": 1}]},
            r"field 'devices\[0\].colour' is not a known key",
        ),
        (
            {"devices": [{"name": "x", "type": "g", "memory": "lots"}]},
            r"field 'devices\[0\].memory' is 'lots'; expected a number",
        ),
        (
            {"links": [{"src": "gpu0", "dst": "gpu9", "bandwidth": 1}]},
            r"field 'links\[0\].dst' is 'gpu9'; expected a device or switch name",
        ),
        (
            {"links": [{"src": "gpu0", "dst": "gpu1", "type": "ib"}]},
            r"field 'links\[0\].type' is 'ib'; expected a key of link_types",
        ),
        # two links of one direction were both kept; the routes took whichever came first
        (
            {"links": [{"src": "gpu0", "dst": "gpu1", "bandwidth": 1},
                       {"src": "gpu1", "dst": "gpu0", "bandwidth": 2}]},
            r"field 'links\[1\]' links 'gpu1' and 'gpu0' again \(links\[0\] already does",
        ),
        (
            {"links": [{"src": "gpu0", "dst": "gpu1", "bandwidth": 1, "directed": True},
                       {"src": "gpu0", "dst": "gpu1", "bandwidth": 2}]},
            r"'links\[1\]' links 'gpu0' and 'gpu1' again .*mult: k",
        ),
    ],
)  # fmt: skip
def test_from_dict_errors(patch, msg):
    with pytest.raises(ValueError, match=msg):
        Cluster.from_dict({**YAML_LIKE, **patch}, source="toy.yaml")


def test_from_dict_missing_key():
    with pytest.raises(ValueError, match="toy.yaml: field 'devices' is missing"):
        Cluster.from_dict({"name": "x"}, source="toy.yaml")


# ------------------------------------------------- routing properties
@settings(max_examples=40, deadline=None)
@given(
    n_dev=st.integers(2, 6),
    n_sw=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_random_switched_cluster_routes_are_valid_paths(n_dev, n_sw, seed):
    """Every device hangs off some switch, switches form a chain: each route is a
    connected path from a to b whose interior nodes are all switches, and
    transfer_time matches the hand formula."""
    rng = np.random.default_rng(seed)
    devs = tuple(dev(f"g{i}") for i in range(n_dev))
    links: list[Link] = []
    for i in range(n_dev):
        links += both(i, n_dev + int(rng.integers(n_sw)), float(rng.uniform(1e9, 1e11)), 1e-6)
    for j in range(n_sw - 1):
        links += both(n_dev + j, n_dev + j + 1, float(rng.uniform(1e9, 1e11)), 2e-6)
    for _ in range(int(rng.integers(0, 4))):  # some direct device-device links
        a, b = rng.choice(n_dev, 2, replace=False)
        links += both(int(a), int(b), float(rng.uniform(1e9, 1e11)), 0.5e-6)
    c = Cluster("rand", devs, tuple(links), tuple(f"s{j}" for j in range(n_sw)))
    for a in range(n_dev):
        for b in range(n_dev):
            r = c.route(a, b)
            if a == b:
                assert r == ()
                continue
            hops = [c.links[i] for i in r]
            assert hops[0].src == a and hops[-1].dst == b
            for x, y in zip(hops, hops[1:]):
                assert x.dst == y.src and x.dst >= n_dev  # interior nodes are switches
            nbytes = 1e7
            expect = sum(h.latency for h in hops) + nbytes / min(h.bandwidth for h in hops)
            assert c.transfer_time(a, b, nbytes) == pytest.approx(expect)


def test_hash_ignores_int_vs_float_figures():
    a = Cluster("a", (Device("g", "gpu", 10**12, 10**11, 2**30),), ())
    b = Cluster("b", (Device("g", "gpu", 1e12, 1e11, float(2**30)),), ())
    assert a.content_hash() == b.content_hash()
    assert isinstance(a.devices[0].memory, float)


def test_with_memory_fraction_scales_every_capacity() -> None:
    from graphs import clusters

    cl = clusters.load("dgx1_v100_8")
    half = cl.with_memory_fraction(0.5)
    assert np.allclose(half.memory, 0.5 * cl.memory)
    assert half.meta["memory_fraction"] == 0.5 and cl.meta.get("memory_fraction") is None
    assert np.array_equal(half.bandwidth_matrix(), cl.bandwidth_matrix())
    assert half.with_memory_fraction(0.5).meta["memory_fraction"] == 0.25
    assert cl.with_memory_fraction(1.0) is cl
    cpu = clusters.load("cpu_2")
    if not np.isfinite(cpu.memory).all():  # unbounded memories stay unbounded
        assert not np.isfinite(cpu.with_memory_fraction(0.5).memory).all()
    for bad in (0, -0.5, 1.5, float("nan"), True, "0.8"):
        with pytest.raises(ValueError, match="memory_fraction must be a number in \\(0, 1\\]"):
            cl.with_memory_fraction(bad)


def test_content_hash_covers_the_meta_entries_that_change_routes_and_costs() -> None:
    # g0 - g1 - g2 chained at 100 GB/s, each GPU also on a 1 GB/s switch: with
    # device_forwarding g0 -> g2 goes through g1 (10 ms per GB), without through the switch
    # (1 s). Until 29 Nov 2026 both had one hash, so a plan for one passed the other's check.
    def chain(forwarding: bool | None) -> Cluster:
        d = {
            "name": "fw",
            "devices": [
                {"name": f"g{i}", "kind": "gpu", "peak_flops": 1e12, "mem_bw": 1e11, "memory": 1e9}
                for i in range(3)
            ],  # fmt: skip
            "switches": ["host"],
            "links": [
                {"src": "g0", "dst": "g1", "bandwidth": 100e9},
                {"src": "g1", "dst": "g2", "bandwidth": 100e9},
                *({"src": f"g{i}", "dst": "host", "bandwidth": 1e9} for i in range(3)),
            ],  # fmt: skip
        }
        if forwarding is not None:
            d["meta"] = {"device_forwarding": forwarding}
        return Cluster.from_dict(d)

    plain, fwd = chain(None), chain(True)
    assert plain.transfer_time(0, 2, 1e9) == pytest.approx(1.0, rel=1e-3)
    assert fwd.transfer_time(0, 2, 1e9) == pytest.approx(0.01, rel=1e-3)
    assert plain.content_hash() != fwd.content_hash()
    assert chain(False).content_hash() != fwd.content_hash()
    # what does not change costs keeps the hash: a description, a one-node gpus_per_node
    desc = Cluster(plain.name, plain.devices, plain.links, plain.switches, {"description": "x"})
    assert desc.content_hash() == plain.content_hash()
    one = Cluster(plain.name, plain.devices, plain.links, plain.switches, {"gpus_per_node": 3})
    assert one.content_hash() == plain.content_hash()
    eff = Cluster(plain.name, plain.devices, plain.links, plain.switches, {"gemm_efficiency": 0.5})
    assert eff.content_hash() != plain.content_hash()
