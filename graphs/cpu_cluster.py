"""``cpu_N``: N worker processes on this machine's CPU, for the runtime (calibratable)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphs.cluster import DEVICE_FIGURES, Cluster, Device, Link
from graphs.schema import Fields, read_json

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
    """Where ``python -m runners.profile`` writes the calibration unless told ``calibration=PATH``.

    Nothing reads this file implicitly: a cluster uses it only when named, as
    ``cpu_N@PATH`` (:func:`graphs.clusters.load`) or ``cpu_cluster(n, calibration=PATH)``.
    """
    return Path.home() / ".cache" / "devplace" / "cpu_calibration.json"


#: The top-level keys of a calibration file (what ``runners.profile`` writes, plus ``hybrid``).
CALIBRATION_KEYS = ("device", "link", "measured", "concurrency", "runtime", "hybrid")
#: What a ``hybrid`` section must hold for ``CpuHybridModel`` (each an object).
HYBRID_CALIBRATION_KEYS = ("segments", "collectives", "speed", "optimizer", "memory")


def load_calibration(path: str | Path) -> dict[str, Any]:
    """The calibration JSON at ``path`` (``~`` expanded), read strictly: its ``device`` and
    ``link`` figures build the cluster, so a wrong type, an unknown figure, a negative or
    non-finite value is a ``ValueError`` naming the file, the field and the value."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(
            f"cpu_N calibration {str(path)!r}: no such file; write one with "
            f"`python -m runners.profile calibration={path}`"
        )
    f = Fields(p)
    cal = dict(f.obj(read_json(p), "", free=True))
    unknown = sorted(set(cal) - set(CALIBRATION_KEYS))
    if unknown:  # a typo ("devices") would leave the defaults in place without a word
        hint = (
            "; a hybrid calibration (runtime.hybrid_profile.calibrate_hybrid, e.g. "
            "scripts/fidelity_hybrid.py's *.calibration.json) goes under the key 'hybrid'"
            if set(unknown) & {"segments", "collectives", "runtime_probes"}
            else ""
        )
        raise f.fail(
            unknown[0], f"is not a calibration key; expected one of {list(CALIBRATION_KEYS)}{hint}"
        )
    # a section that is there must be an object: "device": null, "runtime": [] and
    # "measured": "x" were taken as absent, "hybrid": {} as no hybrid calibration (fuzzing)
    for k in CALIBRATION_KEYS:
        if k in cal:
            f.obj(cal[k], k, free=True)
    if "hybrid" in cal and not cal["hybrid"]:
        raise f.fail(
            "hybrid", "is empty; leave it out, or write a hybrid calibration there "
            f"({list(HYBRID_CALIBRATION_KEYS)}: python -m runners.profile hybrid.model=...)",
        )  # fmt: skip
    dev = f.obj(cal.get("device") or {}, "device", optional=DEVICE_FIGURES)
    positive = ("peak_flops", "mem_bw", "memory", "efficiency")  # as Device requires
    for k, v in dev.items():
        f.number(
            v, f"device.{k}", lo=0, lo_open=k in positive, hi=1 if k == "efficiency" else None,
            allow_inf=k == "memory",
        )  # fmt: skip
    link = f.obj(cal.get("link") or {}, "link", optional=("bandwidth", "latency"))
    for k, v in link.items():  # a bandwidth of 0 was refused later by Link, naming no file
        f.number(v, f"link.{k}", lo=0, lo_open=k == "bandwidth")
    hy = cal.get("hybrid") or {}
    if hy:  # refused here, naming the file, not when a planner first builds the model from it
        check_hybrid_calibration(hy, f, "hybrid")

    for key, v in (cal.get("concurrency") or {}).items():  # per-process speed with k at once
        _count(f, key, "concurrency", 1)
        f.number(v, f"concurrency.{key}", lo=0, lo_open=True)
        if key == "1" and float(v) != 1.0:  # the reference: one process relative to itself
            raise f.error("concurrency.1", v, "1 (the factors are relative to one process)")
    for key, v in (cal.get("runtime") or {}).items():  # the runtime's fit with k processes
        _count(f, key, "runtime", 2)
        fit = f.obj(v, f"runtime.{key}", required=("factor", "transfer_overhead"), free=True)
        f.number(fit["factor"], f"runtime.{key}.factor", lo=0, lo_open=True)
        f.number(fit["transfer_overhead"], f"runtime.{key}.transfer_overhead", lo=0)
    if not set(cal) & {"device", "link", "hybrid"}:
        raise f.fail("(top level)", "holds no figures: expected 'device', 'link' or 'hybrid'")
    return cal


