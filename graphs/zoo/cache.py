"""On-disk cache of built graphs: one ``.npz`` per key, no pickle, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from graphs.compgraph import CompGraph
from graphs.schema import umask_mode

_ARRAYS = (
    "flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes",
    "kind", "group", "layer", "src", "dst", "edge_bytes",
)  # fmt: skip


def cache_dir() -> Path:
    """``$DEVPLACE_CACHE`` if set, else ``~/.cache/devplace/graphs``."""
    env = os.environ.get("DEVPLACE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "devplace" / "graphs"


def cache_key(**parts: Any) -> str:
    """Stable 20-hex-char key of JSON-able ``parts`` (sorted keys)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def save_npz(graph: CompGraph, path: Path) -> None:
    """Write ``graph`` to ``path`` atomically (temp file + rename), without pickle."""
    arrays: dict[str, np.ndarray] = {k: np.asarray(getattr(graph, k)) for k in _ARRAYS}
    arrays["name"] = np.array(graph.name, dtype=np.str_)
    arrays["module"] = np.array(graph.module, dtype=np.str_)
    for k, t in graph.times.items():
        arrays[f"times:{k}"] = np.asarray(t)
    if graph.edge_time is not None:
        arrays["edge_time"] = np.asarray(graph.edge_time)
    arrays["meta"] = np.array(json.dumps(dict(graph.meta)), dtype=np.str_)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())  # mkstemp makes 0600 files: give the cache the usual mode
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_npz(path: Path) -> CompGraph:
    """Read a graph written by :func:`save_npz` (``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as z:
        fields: dict[str, Any] = {k: z[k].copy() for k in _ARRAYS}
        fields["name"] = tuple(str(s) for s in z["name"])
        fields["module"] = tuple(str(s) for s in z["module"])
        fields["times"] = {k[6:]: z[k].copy() for k in z.files if k.startswith("times:")}
        fields["edge_time"] = z["edge_time"].copy() if "edge_time" in z.files else None
        fields["meta"] = json.loads(str(z["meta"]))
    return CompGraph(**fields)
