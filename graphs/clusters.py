"""Cluster presets: YAML files under ``conf/cluster/`` plus generated ``cpu_N``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from graphs.cluster import Cluster
from graphs.schema import check_path, is_whole

_CPU_RE = re.compile(r"^cpu_([1-9]\d*|0)(?:@(.+))?$")  # "cpu_01" was taken as cpu_1
_NODES_RE = re.compile(r"^(.+)_x([1-9]\d*|0)$")  # "_x01" was taken as 1 node
#: Most processes ``cpu_N`` may have (its links are all-to-all: N * (N - 1)).
MAX_CPU_PROCESSES = 1024


def preset_dir() -> Path:
    """Folder holding the cluster YAML presets (``$DEVPLACE_CLUSTER_DIR`` overrides)."""
    env = os.environ.get("DEVPLACE_CLUSTER_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "conf" / "cluster"


def names() -> list[str]:
    """Names of the available presets (``cpu_N`` stands for any N >= 1, ``cpu_N@PATH`` calibrated;
    see :func:`exists` for the ``NAME_xN`` multi-node names)."""
    found = sorted(p.stem for p in preset_dir().glob("*.yaml"))
    return sorted(set(found) | {"cpu_N", "cpu_N@CALIBRATION.json"})


def exists(name: str) -> bool:
    """Whether :func:`load` knows ``name``: a preset, ``cpu_N`` or ``NAME_xN`` of a preset."""
    if (preset_dir() / f"{name}.yaml").exists() or _CPU_RE.match(name):
        return True
    m = _NODES_RE.match(name)
    return bool(m) and (preset_dir() / f"{m.group(1)}.yaml").exists()


#: Most nodes ``load(NAME, nodes=N)`` builds (4,096 DGX nodes: 32,768 GPUs, about 4 s and
#: 110 MB here; the issue's largest plan space is 6,144 GPUs).
MAX_NODES = 4096


def load(name: str, *, nodes: int = 1) -> Cluster:
    """Load a preset by name (``dgx1_v100_8``, ``dgx_a100_80g``, ``cpu_4``, ...) or a YAML/JSON
    file path.

    ``cpu_N`` is N CPU processes with the documented default figures on every machine;
    ``cpu_N@PATH`` takes its figures from the calibration file ``PATH`` written by
    ``python -m runners.profile`` (see :func:`graphs.cpu_cluster.cpu_cluster`).

    ``nodes=N`` joins ``N`` copies of a one-node preset that has a ``scale_out`` section
    (``dgx_a100_80g``, ``dgx_h100``): every GPU gets its own NIC link to one fabric
    switch, device ``k * G + i`` is GPU ``i`` of node ``k`` (``G`` GPUs per node), and
    ``meta`` records ``gpus_per_node`` and ``nodes``. ``"NAME_xN"`` (the name such a
    cluster gets, e.g. ``"dgx_a100_80g_x128"``) is the same as ``load("NAME", nodes=N)``.

    ``cpu_N`` is N CPU processes with the documented default figures on every machine;
    ``cpu_N@PATH`` takes its figures from the calibration file ``PATH`` written by
    ``python -m runners.profile`` (see :func:`graphs.cpu_cluster.cpu_cluster`).
    """
    if not is_whole(nodes, 1):  # numpy integers too (a grid's np.int64: refused before)
        raise ValueError(f"clusters.load: nodes must be an integer >= 1, got {nodes!r}")
    nodes = int(nodes)
    if nodes > MAX_NODES:  # 100,000 nodes took minutes, 10**9 filled the memory
        raise ValueError(
            f"clusters.load: nodes must be at most {MAX_NODES:,} (32,768 GPUs of 8-GPU nodes "
            f"load in about 4 s), got {nodes:,}"
        )
    p = check_path(name, "clusters.load: name", "a preset name or a file path")
    if p.suffix in (".yaml", ".yml", ".json") and p.exists():
        return from_file(p, nodes=nodes)
    name = os.fspath(name)
    m = _CPU_RE.match(name)
    if m:
        if nodes != 1:
            raise ValueError(f"clusters.load: {name!r} has no multi-node form (nodes={nodes})")
        from graphs.cpu_cluster import cpu_cluster

        n = int(m.group(1))
        if not 1 <= n <= MAX_CPU_PROCESSES:
            raise ValueError(
                f"cluster {name!r}: cpu_N needs N >= 1 and N <= {MAX_CPU_PROCESSES}, got {n}"
            )
        return cpu_cluster(n, calibration=m.group(2))
    f = preset_dir() / f"{name}.yaml"
    m = _NODES_RE.match(name)
    if not f.exists() and m and (preset_dir() / f"{m.group(1)}.yaml").exists():
        if nodes != 1:
            raise ValueError(f"clusters.load: {name!r} already names its node count")
        return load(m.group(1), nodes=int(m.group(2)))
    if not f.exists():
        if "@" not in name and (p.suffix in (".yaml", ".yml", ".json") or os.sep in name):
            # a file path that is not there was "unknown cluster" with the preset list
            raise ValueError(
                f"clusters.load: {name}: no such cluster file; a preset name is one of {names()}"
            )
        raise ValueError(f"unknown cluster {name!r}; available: {names()}")
    return from_file(f, nodes=nodes)


def from_file(path: str | Path, *, nodes: int = 1) -> Cluster:
    """Read a cluster from a YAML or JSON file (the :meth:`Cluster.from_dict` form, plus an
    optional ``scale_out`` section used when ``nodes > 1``; see :func:`load`)."""
    from graphs.schema import read_yaml

    data = read_yaml(path)  # strict: names the file, field and value of a bad one
    if not isinstance(data, dict):
        return Cluster.from_dict(data, source=str(path))  # refused there, naming the top level
    scale = data.pop("scale_out", None)
    if nodes != 1 or scale is not None:
        data = _scaled(data, scale, nodes, str(path))
    return Cluster.from_dict(data, source=str(path))


def _check_scale_out(scale: Any, source: str) -> None:
    """``scale_out`` is ``{fabric: NAME, nic: {bandwidth: ..., latency: ..., ...}}``: the
    fabric switch's name and the link every GPU gets to it. Until 29 Nov 2026 other shapes
    failed with ``TypeError`` s (``scale_out: 5``, ``nic: 5``), or loaded wrongly
    (``fabric: null`` made a switch named 'None', an unknown key was ignored, ``nic.src``
    was overwritten), and with one node nothing was checked (found by fuzzing)."""
    if not isinstance(scale, dict):
        raise ValueError(
            f"{source}: field 'scale_out' is {scale!r}; expected a mapping "
            "{fabric: SWITCH_NAME, nic: {bandwidth: ..., latency: ...}}"
        )
    extra = sorted(set(map(str, scale)) - {"fabric", "nic"})
    if extra:
        raise ValueError(
            f"{source}: field 'scale_out' has unknown key(s) {extra}; valid keys: ['fabric', 'nic']"
        )
    for key in ("fabric", "nic"):
        if key not in scale:
            raise ValueError(f"{source}: scale_out is missing {key!r}")
    fabric = scale["fabric"]
    if not isinstance(fabric, str) or not fabric.strip():
        raise ValueError(
            f"{source}: field 'scale_out.fabric' is {fabric!r}; expected the fabric switch's name"
        )
    nic = scale["nic"]
    if not isinstance(nic, dict):
        raise ValueError(
            f"{source}: field 'scale_out.nic' is {nic!r}; expected a link mapping "
            "{bandwidth: BYTES_PER_S, latency: SECONDS, ...}"
        )
    for key in ("src", "dst"):
        if key in nic:
            raise ValueError(
                f"{source}: field 'scale_out.nic.{key}' is set ({nic[key]!r}); the NIC link "
                "runs from every GPU to the fabric, so it takes no src or dst"
            )


def _scaled(data: dict, scale: dict | None, nodes: int, source: str) -> dict:
    """The dict form of ``nodes`` copies of a one-node cluster joined per ``scale_out``."""
    if scale is None:
        raise ValueError(
            f"{source}: cluster {data.get('name')!r} has no scale_out section, so it has no "
            f"multi-node form (asked for nodes={nodes})"
        )
    _check_scale_out(scale, source)
    devs = list(data["devices"])
    G = len(devs)
    sw = [str(x) for x in data.get("switches", ()) or ()]
    out = dict(data)
    out["meta"] = dict(data.get("meta") or {}, gpus_per_node=G, nodes=nodes)
    if nodes == 1:
        return out
    out["name"] = f"{data['name']}_x{nodes}"
    dname = [str(d["name"]) for d in devs]

    def rename(x: str, k: int) -> str:
        if x in dname:
            return f"{x.rstrip('0123456789')}{k * G + dname.index(x)}"
        return f"{x}{k}"

    out["devices"] = [dict(d, name=rename(str(d["name"]), k)) for k in range(nodes) for d in devs]
    out["switches"] = [rename(x, k) for k in range(nodes) for x in sw] + [str(scale["fabric"])]
    links = [
        dict(ln, src=rename(str(ln["src"]), k), dst=rename(str(ln["dst"]), k))
        for k in range(nodes)
        for ln in data.get("links", ()) or ()
    ]
    nic = dict(scale["nic"])
    links += [dict(nic, src=d["name"], dst=str(scale["fabric"])) for d in out["devices"]]
    out["links"] = links
    return out
