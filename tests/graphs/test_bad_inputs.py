"""Bad-input table of the files the graphs package reads: graph JSON, cluster JSON and YAML,
plan JSON and Fiddle JSON.

Each row is one bad input a user could hand over, built from a valid file by one change
(or given as the file's raw bytes). Every row must be refused with one ``ValueError`` (any
other exception, or none, fails the test) whose message names the file, the field (its path
inside the file) and the value. ``test_every_kind_covers_every_class`` keeps the table
covering each class of bad input for each file kind.
"""

from __future__ import annotations

import copy
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from graphs import clusters
from graphs import io as gio
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import MAX_DEPTH, show

DATA = Path(__file__).resolve().parents[1] / "data"

#: Classes of bad input every file kind must cover.
CLASSES = (
    "wrong_type",  # true / 2.0 / "3" / a list where something else is meant
    "unknown_key",  # a typo that would silently fall back to a default
    "empty",  # no nodes, no devices, no placement
    "duplicate",  # a repeated name or id, or a key twice in one object
    "out_of_range",  # negative, too large, an index past the end, a self loop
    "huge_int",  # integers past int64 / float range
    "non_finite",  # NaN, Infinity, 1e400
    "non_object",  # the top level (or a part) is not an object
    "nesting",  # pathological nesting
    "binary",  # a pickle offered as a text file
    "missing",  # a required key left out
)
MISSING = object()


@dataclass(frozen=True)
class Bad:
    """One bad input: the file kind, its class, how to make it, and what the message names."""

    kind: str
    cls: str
    change: Callable[[Any], Any] | str | bytes  # edit of the valid dict, or raw file content
    field: str  # the field the message must name ('line N' for YAML aliases)
    value: Any  # the value the message must show (MISSING: 'missing')

    def __str__(self) -> str:
        return f"{self.kind}-{self.cls}-{self.field}"


class Raw(str):
    """A value written into the JSON text verbatim (``1e400``, ``NaN``)."""


# ------------------------------------------------------------------ path edits
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parts(path: str) -> list[str | int]:
    return [k if k else int(i) for k, i in _TOKEN.findall(path)]


def put(path: str, value: Any) -> Callable[[Any], Any]:
    def change(d: Any) -> Any:
        *head, last = _parts(path)
        node = d
        for p in head:
            node = node[p]
        node[last] = value
        return d

    return change


def drop(path: str) -> Callable[[Any], Any]:
    def change(d: Any) -> Any:
        *head, last = _parts(path)
        node = d
        for p in head:
            node = node[p]
        del node[last]
        return d

    return change


def whole(value: Any) -> Callable[[Any], Any]:
    return lambda d: value


def nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def deep_path(prefix: str, prefix_depth: int) -> tuple[str, Any]:
    """The path and value at which a list nested under ``prefix`` passes MAX_DEPTH."""
    k = MAX_DEPTH - prefix_depth
    return prefix + "[0]" * k, nested(MAX_DEPTH + 8 - k)


def row(kind: str, cls: str, path: str, value: Any) -> Bad:
    """The common row: set ``path`` to ``value``; the message names both."""
    shown = float(value) if isinstance(value, Raw) else value
    return Bad(kind, cls, put(path, value), path, shown)


# ------------------------------------------------------------------ valid files
def diamond() -> CompGraph:
    return CompGraph.build(
        4,
        [(0, 1), (0, 2), (1, 3), (2, 3)],
        flops=[1e9, 2e9, 3e9, 4e9],
        out_bytes=1e6,
        param_bytes=[1e6, 0, 0, 1e6],
        name=["a", "b", "c", "d"],
        times={"v100": [1.0, np.nan, np.inf, 2.0]},
        edge_time=[0.5, np.nan, 1.0, 2.0],
        meta={"name": "diamond"},
    )


YAML_CLUSTER = {
    "name": "toy",
    "description": "two GPUs on one host",
    "device_types": {"g": {"kind": "gpu", "peak_flops": "1e12", "mem_bw": 1e11, "memory": 16e9}},
    "devices": [{"name": "gpu0", "type": "g"}, {"name": "gpu1", "type": "g", "efficiency": 0.5}],
    "switches": ["host"],
    "link_types": {"pcie": {"bandwidth": 12e9, "latency": 2e-6}},
    "links": [
        {"src": "gpu0", "dst": "host", "type": "pcie"},
        {"src": "gpu1", "dst": "host", "type": "pcie"},
    ],
    "meta": {"owner": "tests"},
}