def _count(f: Fields, key: str, path: str, lo: int) -> None:
    """A process count written as an object key (``"4"``), ``>= lo``."""
    if not (key.isdigit() and not key.startswith("0") and int(key) >= lo):
        raise f.fail(path, f"has key {key!r}; expected a process count >= {lo} (e.g. '4')")


def check_hybrid_calibration(
    hy: Any, f: Fields, path: str = "hybrid", layers: int | None = None
) -> Mapping[str, Any]:
    """A ``hybrid`` calibration section (:func:`runtime.hybrid_profile.calibrate_hybrid`'s
    output), checked field by field where the calibrated CPU model reads it: the sections of
    :data:`HYBRID_CALIBRATION_KEYS`; per ``segments.<tp>.segments.<b>/<recompute>`` the
    ``fwd`` / ``bwd`` seconds and ``kept`` / ``params`` bytes, one of each per segment
    (embeddings, each block, head), all ``>= 0`` (with ``layers``, exactly ``layers + 2`` of
    them); ``speed`` per process count ``> 0``; ``optimizer.adam_cpu_per_param`` and the
    collectives' fitted ``latency`` / ``per_byte`` ``>= 0``; ``memory.process`` and
    ``memory.worker_base`` ``>= 0`` (``build_extra`` and ``step_residue`` are differences of
    measurements, any sign). Negative times, a speed of 0 or too few segments used to be
    taken (step times below the uncalibrated model's, negative memory) or to crash the model
    later with ``IndexError`` / ``ZeroDivisionError``."""
    from graphs.layout import RECOMPUTE

    hy = f.obj(hy, path, free=True)
    for k in HYBRID_CALIBRATION_KEYS:
        if k not in hy:
            raise f.fail(
                f"{path}.{k}",
                f"is missing: a hybrid calibration holds {list(HYBRID_CALIBRATION_KEYS)} "
                "(python -m runners.profile hybrid.model=...)",
            )
        f.obj(hy[k], f"{path}.{k}", free=True)
    if "model" in hy:
        f.obj(hy["model"], f"{path}.model", required=("name",), free=True)
    for tp, by_tp in hy["segments"].items():
        where = f"{path}.segments.{tp}"
        _count(f, tp, f"{path}.segments", 1)
        entries = f.obj(f.obj(by_tp, where, required=("segments",), free=True)["segments"],
                        f"{where}.segments", free=True)  # fmt: skip
        for key, entry in entries.items():
            at = f"{where}.segments.{key}"
            b, _, rc = key.partition("/")
            if not (b.isdigit() and int(b) >= 1 and rc in RECOMPUTE):
                raise f.fail(at, f"is not a 'microbatch size/recompute' key (e.g. '1/none'; "
                                 f"recompute among {list(RECOMPUTE)})")  # fmt: skip
            e = f.obj(entry, at, required=("fwd", "bwd", "kept", "params"), free=True)
            n = None
            for fig in ("fwd", "bwd", "kept", "params"):
                vals = e[fig].tolist() if hasattr(e[fig], "tolist") else e[fig]
                if not isinstance(vals, (list, tuple)) or len(vals) < 3:
                    raise f.error(f"{at}.{fig}", vals, "a list of at least 3 figures (embeddings, "
                                  "blocks, head)")  # fmt: skip
                for i, x in enumerate(vals):
                    f.number(x, f"{at}.{fig}[{i}]", lo=0)
                if n is not None and len(vals) != n:
                    raise f.fail(f"{at}.{fig}", f"has {len(vals)} figures where fwd has {n}")
                n = len(vals)
            if layers is not None and n != layers + 2:
                raise f.fail(
                    f"{at}.fwd",
                    f"has {n} segment figures; this model has {layers} blocks, so {layers + 2} "
                    "(embeddings, each block, head): calibrate this model "
                    "(python -m runners.profile hybrid.model=...)",
                )
    for k, v in hy["speed"].items():
        _count(f, k, f"{path}.speed", 1)
        f.number(v, f"{path}.speed.{k}", lo=0, lo_open=True)
    opt = f.obj(hy["optimizer"], f"{path}.optimizer", required=("adam_cpu_per_param",), free=True)
    f.number(opt["adam_cpu_per_param"], f"{path}.optimizer.adam_cpu_per_param", lo=0)
    mem = hy["memory"]
    for k, lo in (
        ("process", 0),
        ("worker_base", 0),
        ("build_extra", None),
        ("step_residue", None),
    ):
        if k in mem:
            f.number(mem[k], f"{path}.memory.{k}", lo=lo)
    if "worker_base" not in mem and not {"process", "build_extra"} <= set(mem):
        raise f.fail(f"{path}.memory", "needs 'worker_base' (or 'process' and 'build_extra')")
    for k, by_name in hy["collectives"].items():
        _count(f, k, f"{path}.collectives", 2)
        for name, fits in f.obj(by_name, f"{path}.collectives.{k}", free=True).items():
            for kind in ("cpu", "wall"):
                at = f"{path}.collectives.{k}.{name}.{kind}"
                fit = f.obj(f.obj(fits, f"{path}.collectives.{k}.{name}", free=True).get(kind),
                            at, required=("latency", "per_byte"), free=True)  # fmt: skip
                f.number(fit["latency"], f"{at}.latency", lo=0)
                f.number(fit["per_byte"], f"{at}.per_byte", lo=0)
    return hy


