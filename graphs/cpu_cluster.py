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


def concurrency_factor(calibration: dict | None, processes: int) -> float:
    """Per-process speed with ``processes`` processes computing at once, relative to one alone.

    Read from ``calibration["concurrency"]`` (``str(k) -> factor``, written by
    ``runtime.profile.measure_concurrent_speed``); 1.0 when absent. A count
    beyond the measured ones uses the largest measured count's total throughput
    shared among ``processes``. Factors are capped at 1.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    conc = {int(k): float(v) for k, v in ((calibration or {}).get("concurrency") or {}).items()}
    if not conc:
        return 1.0
    if processes in conc:
        return min(1.0, conc[processes])  # above 1 is measurement noise: sharing never speeds up
    k = max(conc)
    return min(1.0, conc[k] * k / processes) if processes > k else 1.0


def cpu_cluster(n: int, calibration: dict | None = None, processes: int | None = None) -> Cluster:
    """N CPU processes joined all-to-all by loopback links.

    Device and link figures come from ``calibration`` (keys ``device`` and
    ``link``), else from the calibration file if present, else from defaults.
    With ``processes`` (how many processes run at once, e.g. the devices a plan
    uses) and a calibration holding ``concurrency`` factors, each device's
    ``peak_flops`` and ``mem_bw`` are multiplied and its ``launch_overhead`` divided
    by :func:`concurrency_factor`: processes that time-share cores run slower.
    A calibrated ``device.transfer_overhead`` (per-transfer CPU cost, see
    ``runtime.profile.measure_transfer_overhead``) is divided by it too.
    """
    if n < 1:
        raise ValueError(f"cpu_N needs N >= 1, got {n}")
    cal = calibration
    if cal is None and calibration_path().exists():
        cal = json.loads(calibration_path().read_text())
    dev = dict(DEFAULT_CPU, **((cal or {}).get("device") or {}))
    if processes is not None:
        f = concurrency_factor(cal, processes)
        dev["peak_flops"] *= f
        dev["mem_bw"] *= f
        dev["launch_overhead"] /= f
        if "transfer_overhead" in dev:
            dev["transfer_overhead"] /= f
    link = dict(DEFAULT_LINK, **((cal or {}).get("link") or {}))
    devices = tuple(Device(name=f"cpu{i}", kind="cpu", **dev) for i in range(n))
    links = tuple(
        Link(a, b, float(link["bandwidth"]), float(link["latency"]), "loopback")
        for a in range(n)
        for b in range(n)
        if a != b
    )
    meta = {"description": f"{n} CPU processes on this machine", "calibrated": cal is not None}
    if processes is not None:
        meta["processes"] = int(processes)
    return Cluster(f"cpu_{n}", devices, links, (), meta)