def valid(kind: str) -> Any:
    if kind == "graph":
        return gio.to_dict(diamond())
    cluster = Cluster.from_dict(YAML_CLUSTER)
    if kind == "cluster_yaml":
        return copy.deepcopy(YAML_CLUSTER)
    if kind == "cluster_json":
        return gio.cluster_to_dict(cluster)
    if kind == "plan":
        plan = Plan.for_graph(
            [0, 1, 1, 0],
            diamond(),
            cluster,
            stage=np.array([0, 1, 1, 0]),
            stage_device=(0, 1),
            microbatches=4,
            tp_degree={0: 2},
            meta={"algorithm": "test", "step_time": 1e-3},
        )
        return plan.to_dict()
    if kind == "fiddle":
        return json.loads((DATA / "fiddle_tiny_training.json").read_text())
    raise AssertionError(kind)


SUFFIX = {"cluster_yaml": ".yaml"}


def read(kind: str, path: Path) -> Any:
    if kind == "graph":
        return gio.load(path)
    if kind == "cluster_json":
        return gio.load_cluster(path)
    if kind == "cluster_yaml":
        return clusters.from_file(path)
    if kind == "plan":
        return Plan.load(path)
    if kind == "fiddle":
        return gio.read_fiddle(path)
    raise AssertionError(kind)


def write(kind: str, content: Any, path: Path) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str) and not isinstance(content, Raw):
        path.write_text(content)
    elif kind == "cluster_yaml":
        path.write_text(yaml.safe_dump(content, sort_keys=False))
    else:
        raws: dict[str, str] = {}

        def enc(o: Any) -> Any:
            if isinstance(o, Raw):
                key = f"@@raw{len(raws)}@@"
                raws[key] = str(o)
                return key
            if isinstance(o, dict):
                return {k: enc(v) for k, v in o.items()}
            if isinstance(o, list):
                return [enc(v) for v in o]
            return o

        text = json.dumps(enc(content))  # NaN / Infinity written as Python does
        for key, raw in raws.items():
            text = text.replace(f'"{key}"', raw)
        path.write_text(text)


PICKLE = pickle.dumps({"format": "devplace.graph", "nodes": np.zeros(3)})
DEEP_TEXT = "[" * 200_000 + "]" * 200_000


# ========================================================================== table
def _graph_rows() -> list[Bad]:
    k = "graph"
    dp, dv = deep_path("meta.deep", 2)
    empty = {"name": [], "module": []}
    empty |= {f: [] for f in ("flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes")}
    empty |= {f: [] for f in ("kind", "group", "layer")}

    def no_nodes(d: Any) -> Any:
        d.update(nodes=empty, edges={"src": [], "dst": [], "bytes": []}, times={})
        d.update(edge_time=None, num_nodes=0, num_edges=0)
        return d

    return [
        row(k, "wrong_type", "nodes.flops[1]", True),
        row(k, "wrong_type", "nodes.kind[0]", 1.0),
        row(k, "wrong_type", "nodes.group[2]", "3"),
        row(k, "wrong_type", "nodes.name[0]", 7),
        row(k, "wrong_type", "edges.src[0]", "0"),
        row(k, "wrong_type", "times.v100[0]", "slow"),
        row(k, "wrong_type", "edge_time[1]", False),
        row(k, "wrong_type", "version", True),
        row(k, "wrong_type", "num_nodes", 4.0),
        row(k, "wrong_type", "meta.bytes_per_param", True),
        row(k, "wrong_type", "meta.name", ["diamond"]),
        row(k, "out_of_range", "meta.bytes_per_param", 0),
        row(k, "out_of_range", "meta.batch", -4),  # accepted before
        row(k, "wrong_type", "meta.batch", "x"),
        row(k, "wrong_type", "meta.shared_params", "w"),
        row(k, "unknown_key", "nodez", {}),
        row(k, "unknown_key", "nodes.flop", [0, 0, 0, 0]),
        row(k, "unknown_key", "edges.byte", [1, 1, 1, 1]),
        Bad(k, "empty", no_nodes, "nodes.name", []),
        row(k, "duplicate", "nodes.name[1]", "a"),
        Bad(k, "duplicate", '{"format": "devplace.graph", "format": "x"}', "format", "x"),
        row(k, "out_of_range", "nodes.kind[0]", 3),
        row(k, "out_of_range", "nodes.layer[2]", -2),  # -1 means no layer; -2 was read
        row(k, "out_of_range", "nodes.flops[0]", -1.0),
        row(k, "out_of_range", "nodes.act_bytes[3]", -1e-9),
        row(k, "out_of_range", "edges.dst[0]", 9),
        row(k, "out_of_range", "edges.src[2]", -1),
        row(k, "out_of_range", "edges.dst[0]", 0),  # a self loop
        row(k, "out_of_range", "edges.bytes[1]", -5),
        row(k, "out_of_range", "times.v100[3]", -2.0),
        row(k, "out_of_range", "num_nodes", 5),
        row(k, "out_of_range", "version", 2),
        row(k, "out_of_range", "format", "devplace.plan"),
        row(k, "huge_int", "nodes.group[0]", 2**70),
        row(k, "huge_int", "nodes.layer[1]", -(2**64)),
        row(k, "huge_int", "edges.src[1]", 2**64),
        row(k, "huge_int", "nodes.flops[0]", 10**400),
        row(k, "non_finite", "nodes.flops[0]", float("nan")),
        row(k, "non_finite", "nodes.act_bytes[1]", float("inf")),
        row(k, "non_finite", "nodes.out_bytes[2]", Raw("1e400")),
        row(k, "non_finite", "times.v100[0]", float("-inf")),
        row(k, "non_finite", "edges.bytes[0]", float("nan")),
        row(k, "non_finite", "meta.t", float("nan")),
        Bad(k, "non_object", whole([1, 2]), "(top level)", [1, 2]),
        Bad(k, "non_object", "3", "(top level)", 3),
        row(k, "non_object", "nodes", "abc"),
        row(k, "non_object", "times", [1.0]),
        row(k, "non_object", "meta", [1]),
        Bad(k, "nesting", put("meta.deep", nested(MAX_DEPTH + 8)), dp, dv),
        Bad(k, "nesting", DEEP_TEXT, "(top level)", DEEP_TEXT[:40]),
        Bad(k, "binary", PICKLE, "(top level)", PICKLE[:24]),
        Bad(k, "missing", drop("edges.bytes"), "edges.bytes", MISSING),
        Bad(k, "missing", drop("nodes.kind"), "nodes.kind", MISSING),
        Bad(k, "missing", drop("format"), "format", None),
    ]


