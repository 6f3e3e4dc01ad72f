"""Cluster presets: YAML files under ``conf/cluster/`` plus generated ``cpu_N``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from graphs.cluster import Cluster

_CPU_RE = re.compile(r"^cpu_(\d+)(?:@(.+))?$")


def preset_dir() -> Path:
    """Folder holding the cluster YAML presets (``$DEVPLACE_CLUSTER_DIR`` overrides)."""
    env = os.environ.get("DEVPLACE_CLUSTER_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "conf" / "cluster"


def names() -> list[str]:
    """Names of the available presets (``cpu_N`` stands for any N >= 1, ``cpu_N@PATH`` calibrated)."""
    found = sorted(p.stem for p in preset_dir().glob("*.yaml"))
    return sorted(set(found) | {"cpu_N", "cpu_N@CALIBRATION.json"})


def load(name: str, *, nodes: int = 1) -> Cluster:
    """Load a preset by name (``dgx1_v100_8``, ``dgx_a100_80g``, ``cpu_4``, ...) or a YAML/JSON
    file path.

    ``cpu_N`` is N CPU processes with the documented default figures on every machine;
    ``cpu_N@PATH`` takes its figures from the calibration file ``PATH`` written by
    ``python -m runners.profile`` (see :func:`graphs.cpu_cluster.cpu_cluster`).

    ``nodes=N`` joins ``N`` copies of a one-node preset that has a ``scale_out`` section
    (``dgx_a100_80g``, ``dgx_h100``): every GPU gets its own NIC link to one fabric
    switch, device ``k * G + i`` is GPU ``i`` of node ``k`` (``G`` GPUs per node), and
    ``meta`` records ``gpus_per_node`` and ``nodes``.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"clusters.load: nodes must be an integer >= 1, got {nodes!r}")
    m = _CPU_RE.match(name)
    if m:
        if nodes != 1:
            raise ValueError(f"clusters.load: {name!r} has no multi-node form (nodes={nodes})")
        from graphs.cpu_cluster import cpu_cluster

        return cpu_cluster(int(m.group(1)), calibration=m.group(2))
    p = Path(name)
    if p.suffix in (".yaml", ".yml", ".json") and p.exists():
        return from_file(p, nodes=nodes)
    f = preset_dir() / f"{name}.yaml"
    if not f.exists():
        raise ValueError(f"unknown cluster {name!r}; available: {names()}")
    return from_file(f, nodes=nodes)


def from_file(path: str | Path, *, nodes: int = 1) -> Cluster:
    """Read a cluster from a YAML or JSON file (the :meth:`Cluster.from_dict` form, plus an
    optional ``scale_out`` section used when ``nodes > 1``; see :func:`load`)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML/JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    scale = data.pop("scale_out", None)
    if nodes != 1 or scale is not None:
        data = _scaled(data, scale, nodes, str(path))
    return Cluster.from_dict(data, source=str(path))


def _scaled(data: dict, scale: dict | None, nodes: int, source: str) -> dict:
    """The dict form of ``nodes`` copies of a one-node cluster joined per ``scale_out``."""
    if scale is None:
        raise ValueError(
            f"{source}: cluster {data.get('name')!r} has no scale_out section, so it has no "
            f"multi-node form (asked for nodes={nodes})"
        )
    for key in ("fabric", "nic"):
        if key not in scale:
            raise ValueError(f"{source}: scale_out is missing {key!r}")
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
