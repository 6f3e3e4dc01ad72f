"""``cpu_N``: N worker processes on this machine's CPU, for the runtime (calibratable)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from graphs.cluster import Cluster, Device, Link

#: Uncalibrated defaults for one CPU process (overridden by ``runners.profile`` output).
DEFAULT_CPU = {
    "peak_flops": 50e9,
    "mem_bw": 10e9,
    "efficiency": 1.0,
    "launch_overhead": 10e-6,
    "memory": 4 * 2**30,
}
DEFAULT_LINK = {"bandwidth": 2e9, "latency": 50e-6}


def calibration_path() -> Path:
    """Where ``python -m runners.profile`` writes the calibration (``$DEVPLACE_CPU_CALIBRATION`` overrides)."""
    env = os.environ.get("DEVPLACE_CPU_CALIBRATION")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "devplace" / "cpu_calibration.json"


def cpu_cluster(n: int, calibration: dict | None = None) -> Cluster:
    """N CPU processes joined all-to-all by loopback links.

    Device and link figures come from ``calibration`` (keys ``device`` and
    ``link``), else from the calibration file if present, else from defaults.
    """
    if n < 1:
        raise ValueError(f"cpu_N needs N >= 1, got {n}")
    cal = calibration
    if cal is None and calibration_path().exists():
        cal = json.loads(calibration_path().read_text())
    dev = dict(DEFAULT_CPU, **((cal or {}).get("device") or {}))
    link = dict(DEFAULT_LINK, **((cal or {}).get("link") or {}))
    devices = tuple(Device(name=f"cpu{i}", kind="cpu", **dev) for i in range(n))
    links = tuple(
        Link(a, b, float(link["bandwidth"]), float(link["latency"]), "loopback")
        for a in range(n)
        for b in range(n)
        if a != b
    )
    meta = {"description": f"{n} CPU processes on this machine", "calibrated": cal is not None}
    return Cluster(f"cpu_{n}", devices, links, (), meta)
