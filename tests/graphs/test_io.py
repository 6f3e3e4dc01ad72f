"""Tests of graphs.io: the devplace JSON graph/cluster format and the Fiddle importer."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import clusters, io
from graphs.compgraph import BWD, FWD, CompGraph

DATA = Path(__file__).resolve().parent.parent / "data"


def diamond() -> CompGraph:
    """The graph stored in tests/data/diamond.graph.json."""
    return CompGraph.build(
        4,
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        flops=[1e9, 2e9, 3e9, 4e9],
        bytes_accessed=[10.0, 20.0, 30.0, 40.0],
        out_bytes=[100.0, 200.0, 300.0, 400.0],
        param_bytes=[16.0, 0.0, 32.0, 0.0],
        act_bytes=[5.0, 6.0, 7.0, 8.0],
        kind=["fwd", "fwd", "bwd", "opt"],
        group=[0, 0, 1, 1],
        layer=[0, 0, 1, -1],
        name=["a", "b", "c", "d"],
        module=["m.a", "m.b", "m.c", ""],
        times={"v100": [1.5, np.nan, np.inf, 0.25]},
        edge_time=[np.nan, 0.5, 1.0, np.nan],
        meta={
            "name": "diamond",
            "batch": 2,
            "bytes_per_param": 16,
            "members": [["a"], ["b"], ["c"], ["d"]],
        },
    )


# ============================================================ graph format
def test_fixture_file_matches(tmp_path):
    """The checked-in file pins the on-disk format: it must keep loading to the same graph."""
    g = io.load(DATA / "diamond.graph.json")
    assert g.content_hash() == diamond().content_hash()
    assert g.module == ("m.a", "m.b", "m.c", "")
    assert g.meta["members"] == [["a"], ["b"], ["c"], ["d"]]
    d = json.loads((DATA / "diamond.graph.json").read_text())
    assert d["times"]["v100"] == [1.5, None, "inf", 0.25]
    assert d["edge_time"] == [None, 0.5, 1.0, None]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip_exact(tmp_path, suffix):
    g = diamond()
    f = tmp_path / f"g{suffix}"
    io.save(g, f)
    back = io.load(f)
    assert back.content_hash() == g.content_hash()
    assert back.kind.dtype == np.int8 and back.module == g.module
    assert np.isnan(back.times["v100"][1]) and np.isinf(back.times["v100"][2])
    assert dict(back.meta) == {**g.meta}
    if suffix.endswith(".gz"):
        assert json.loads(gzip.decompress(f.read_bytes()))["format"] == "devplace.graph"


def test_round_trip_awkward_floats(tmp_path):
    vals = [0.1, 1 / 3, 1e-300, 2.0**60 + 1.0, 123456789.123456789]
    g = CompGraph.build(5, [(0, 1)], flops=vals, act_bytes=vals[::-1])
    back = io.from_dict(json.loads(json.dumps(io.to_dict(g))))
    np.testing.assert_array_equal(back.flops, g.flops)
    assert back.content_hash() == g.content_hash()


def test_meta_numpy_values_written_plainly():
    g = CompGraph.build(1, meta={"batch": np.int64(8), "x": np.arange(2), "t": (1, 2)})
    d = io.to_dict(g)
    assert d["meta"] == {"batch": 8, "x": [0, 1], "t": [1, 2]}
    json.dumps(d, allow_nan=False)


def test_meta_not_jsonable_refused():
    with pytest.raises(ValueError, match=r"meta.obj has type object"):
        io.to_dict(CompGraph.build(1, meta={"obj": object()}))
    with pytest.raises(ValueError, match=r"meta.t=nan cannot be written"):
        io.to_dict(CompGraph.build(1, meta={"t": float("nan")}))


def write(tmp_path, obj, text: str | None = None) -> Path:
    f = tmp_path / "bad.json"
    f.write_text(text if text is not None else json.dumps(obj))
    return f


def mutate(fn):
    d = io.to_dict(diamond())
    fn(d)
    return d


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda d: d.pop("nodes"), r"field 'nodes' is missing"),
        (
            lambda d: d["nodes"].pop("flops"),
            r"field 'nodes.flops' is missing",
        ),
        (
            lambda d: d["nodes"].__setitem__("flops", "many"),
            r"'nodes.flops' is 'many'; expected a list of finite non-negative numbers",
        ),
        (lambda d: d["nodes"]["flops"].pop(), r"'nodes.flops' has length 3, expected 4"),
        (
            lambda d: d["nodes"]["act_bytes"].__setitem__(2, "7"),
            r"'nodes.act_bytes\[2\]' is '7'; expected a finite number",
        ),
        (lambda d: d["nodes"]["flops"].__setitem__(0, True), r"'nodes.flops\[0\]' is True"),
        (
            lambda d: d["nodes"]["kind"].__setitem__(1, 5),
            r"'nodes.kind\[1\]' is 5; expected an integer in \[0, 2\]",
        ),
        (
            lambda d: d["nodes"]["group"].__setitem__(1, 1.5),
            r"'nodes.group\[1\]' is 1.5; expected an integer",
        ),
        (
            lambda d: d["nodes"]["name"].__setitem__(0, 3),
            r"'nodes.name\[0\]' is 3; expected a non-empty string",
        ),
        (
            lambda d: d.__setitem__("num_nodes", 5),
            r"'num_nodes' is 5; expected 4, the length of 'nodes.name'",
        ),
        (lambda d: d["edges"]["dst"].pop(), r"'edges.dst' has length 3, expected 4"),
        (lambda d: d["edges"].pop("bytes"), r"'edges.bytes' is missing"),
        (lambda d: d.__setitem__("edges", []), r"field 'edges' is \[\]; expected an object"),
        (lambda d: d["times"]["v100"].__setitem__(0, "fast"), r"'times.v100\[0\]' is 'fast'"),
        (lambda d: d["times"]["v100"].pop(), r"'times.v100' has length 3, expected 4"),
        (lambda d: d.__setitem__("edge_time", [1.0]), r"'edge_time' has length 1, expected 4"),
        (lambda d: d.__setitem__("meta", [1]), r"'meta' is \[1\]; expected an object"),
        (
            lambda d: d.__setitem__("version", 2),
            r"field 'version' is 2; this reader supports version 1",
        ),
        (
            lambda d: d.__setitem__("format", "devplace.plan"),
            r"field 'format' is 'devplace.plan'; expected 'devplace.graph'",
        ),
        # structurally fine but CompGraph refuses it: the message still names the file and the node/edge
        (
            lambda d: d["nodes"]["flops"].__setitem__(1, -1.0),
            r"'nodes.flops\[1\]' is -1.0; expected a finite number >= 0",
        ),
        (
            lambda d: d["edges"]["dst"].__setitem__(0, 9),
            r"'edges.dst\[0\]' is 9; expected an integer in \[0, 3\]",
        ),
        (lambda d: d["edges"].update(src=[0, 0, 1, 3], dst=[1, 2, 3, 1]), r"cycle through node"),
    ],
)
def test_load_errors_name_file_and_field(tmp_path, change, msg):
    f = write(tmp_path, mutate(change))
    with pytest.raises(ValueError, match=msg) as info:
        io.load(f)
    assert str(f) in str(info.value)


def test_load_not_json(tmp_path):
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON"):
        io.load(write(tmp_path, None, "{'single': quotes}"))
    with pytest.raises(ValueError, match="field 'format' is nan; expected a finite number"):
        io.load(write(tmp_path, None, '{"format": NaN}'))
    with pytest.raises(ValueError, match=r"field '\(top level\)' is \[1, 2\]; expected an object"):
        io.load(write(tmp_path, [1, 2]))
    with pytest.raises(ValueError, match="cannot read file"):
        io.load(tmp_path / "missing.json")
    gz = tmp_path / "x.json.gz"
    gz.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a valid gzip file"):
        io.load(gz)


def test_optional_module_and_times(tmp_path):
    d = io.to_dict(diamond())
    del d["nodes"]["module"], d["times"], d["edge_time"], d["meta"]
    g = io.load(write(tmp_path, d))
    assert g.module == ("",) * 4 and g.times == {} and g.edge_time is None


@st.composite
def graphs_(draw):
    n = draw(st.integers(1, 12))  # a graph file holds at least one node
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=20)) if pairs else []
    fl = st.floats(0, 1e15, allow_nan=False)
    t = st.one_of(st.floats(0, 1e6), st.just(math.inf), st.just(math.nan))
    return CompGraph.build(
        n,
        edges,
        flops=draw(st.lists(fl, min_size=n, max_size=n)),
        act_bytes=draw(st.lists(fl, min_size=n, max_size=n)),
        kind=draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
        group=draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)),
        times={"gpu": draw(st.lists(t, min_size=n, max_size=n))} if draw(st.booleans()) else None,
        edge_time=draw(
            st.lists(
                st.one_of(st.floats(0, 10), st.just(math.nan)),
                min_size=len(edges),
                max_size=len(edges),
            )
        )
        if draw(st.booleans())
        else None,
    )


@settings(max_examples=60, deadline=None)
@given(graphs_())
def test_round_trip_property(g):
    back = io.from_dict(json.loads(json.dumps(io.to_dict(g), allow_nan=False)))
    assert back.content_hash() == g.content_hash()
    assert back.name == g.name


# ============================================================ cluster files
@pytest.mark.parametrize("name", ["dgx1_v100_8", "h100_2x8", "cpu_2"])
def test_cluster_round_trip(tmp_path, name):
    c = clusters.load(name)
    f = tmp_path / "c.json"
    io.save_cluster(c, f)
    back = io.load_cluster(f)
    assert back.content_hash() == c.content_hash() and back.name == c.name
    assert [back.route(0, b) for b in range(c.num_devices)] == [
        c.route(0, b) for b in range(c.num_devices)
    ]


def test_cluster_unbounded_memory_written_as_string(tmp_path):
    _, c = io.read_fiddle(DATA / "fiddle_tiny_inference.json")
    f = tmp_path / "c.json"
    io.save_cluster(c, f)
    d = json.loads(f.read_text())  # strict JSON: no Infinity literal
    assert d["format"] == "devplace.cluster" and d["devices"][2]["memory"] == "inf"
    assert io.load_cluster(f).memory[2] == math.inf


def test_cluster_load_errors(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"format": "devplace.graph"}))
    with pytest.raises(
        ValueError, match="field 'format' is 'devplace.graph'; expected 'devplace.cluster'"
    ):
        io.load_cluster(f)
    f.write_text(json.dumps({"name": "x", "devices": {"a": 1}}))
    with pytest.raises(ValueError, match="field 'devices' is {'a': 1}; expected a list of devices"):
        io.load_cluster(f)
    f.write_text(
        json.dumps(
            {"name": "x", "devices": [{"name": "a", "kind": "k", "peak_flops": 1, "mem_bw": 1}]}
        )
    )
    with pytest.raises(ValueError, match=r"field 'devices\[0\].memory' is missing"):
        io.load_cluster(f)
    f.write_text(
        json.dumps(
            {
                "name": "x",
                "devices": [{"name": "a", "kind": "k", "peak_flops": 1, "mem_bw": 1, "memory": 1}],
                "links": [{"dst": "a"}],
            }
        )
    )
    with pytest.raises(ValueError, match=r"field 'links\[0\].src' is missing"):
        io.load_cluster(f)


# ============================================================ Fiddle importer
def test_fiddle_inference_mapping():
    g, c = io.read_fiddle(DATA / "fiddle_tiny_inference.json")
    assert g.name == ("10", "11", "12", "13")
    assert (g.kind == FWD).all()
    np.testing.assert_array_equal(
        g.times["fpga"], [1.0, 2.0, math.inf, 0.5]
    )  # 12 not supported on FPGA
    np.testing.assert_array_equal(g.times["cpu"], [4.0, 8.0, 3.0, 2.5])
    np.testing.assert_array_equal(g.param_bytes, [10.0, 60.0, 0.0, 30.0])  # missing size -> 0
    # 11 and 12 share colorClass 7; 10 and 13 have none: own groups
    assert g.group[1] == g.group[2] and len({g.group[0], g.group[1], g.group[3]}) == 3
    assert [(g.name[s], g.name[t]) for s, t in zip(g.src, g.dst)] == [
        ("10", "11"),
        ("10", "12"),
        ("11", "13"),
        ("12", "13"),
    ]
    np.testing.assert_array_equal(g.edge_time, [0.5, 0.5, 0.25, 0.125])
    assert (g.edge_bytes == 0).all() and (g.flops == 0).all() and (g.bytes_accessed == 0).all()
    assert dict(g.meta) == {
        "name": "fiddle_tiny_inference",
        "format": "fiddle",
        "bytes_per_param": 1,
    }
    assert g.num_params == 100.0
    assert [d.name for d in c.devices] == ["fpga0", "fpga1", "cpu0"]
    assert c.kinds == ("fpga", "fpga", "cpu")
    np.testing.assert_array_equal(c.memory, [100.0, 100.0, math.inf])
    assert all(len(c.route(a, b)) == 1 for a in range(3) for b in range(3) if a != b)


def test_fiddle_training_mapping():
    g, c = io.read_fiddle(DATA / "fiddle_tiny_training.json")
    np.testing.assert_array_equal(g.kind, [FWD, FWD, FWD, BWD, BWD, BWD])
    # colour classes {1, 6}, {2, 5}, {3, 4}
    gi = {g.name[i]: int(g.group[i]) for i in range(6)}
    assert gi["1"] == gi["6"] and gi["2"] == gi["5"] and gi["3"] == gi["4"]
    assert len(set(gi.values())) == 3
    np.testing.assert_array_equal(g.edge_time, [0.1, 0.2, 0.3, 0.3, 0.2, 0.1, 0.2])
    np.testing.assert_array_equal(g.times["fpga"], [1.0, 2.0, 3.0, 6.0, 4.0, 2.0])
    assert g.param_bytes.sum() == 1200.0
    assert c.num_devices == 5 and c.kinds == ("fpga",) * 3 + ("cpu",) * 2
    assert g.topo_order.tolist() == [0, 1, 2, 3, 4, 5]


def fiddle_file(tmp_path, change) -> Path:
    d = json.loads((DATA / "fiddle_tiny_training.json").read_text())
    d = copy.deepcopy(d)
    change(d)
    f = tmp_path / "w.json"
    f.write_text(json.dumps(d))
    return f


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda d: d.pop("maxCPUs"), r"field 'maxCPUs' is missing"),
        (
            lambda d: d.__setitem__("maxFPGAs", 1.5),
            r"field 'maxFPGAs' is 1.5; expected an integer in \[0, 4096\]",
        ),
        (lambda d: d.update(maxFPGAs=0, maxCPUs=0), r"both 0; expected at least one device"),
        (
            lambda d: d.__setitem__("maxSizePerFPGA", 0),
            r"'maxSizePerFPGA' is 0; expected a finite number > 0",
        ),
        (lambda d: d.__setitem__("nodes", {}), r"field 'nodes' is {}; expected a list"),
        (lambda d: d["nodes"][2].pop("cpuLatency"), r"'nodes\[2\] \(id 3\).cpuLatency' is missing"),
        (
            lambda d: d["nodes"][2].__setitem__("fpgaLatency", -1.0),
            r"'nodes\[2\] \(id 3\).fpgaLatency' is -1.0",
        ),
        (
            lambda d: d["nodes"][0].__setitem__("supportedOnFpga", "False"),
            r"supportedOnFpga' is 'False'; expected true/false or 0/1",
        ),
        (lambda d: d["nodes"][0].__setitem__("isBackwardNode", 2), r"isBackwardNode' is 2"),
        (
            lambda d: d["nodes"][1].__setitem__("id", "2"),
            r"'nodes\[1\].id' is '2'; expected an integer",
        ),
        (
            lambda d: d["nodes"][1].__setitem__("id", 1),
            r"'nodes\[1\].id' 1 is used by nodes\[0\] too",
        ),
        (
            lambda d: d["nodes"][1].__setitem__("colorClass", "a"),
            r"colorClass' is 'a'; expected an integer",
        ),
        (
            lambda d: d["edges"][3].__setitem__("destId", 99),
            r"'edges\[3\].destId' is 99, which is not the id of any node",
        ),
        (lambda d: d["edges"][0].pop("sourceId"), r"'edges\[0\].sourceId' is None"),
        (
            lambda d: d["edges"][5].__setitem__("cost", 0.5),
            r"'edges\[5\].cost' is 0.5 but edges\[0\] out of the same node 1 costs 0.1",
        ),
        (lambda d: d["edges"][0].pop("cost"), r"'edges\[0\] \(1 -> 2\).cost' is missing"),
        (
            lambda d: d["edges"].append({"sourceId": 6, "destId": 1, "cost": 0.0}),
            r"cycle through node",
        ),
    ],
)
def test_fiddle_errors(tmp_path, change, msg):
    f = fiddle_file(tmp_path, change)
    with pytest.raises(ValueError, match=msg) as info:
        io.read_fiddle(f)
    assert str(f) in str(info.value)


def test_fiddle_cost_tolerance_as_reference(tmp_path):
    # within 1e-6 the reference code accepts two costs; each edge keeps its own exactly
    f = fiddle_file(tmp_path, lambda d: d["edges"][5].__setitem__("cost", 0.1 + 5e-7))
    g, _ = io.read_fiddle(f)
    assert g.edge_time[5] == 0.1 + 5e-7 and g.edge_time[0] == 0.1


def test_fiddle_not_json(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("maxFPGAs: 2")
    with pytest.raises(ValueError, match="x.json: not valid JSON"):
        io.read_fiddle(f)


@pytest.mark.parametrize(
    "change, names",
    [
        (lambda md: md.update(vocab="x"), ["ModelDims.vocab", "'x'"]),
        (lambda md: md.update(hidden=-64), ["ModelDims.hidden", "-64"]),
        (lambda md: md.update(tied="yes"), ["ModelDims.tied", "'yes'"]),
        (lambda md: md.update(heads=3), ["heads (3) must divide hidden (64)"]),
        (lambda md: md.update(n_layers=2), ["unknown field(s) ['n_layers']"]),
        (lambda md: md.pop("seq"), ["missing field(s) ['seq']"]),
        (lambda md: md.clear(), ["missing field(s) ['arch', 'hidden'"]),
    ],
)
def test_a_malformed_model_description_is_refused_at_load(tmp_path, change, names) -> None:
    """``meta.model_dims`` (what hybrid layouts read) is checked when the file is read, so a
    typo does not load and then crash the hybrid simulator (before: a ``TypeError``)."""
    from graphs import zoo

    d = io.to_dict(zoo.build("gpt", hidden=64, layers=2, heads=4, vocab=128, seq=16))
    change(d["meta"]["model_dims"])
    path = tmp_path / "g.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError) as info:
        io.load(path)
    msg = str(info.value)
    assert str(path) in msg and "'meta.model_dims'" in msg, msg
    for name in names:
        assert name in msg, msg


@pytest.mark.parametrize("value", [None, -1, [], "gpt"])
def test_model_dims_that_is_not_a_mapping_is_refused(tmp_path, value) -> None:
    from graphs import zoo

    d = io.to_dict(zoo.build("gpt", hidden=64, layers=2, heads=4, vocab=128, seq=16))
    d["meta"]["model_dims"] = value
    with pytest.raises(ValueError, match="must be a mapping of ModelDims fields"):
        io.from_dict(d, source="g.json")


def test_model_dims_of_a_graph_built_in_memory_names_the_problem() -> None:
    """Graphs made in memory skip the loader: ``model_dims`` itself refuses a malformed
    description or config with a ``ValueError`` naming the graph and the field."""
    from graphs import zoo
    from graphs.layout import model_dims

    g = zoo.build("gpt", hidden=64, layers=2, heads=4, vocab=128, seq=16)
    assert model_dims(g).vocab == 128
    object.__setattr__(g, "meta", {**g.meta, "model_dims": None})
    with pytest.raises(ValueError, match=r"graph 'gpt': meta.model_dims must be a mapping"):
        model_dims(g)
    object.__setattr__(g, "meta", {"name": "gpt2", "config": {"d_model": 64, "n_layer": "x"}})
    with pytest.raises(ValueError, match=r"meta.config .*n_layer = 'x' is not an integer"):
        model_dims(g)
    object.__setattr__(g, "meta", {"name": "gpt2", "config": {"d_model": 64, "n_layer": 2}})
    with pytest.raises(ValueError, match=r"meta.config .*KeyError: 'n_head'"):
        model_dims(g)