def _cluster_yaml_rows() -> list[Bad]:
    k = "cluster_yaml"
    dp, dv = deep_path("meta.deep", 2)
    dup = "name: a\ndevices: []\nname: b\n"
    alias = "name: a\nbase: &b {kind: gpu}\ndevices:\n  - *b\n"
    return [
        row(k, "wrong_type", "device_types.g.memory", True),
        row(k, "wrong_type", "devices[0].name", 5),
        row(k, "wrong_type", "links[0].directed", "yes"),
        Bad(k, "wrong_type", put("devices", ["gpu0", "gpu1"]), "devices[0]", "gpu0"),
        row(k, "wrong_type", "device_types.g.peak_flops", "fast"),
        row(k, "wrong_type", "device_types.g.kind", 3),
        row(k, "wrong_type", "switches[0]", ["host"]),
        row(k, "wrong_type", "meta.device_forwarding", "yes"),
        row(k, "wrong_type", "meta.overlap_grad_reduce", "no"),
        row(k, "wrong_type", "meta.gemm_efficiency", "high"),
        row(k, "out_of_range", "meta.gemm_efficiency", 1.5),
        row(k, "out_of_range", "meta.gpus_per_node", 0),
        row(k, "out_of_range", "meta.gpus_per_node", 5),  # not dividing the devices (fuzzing)
        row(k, "non_object", "meta", []),
        row(k, "unknown_key", "links[0].latnecy", 5),
        row(k, "unknown_key", "device_types.g.colour", "green"),
        row(k, "unknown_key", "link_types.pcie.bw", 1e9),
        row(k, "unknown_key", "nmae", "toy"),
        row(k, "empty", "devices", []),
        row(k, "empty", "name", ""),
        row(k, "duplicate", "devices[1].name", "gpu0"),
        row(k, "duplicate", "switches[0]", "gpu1"),
        Bad(k, "duplicate", dup, "name", "b"),
        row(k, "out_of_range", "device_types.g.efficiency", 1.5),
        row(k, "out_of_range", "device_types.g.memory", 0),
        row(k, "out_of_range", "links[0].latency", -1),
        row(k, "out_of_range", "links[0].dst", "gpu0"),  # a link to itself
        row(k, "out_of_range", "links[1].src", "gpu9"),
        row(k, "out_of_range", "devices[0].type", "h100"),
        row(k, "out_of_range", "links[0].mult", 0),
        Bad(k, "out_of_range", put("links", YAML_CLUSTER["links"][:1]), "links", "gpu1"),
        row(k, "huge_int", "device_types.g.memory", 2**1100),
        row(k, "huge_int", "links[0].mult", 10**400),
        row(k, "non_finite", "device_types.g.mem_bw", float("nan")),
        row(k, "non_finite", "device_types.g.peak_flops", "inf"),
        row(k, "non_finite", "device_types.g.memory", float("-inf")),
        row(k, "non_finite", "link_types.pcie.bandwidth", float("inf")),
        Bad(k, "non_object", whole(["just", "a list"]), "(top level)", ["just", "a list"]),
        row(k, "non_object", "device_types.g", "v100"),
        row(k, "non_object", "links[0]", "gpu0-host"),
        Bad(k, "nesting", put("meta.deep", nested(MAX_DEPTH + 8)), dp, dv),
        Bad(k, "nesting", alias, "line 4", "*b"),
        Bad(k, "binary", PICKLE, "(top level)", PICKLE[:24]),
        Bad(k, "missing", drop("devices[0].name"), "devices[0].name", MISSING),
        Bad(k, "missing", drop("device_types.g.mem_bw"), "devices[0].mem_bw", MISSING),
    ]


