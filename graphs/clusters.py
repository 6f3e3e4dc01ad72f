"""Cluster presets: YAML files under ``conf/cluster/`` plus generated ``cpu_N``."""

from __future__ import annotations

import os
import re
from pathlib import Path

from graphs.cluster import Cluster

_CPU_RE = re.compile(r"^cpu_(\d+)(?:@(.+))?$")
#: Most processes ``cpu_N`` may have (its links are all-to-all: N * (N - 1)).
MAX_CPU_PROCESSES = 1024


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


def load(name: str) -> Cluster:
    """Load a preset by name (``dgx1_v100_8``, ``cpu_4``, ...) or a YAML/JSON file path.

    ``cpu_N`` is N CPU processes with the documented default figures on every machine;
    ``cpu_N@PATH`` takes its figures from the calibration file ``PATH`` written by
    ``python -m runners.profile`` (see :func:`graphs.cpu_cluster.cpu_cluster`).
    """
    m = _CPU_RE.match(name)
    if m:
        from graphs.cpu_cluster import cpu_cluster

        n = int(m.group(1))
        if not 1 <= n <= MAX_CPU_PROCESSES:
            raise ValueError(
                f"cluster {name!r}: cpu_N needs N >= 1 and N <= {MAX_CPU_PROCESSES}, got {n}"
            )
        return cpu_cluster(n, calibration=m.group(2))
    p = Path(name)
    if p.suffix in (".yaml", ".yml", ".json") and p.exists():
        return from_file(p)
    f = preset_dir() / f"{name}.yaml"
    if not f.exists():
        raise ValueError(f"unknown cluster {name!r}; available: {names()}")
    return from_file(f)


def from_file(path: str | Path) -> Cluster:
    """Read a cluster from a YAML or JSON file (the :meth:`Cluster.from_dict` form)."""
    from graphs.schema import read_yaml

    return Cluster.from_dict(read_yaml(path), source=str(path))