def calibration_digest(calibration: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex chars) of a calibration's JSON form: which figures a cluster used."""
    text = json.dumps(calibration, sort_keys=True, default=_jsonable)  # arrays as lists
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _jsonable(x: Any) -> Any:
    return x.tolist() if hasattr(x, "tolist") else str(x)


def runtime_fit(calibration: dict | None, processes: int) -> dict | None:
    """The runtime-measured fit for ``processes`` processes, if the calibration has one.

    ``calibration["runtime"]`` (``str(k) -> {"factor", "transfer_overhead", ...}``) is
    written by ``python -m runners.profile runtime.model=...`` from
    ``runtime.profile.measure_runtime_slowdown``: how much slower the runtime's
    compute runs with k processes at once, and the compute time one transfer costs.
    One process has no fit (the one-process figures are the reference).
    """
    fits = (calibration or {}).get("runtime") or {}
    return fits.get(str(int(processes))) if processes >= 2 else None


def concurrency_factor(calibration: dict | None, processes: int) -> float:
    """Per-process speed with ``processes`` processes computing at once, relative to one alone.

    From the runtime's own fit (:func:`runtime_fit`, ``1 / factor``) when the
    calibration has one for this count, else from ``calibration["concurrency"]``
    (``str(k) -> factor``, written by ``runtime.profile.measure_concurrent_speed``);
    1.0 when neither is there. A count beyond the measured ones uses the largest
    measured count's total throughput shared among ``processes``. Factors are
    capped at 1.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    fit = runtime_fit(calibration, processes)
    if fit is not None and float(fit["factor"]) > 0:
        return min(1.0, 1.0 / float(fit["factor"]))
    conc = {int(k): float(v) for k, v in ((calibration or {}).get("concurrency") or {}).items()}
    if not conc:
        return 1.0
    if processes in conc:
        return min(1.0, conc[processes])  # above 1 is measurement noise: sharing never speeds up
    k = max(conc)
    return min(1.0, conc[k] * k / processes) if processes > k else 1.0


def cpu_cluster(
    n: int, calibration: Mapping[str, Any] | str | Path | None = None, processes: int | None = None
) -> Cluster:
    """N CPU processes joined all-to-all by loopback links.

    Device and link figures come from ``calibration`` (a dict with keys ``device`` and
    ``link``, or the path of a ``python -m runners.profile`` JSON file), over the
    documented defaults (:data:`DEFAULT_CPU`, :data:`DEFAULT_LINK`). Without one the
    defaults are used on every machine: no file is read implicitly, so a plan's cluster
    hash does not depend on whose home folder it runs from. A file's cluster is named
    ``cpu_N@PATH`` (what :func:`graphs.clusters.load` reads back), and ``meta`` records
    what was used: ``calibrated``, ``calibration`` (``"defaults"``, ``"inline"`` or the
    path) and ``calibration_sha256`` (:func:`calibration_digest`).
    With ``processes`` (how many processes run at once, e.g. the devices a plan
    uses) and a calibration holding ``concurrency`` factors, each device's
    ``peak_flops`` and ``mem_bw`` are multiplied and its ``launch_overhead`` divided
    by :func:`concurrency_factor`: processes that time-share cores run slower.
    A calibrated ``device.transfer_overhead`` (per-transfer CPU cost, see
    ``runtime.profile.measure_transfer_overhead``) is divided by it too, unless the
    calibration has the runtime's own fit for that many processes (:func:`runtime_fit`),
    whose fitted ``transfer_overhead`` is used as it is.
    A calibration's ``hybrid`` section (``runtime.hybrid_profile.calibrate_hybrid``) goes
    to ``meta["hybrid_calibration"]``: the simulator then scores hybrid plans with the
    calibrated ``CpuHybridModel`` (meta is not part of the cluster's content hash, so plans
    made on the uncalibrated ``cpu_N`` stay valid).
    """
    if n < 1:
        raise ValueError(f"cpu_N needs N >= 1, got {n}")
    name, source = f"cpu_{n}", "defaults"
    if isinstance(calibration, (str, Path)):
        source = str(calibration)
        name = f"cpu_{n}@{source}"
        cal: Mapping[str, Any] | None = load_calibration(calibration)
    else:
        cal = calibration or None
        if cal is not None:
            source = "inline"
    dev = dict(DEFAULT_CPU, **((cal or {}).get("device") or {}))
    if processes is not None:
        f = concurrency_factor(cal, processes)
        dev["peak_flops"] *= f
        dev["mem_bw"] *= f
        dev["launch_overhead"] /= f
        fit = runtime_fit(cal, processes)
        if fit is not None:
            dev["transfer_overhead"] = float(fit["transfer_overhead"])
        elif "transfer_overhead" in dev:
            dev["transfer_overhead"] /= f
    link = dict(DEFAULT_LINK, **((cal or {}).get("link") or {}))
    devices = tuple(Device(name=f"cpu{i}", kind="cpu", **dev) for i in range(n))
    links = tuple(
        Link(a, b, float(link["bandwidth"]), float(link["latency"]), "loopback")
        for a in range(n)
        for b in range(n)
        if a != b
    )
    meta: dict[str, Any] = {
        "description": f"{n} CPU processes on this machine",
        "calibrated": cal is not None,
        "calibration": source,
    }
    if cal is not None:
        meta["calibration_sha256"] = calibration_digest(cal)
        if (cal or {}).get("hybrid"):
            meta["hybrid_calibration"] = cal["hybrid"]
    if processes is not None:
        meta["processes"] = int(processes)
    return Cluster(name, devices, links, (), meta)