def _cluster_json_rows() -> list[Bad]:
    k = "cluster_json"
    dp, dv = deep_path("meta.deep", 2)
    return [
        row(k, "wrong_type", "meta.gpus_per_node", 8.0),
        row(k, "wrong_type", "meta.overlap_grad_reduce", 1),
        row(k, "out_of_range", "meta.gemm_efficiency", 0),
        row(k, "wrong_type", "devices[0].memory", True),
        row(k, "wrong_type", "devices[1].peak_flops", "fast"),
        row(k, "wrong_type", "links[0].bandwidth", [1]),
        row(k, "wrong_type", "version", 1.0),
        row(k, "wrong_type", "links[0].src", 0),
        row(k, "unknown_key", "links[0].latnecy", 5),
        row(k, "unknown_key", "devices[0].colour", 1),
        row(k, "unknown_key", "linkz", []),
        row(k, "empty", "devices", []),
        row(k, "duplicate", "devices[1].name", "gpu0"),
        Bad(k, "duplicate", '{"name": "a", "name": "b"}', "name", "b"),
        row(k, "out_of_range", "devices[0].efficiency", 0),
        row(k, "out_of_range", "links[0].src", "nowhere"),
        row(k, "out_of_range", "devices[1].launch_overhead", -1e-6),
        row(k, "out_of_range", "format", "devplace.graph"),
        row(k, "huge_int", "devices[0].memory", 10**400),
        row(k, "huge_int", "links[1].bandwidth", -(2**2000)),
        row(k, "non_finite", "devices[0].mem_bw", float("nan")),
        row(k, "non_finite", "devices[0].memory", float("inf")),
        row(k, "non_finite", "links[0].latency", Raw("1e999")),
        Bad(k, "non_object", '"a string"', "(top level)", "a string"),
        row(k, "non_object", "devices[0]", "gpu0"),
        Bad(k, "nesting", put("meta.deep", nested(MAX_DEPTH + 8)), dp, dv),
        Bad(k, "nesting", DEEP_TEXT, "(top level)", DEEP_TEXT[:40]),
        Bad(k, "binary", PICKLE, "(top level)", PICKLE[:24]),
        Bad(k, "missing", drop("name"), "name", MISSING),
        Bad(k, "missing", drop("links[0].dst"), "links[0].dst", MISSING),
    ]


def _plan_rows() -> list[Bad]:
    k = "plan"
    dp, dv = deep_path("meta.deep", 2)
    return [
        row(k, "wrong_type", "placement[2]", 0.9),
        row(k, "wrong_type", "placement[0]", True),
        row(k, "wrong_type", "placement[1]", "1"),
        row(k, "wrong_type", "microbatches", 2.5),
        row(k, "wrong_type", "microbatches", "8"),
        row(k, "wrong_type", "schedule", 3),
        row(k, "wrong_type", "tp_degree.0", "2"),
        row(k, "wrong_type", "graph_hash", 123),
        row(k, "wrong_type", "version", "1"),
        row(k, "wrong_type", "placement", 3),
        row(k, "wrong_type", "stage[0]", 0.0),
        row(k, "wrong_type", "layout", "2x4"),
        row(k, "unknown_key", "placment", [0, 0, 0, 0]),
        row(k, "unknown_key", "microbatch", 8),
        row(k, "empty", "placement", []),
        row(k, "empty", "graph_hash", ""),
        Bad(k, "duplicate", put("tp_degree", {"0": 2, "00": 4}), "tp_degree.00", "00"),
        Bad(k, "duplicate", '{"format": "devplace.plan", "format": 1}', "format", 1),
        row(k, "out_of_range", "placement[0]", -1),
        row(k, "out_of_range", "microbatches", 0),
        row(k, "out_of_range", "tp_degree.0", -4),
        row(k, "out_of_range", "schedule", "zigzag"),
        row(k, "out_of_range", "stage[1]", -1),
        row(k, "out_of_range", "stage[2]", 2),  # only 2 stages
        row(k, "out_of_range", "placement[1]", 0),  # not the device of its stage
        Bad(k, "missing", put("stage_device", None), "stage_device", None),
        # a plan without them ran as 1 microbatch, 1F1B, whatever it was planned for
        Bad(k, "missing", drop("microbatches"), "microbatches", MISSING),
        Bad(k, "missing", drop("schedule"), "schedule", MISSING),
        row(k, "out_of_range", "stage_device[0]", -2),
        row(k, "out_of_range", "version", 9),
        row(k, "huge_int", "placement[3]", 2**70),
        row(k, "huge_int", "stage_device[0]", 2**64),
        row(k, "huge_int", "microbatches", 10**30),
        row(k, "non_finite", "microbatches", float("nan")),
        row(k, "non_finite", "meta.step_time", float("inf")),
        row(k, "non_finite", "placement[0]", Raw("1e400")),
        Bad(k, "non_object", whole([0, 1, 1, 0]), "(top level)", [0, 1, 1, 0]),
        row(k, "non_object", "tp_degree", [2]),
        row(k, "non_object", "meta", "fast"),
        Bad(k, "nesting", put("meta.deep", nested(MAX_DEPTH + 8)), dp, dv),
        Bad(k, "nesting", DEEP_TEXT, "(top level)", DEEP_TEXT[:40]),
        Bad(k, "binary", PICKLE, "(top level)", PICKLE[:24]),
        Bad(k, "missing", drop("graph_hash"), "graph_hash", MISSING),
        Bad(k, "missing", drop("cluster_hash"), "cluster_hash", MISSING),
    ]


def _fiddle_rows() -> list[Bad]:
    k = "fiddle"
    return [
        row(k, "wrong_type", "maxFPGAs", True),
        row(k, "wrong_type", "maxCPUs", 2.0),
        Bad(k, "wrong_type", put("nodes[0].cpuLatency", "10"), "nodes[0] (id 1).cpuLatency", "10"),
        row(k, "wrong_type", "nodes[0].id", 1.0),
        Bad(
            k,
            "wrong_type",
            put("nodes[1].supportedOnFpga", 2),
            "nodes[1] (id 2).supportedOnFpga",
            2,
        ),
        row(k, "wrong_type", "edges[0].sourceId", "1"),
        Bad(k, "wrong_type", put("nodes[2].name", 3), "nodes[2] (id 3).name", 3),
        row(k, "unknown_key", "nodes[0].cpuLatncy", 10.0),
        row(k, "unknown_key", "maxGPUs", 2),
        row(k, "unknown_key", "edges[0].weight", 1.0),
        row(k, "empty", "nodes", []),
        row(k, "duplicate", "nodes[1].id", 1),
        Bad(k, "duplicate", '{"maxFPGAs": 1, "maxFPGAs": 2}', "maxFPGAs", 2),
        row(k, "out_of_range", "maxSizePerFPGA", 0),
        row(k, "out_of_range", "maxFPGAs", -1),
        row(k, "out_of_range", "edges[0].destId", 99),
        Bad(k, "out_of_range", put("nodes[0].fpgaLatency", -1), "nodes[0] (id 1).fpgaLatency", -1),
        row(k, "huge_int", "maxFPGAs", 2**70),
        Bad(k, "huge_int", put("nodes[0].size", 10**400), "nodes[0] (id 1).size", 10**400),
        row(k, "non_finite", "nodes[0].cpuLatency", float("nan")),
        row(k, "non_finite", "maxSizePerFPGA", Raw("1e400")),
        row(k, "non_finite", "edges[1].cost", float("inf")),
        Bad(k, "non_object", whole([]), "(top level)", []),
        row(k, "non_object", "nodes[0]", 5),
        row(k, "non_object", "edges", {"0": 1}),
        Bad(
            k,
            "nesting",
            put("nodes[0].name", nested(MAX_DEPTH + 8)),
            *deep_path("nodes[0].name", 3),
        ),
        Bad(k, "nesting", DEEP_TEXT, "(top level)", DEEP_TEXT[:40]),
        Bad(k, "binary", PICKLE, "(top level)", PICKLE[:24]),
        Bad(
            k,
            "missing",
            drop("nodes[0].isBackwardNode"),
            "nodes[0] (id 1).isBackwardNode",
            MISSING,
        ),
        Bad(k, "missing", drop("maxCPUs"), "maxCPUs", MISSING),
    ]


TABLE: list[Bad] = [
    b
    for b in (
        *_graph_rows(),
        *_cluster_yaml_rows(),
        *_cluster_json_rows(),
        *_plan_rows(),
        *_fiddle_rows(),
    )
    if b is not None
]
KINDS = ("graph", "cluster_yaml", "cluster_json", "plan", "fiddle")


@pytest.mark.parametrize("kind", KINDS)
def test_valid_files_load(tmp_path: Path, kind: str) -> None:
    """The file every row starts from is accepted: each refusal is the row's change."""
    path = tmp_path / f"ok{SUFFIX.get(kind, '.json')}"
    write(kind, valid(kind), path)
    read(kind, path)


@pytest.mark.parametrize("bad", TABLE, ids=str)
def test_bad_input_is_refused_naming_file_field_and_value(tmp_path: Path, bad: Bad) -> None:
    path = tmp_path / f"bad_{bad.kind}{SUFFIX.get(bad.kind, '.json')}"
    content = bad.change if isinstance(bad.change, (str, bytes)) else bad.change(valid(bad.kind))
    write(bad.kind, content, path)
    with pytest.raises(ValueError) as info:
        read(bad.kind, path)
    msg = str(info.value)
    assert str(path) in msg, msg
    field = bad.field if bad.field.startswith("line ") else repr(bad.field)
    assert field in msg, msg
    value = "missing" if bad.value is MISSING else show(bad.value)
    if bad.field.startswith("line "):
        value = bad.value
    assert value in msg, msg
    assert "Traceback" not in msg and "weights_only" not in msg


def test_every_kind_covers_every_class() -> None:
    have = {(b.kind, b.cls) for b in TABLE}
    missing = [(k, c) for k in KINDS for c in CLASSES if (k, c) not in have]
    assert not missing, missing
    counts = {k: sum(b.kind == k for b in TABLE) for k in KINDS}
    assert all(n >= 20 for n in counts.values()), counts


# ============================================================ cpu_N and its calibration
CALIBRATION = [
    ('{"device": {"peak_flops": true}}', "device.peak_flops", True),
    ('{"device": {"peak_flop": 1e9}}', "device.peak_flop", 1e9),
    ('{"device": {"mem_bw": NaN}}', "device.mem_bw", float("nan")),
    ('{"link": {"latency": -1}}', "link.latency", -1),
    # refused by Device / Link afterwards, naming neither the file nor the field (29 Nov 2026)
    ('{"device": {"memory": 0}}', "device.memory", 0),
    ('{"device": {"efficiency": 3}}', "device.efficiency", 3),
    ('{"device": {"peak_flops": 0}}', "device.peak_flops", 0),
    ('{"link": {"bandwidth": 0}}', "link.bandwidth", 0),
    ('{"link": [1]}', "link", [1]),
    ("[1, 2]", "(top level)", [1, 2]),
    ('{"concurrency": 3}', "concurrency", 3),
    # the sections' contents were only type-checked as objects (since 28 Nov 2026: by field)
    ('{"device": {"peak_flops": 1e9}, "concurrency": {"4": -1}}', "concurrency.4", -1),
    ('{"device": {"peak_flops": 1e9}, "concurrency": {"4": "x"}}', "concurrency.4", "x"),
    # one process is the reference: a hand-edited 0.3 slowed every single-process plan
    ('{"device": {"peak_flops": 1e9}, "concurrency": {"1": 0.3}}', "concurrency.1", 0.3),
    ('{"device": {"peak_flops": 1e9}, "runtime": {"4": {}}}', "runtime.4.factor", MISSING),
    (
        '{"device": {"peak_flops": 1e9}, "runtime": {"2": {"factor": 0, "transfer_overhead": 0}}}',
        "runtime.2.factor",
        0,
    ),
]


@pytest.mark.parametrize(("text", "field", "value"), CALIBRATION)
def test_bad_cpu_calibration_is_refused(tmp_path, text, field, value) -> None:
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        clusters.load(f"cpu_2@{path}")
    msg = str(info.value)
    shown = "missing" if value is MISSING else show(value)
    assert str(path) in msg and repr(field) in msg and shown in msg, msg


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        (
            '{"device": {"peak_flops": 1e9}, "concurrency": {"abc": 0.5}}',
            "concurrency",
            "has key 'abc'; expected a process count >= 1",
        ),
        (
            '{"device": {"peak_flops": 1e9}, "runtime": {"1": {}}}',
            "runtime",
            "has key '1'; expected a process count >= 2",
        ),
        ('{"devices": {"peak_flops": 1e9}}', "devices", "is not a calibration key"),  # a typo
        ('{"bad": 1}', "bad", "is not a calibration key"),
        ('{"segments": {}, "model": {}}', "model", "goes under the key 'hybrid'"),
        ("{}", "(top level)", "holds no figures"),
        ('{"measured": {"time": 1}}', "(top level)", "holds no figures"),
        # taken as absent until 2 Dec 2026 (fuzzing)
        ('{"device": null, "link": {"latency": 1e-5}}', "device", "expected an object"),
        ('{"device": {"peak_flops": 1e9}, "runtime": []}', "runtime", "expected an object"),
        ('{"device": {"peak_flops": 1e9}, "measured": "x"}', "measured", "expected an object"),
        ('{"device": {"peak_flops": 1e9}, "hybrid": {}}', "hybrid", "is empty; leave it out"),
        # a junk hybrid section was refused only when a planner built the model, unnamed
        ('{"hybrid": {"junk": 1}}', "hybrid.segments", "is missing: a hybrid calibration"),
        (
            '{"hybrid": {"segments": [], "collectives": {}, "speed": {}, "optimizer": {},'
            ' "memory": {}}}',
            "hybrid.segments",
            "expected an object",
        ),
        (
            '{"hybrid": {"segments": {}, "collectives": {}, "speed": {}, "optimizer": {},'
            ' "memory": {}, "model": {"config": {}}}}',
            "hybrid.model.name",
            "missing",
        ),
    ],
)
def test_calibration_keys_are_checked(tmp_path, text, field, says) -> None:
    """The calibration's top level holds only what runners.profile writes (and 'hybrid'):
    an unknown key used to be ignored, leaving the default figures in place without a word."""
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        clusters.load(f"cpu_2@{path}")
    msg = str(info.value)
    assert str(path) in msg and repr(field) in msg and says in msg, msg


@pytest.mark.parametrize("name", ["cpu_0", "cpu_100000000000000000000"])
def test_cpu_n_out_of_range_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"cluster '{name}': cpu_N needs N >= 1 and N <= 1024"):
        clusters.load(name)


@pytest.mark.parametrize("name", ["cpu_01", "cpu_00", "cpu_007@cal.json", "dgx_h100_x01"])
def test_cpu_n_with_leading_zeros_is_not_another_count(name: str) -> None:
    """Found by fuzzing: ``cpu_01`` loaded as ``cpu_1`` and ``dgx_h100_x01`` as one node,
    clusters of another name."""
    with pytest.raises(ValueError, match=f"unknown cluster '{name}'"):
        clusters.load(name)
    assert clusters.load("cpu_10").num_devices == 10


@pytest.mark.parametrize("name", ["missing.yaml", "conf/missing.json", "sub/dir/cl"])
def test_a_missing_cluster_file_is_named_as_a_file(tmp_path, name: str) -> None:
    """A path that is not there was "unknown cluster" with the preset list (fuzzing, 2 Dec
    2026)."""
    with pytest.raises(
        ValueError,
        match=f"clusters.load: {tmp_path / name}: no such cluster file; a preset name is one of",
    ):
        clusters.load(str(tmp_path / name))
    with pytest.raises(ValueError, match="unknown cluster 'dgx9'"):  # a name stays a name
        clusters.load("dgx9")


def test_whole_and_number_predicates() -> None:
    """``graphs.schema.is_whole`` / ``is_number``: the one test of an option's type outside
    a file (booleans are never numbers; numpy scalars are)."""
    import numpy as np

    from graphs.schema import is_number, is_whole

    assert is_whole(3) and is_whole(np.int64(3), 1) and not is_whole(0, 1)
    assert not is_whole(True) and not is_whole(2.0) and is_whole(2.0, floats=True)
    assert not is_whole(2.5, floats=True) and not is_whole(float("inf"), floats=True)
    assert not is_whole("3") and not is_whole(None)
    assert is_number(0.5) and is_number(np.float32(1.0), 0) and is_number(0, 0)
    assert not is_number(0, 0, lo_open=True) and not is_number(-1, 0)
    assert not is_number(True) and not is_number(float("nan")) and not is_number(float("inf"))
    assert not is_number("1")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", [None, 5, 2.5, True, b"plan.json", ["plan.json"]])
def test_a_value_that_is_no_path_is_refused_naming_it(kind: str, value: Any) -> None:
    """Every file reader refuses a value that is not a path with a ``TypeError`` that names
    the value and its type (``Path(None)`` said only "expected str, bytes or os.PathLike").
    ``True`` is refused although ``open(True)`` would read file descriptor 1."""
    with pytest.raises(TypeError) as info:
        read(kind, value)  # type: ignore[arg-type]
    msg = str(info.value)
    assert show(value) in msg and type(value).__name__ in msg and "file path" in msg, msg


def test_writers_refuse_a_value_that_is_no_path() -> None:
    g = CompGraph.build(2, [(0, 1)], flops=1.0, out_bytes=8.0)
    plan = Plan.for_graph(np.zeros(2, dtype=np.int64), g, clusters.load("cpu_2"))
    for write_one, what in ((plan.save, "Plan.save: path"), (lambda p: gio.save(g, p), "path")):
        with pytest.raises(TypeError, match=f"{what} is None"):
            write_one(None)


@pytest.mark.parametrize("value", [None, 8, True])
def test_clusters_load_refuses_a_value_that_is_no_name(value: Any) -> None:
    with pytest.raises(TypeError, match=r"clusters.load: name is .*preset name or a file path"):
        clusters.load(value)


def test_clusters_load_takes_a_path_object_as_a_name_or_a_file(tmp_path: Path) -> None:
    assert clusters.load(Path("dgx1_v100_8")).num_devices == 8
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(clusters.load("dgx1_v100_8").to_dict()))
    assert clusters.load(path).num_devices == 8


@pytest.mark.parametrize(
    "scale, says",
    [  # found by fuzzing, 29 Nov 2026: TypeErrors, or loaded wrongly without a word
        (5, "field 'scale_out' is 5; expected a mapping"),
        ("fabricnic", "field 'scale_out' is 'fabricnic'; expected a mapping"),
        ({"fabric": "ib", "nic": 5}, "field 'scale_out.nic' is 5; expected a link mapping"),
        ({"fabric": None, "nic": {"bandwidth": 1e9}}, "field 'scale_out.fabric' is None"),
        ({"fabric": 7, "nic": {"bandwidth": 1e9}}, "field 'scale_out.fabric' is 7"),
        ({"fabric": "ib", "nic": {"bandwidth": 1e9}, "nicc": 1}, "unknown key(s) ['nicc']"),
        ({"fabric": "ib", "nic": {"src": "gpu0", "bandwidth": 1e9}}, "'scale_out.nic.src' is set"),
        ({"fabric": "ib"}, "scale_out is missing 'nic'"),
    ],
)
def test_a_bad_scale_out_section_is_refused_at_any_node_count(tmp_path: Path, scale, says) -> None:
    d = yaml.safe_load((clusters.preset_dir() / "dgx_a100_80g.yaml").read_text())
    d["scale_out"] = scale
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(d))
    for nodes in (1, 2):  # with one node it was not read at all
        with pytest.raises(ValueError, match=re.escape(says)) as err:
            clusters.load(str(f), nodes=nodes)
        assert str(f) in str(err.value)
    d["scale_out"] = {"fabric": "ib", "nic": {"bandwidth": 25e9, "latency": 5e-6}}
    f.write_text(yaml.safe_dump(d))
    assert clusters.load(str(f), nodes=2).num_devices == 16


def test_a_link_whose_bandwidth_times_mult_overflows_is_named(tmp_path: Path) -> None:
    dev = {"kind": "gpu", "peak_flops": 1e12, "mem_bw": 1e11, "memory": 1e9}
    for bw, mult, prod in ((1e200, 1e200, "inf"), (1e-200, 1e-200, "0.0")):
        f = tmp_path / "c.yaml"
        f.write_text(yaml.safe_dump({
            "name": "t", "devices": [dict(dev, name="g0"), dict(dev, name="g1")],
            "links": [{"src": "g0", "dst": "g1", "bandwidth": bw, "mult": mult}],
        }))  # fmt: skip
        with pytest.raises(ValueError, match=re.escape("field 'links[0]' has bandwidth")) as err:
            clusters.load(str(f))
        assert str(f) in str(err.value) and f"= {prod} bytes/s" in str(err.value)
