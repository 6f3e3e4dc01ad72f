"""``python -m runners.profile``: measure this machine and write a ``cpu_N`` calibration file (used as ``cpu_N@PATH``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from graphs.cpu_cluster import calibration_path
from graphs.schema import is_number, is_whole


def check_config(cfg: DictConfig) -> Path:
    """Refuse a bad setting before anything is measured (or the calibration file, which later
    runs read, is overwritten); return the calibration path. Each ``ValueError`` names the key."""

    def whole(key: str, value: object, lo: int) -> None:
        if not is_whole(value, lo):
            raise ValueError(f"profile: {key} = {value!r}; expected an integer >= {lo}")

    def items(key: str, value: object) -> list:
        """A list setting (null: empty); a scalar is refused by name (it used to end in a
        TypeError traceback)."""
        if value is None:
            return []
        if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
            return list(value)
        raise ValueError(f"profile: {key} = {value!r}; expected a list, e.g. [{value!r}]")

    from runners.common import check_model_meta

    for key, spec in (
        ("model", cfg.get("model")),
        ("runtime.model", (cfg.get("runtime") or {}).get("model")),
    ):
        if spec is not None:  # a model spec (it failed after minutes of measuring)
            if OmegaConf.is_config(spec):
                spec = OmegaConf.to_container(spec, resolve=True)
            check_model_meta(spec, "profile", key)
    whole("threads", cfg.threads, 1)
    whole("matmul_n", cfg.matmul_n, 16)
    whole("copy_mb", cfg.copy_mb, 1)
    whole("p2p_repeats", cfg.p2p_repeats, 1)
    for i, k in enumerate(items("concurrency", cfg.concurrency)):
        whole(f"concurrency[{i}]", k, 1)
    rt = cfg.get("runtime") or {}
    if rt.get("model") is not None:
        for k in ("microbatches", "rounds", "steps"):
            whole(f"runtime.{k}", rt.get(k), 1)
        for i, n in enumerate(items("runtime.devices", rt.get("devices"))):
            whole(f"runtime.devices[{i}]", n, 2)
        if not rt.get("devices"):
            raise ValueError("profile: runtime.devices is empty; expected process counts >= 2")
    hy = cfg.get("hybrid") or {}
    if hy.get("model") is not None:
        from runtime.hybrid_profile import (
            check_hybrid_settings,
            check_model_settings,
            check_probe_model,
        )

        lists = {
            k: items(f"hybrid.{k}", hy.get(k))
            for k in ("tps", "micro_sizes", "recomputes", "worlds", "probe_worlds")
        }
        try:
            check_hybrid_settings(
                **lists, repeats=hy.get("repeats"), probe_steps=hy.get("probe_steps"),
                probe_launches=hy.get("probe_launches"),
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"profile: hybrid.{exc}") from None
        model = hy.model
        if OmegaConf.is_config(model):
            model = OmegaConf.to_container(model, resolve=True)
        if not isinstance(model, dict) or "name" not in model:
            raise ValueError(
                f"profile: hybrid.model = {model!r}; expected {{name: gpt2, config: {{...}}}}"
            )
        try:
            graph, batch = check_probe_model(model, [int(k) for k in lists["probe_worlds"]])
            check_model_settings(
                model, graph, batch, tps=lists["tps"], micro_sizes=lists["micro_sizes"]
            )
        except ValueError as exc:
            raise ValueError(f"profile: hybrid.model: {exc}") from None
    mem = cfg.memory_gib
    if not is_number(mem, 0, lo_open=True):
        raise ValueError(f"profile: memory_gib = {mem!r}; expected a finite number > 0")
    path = Path(cfg.calibration).expanduser() if cfg.calibration else calibration_path()
    parent = next((q for q in (path.parent, *path.parent.parents) if q.exists()), None)
    if (
        path.is_dir()
        or parent is None
        or not parent.is_dir()  # a file on the way: measured, then FileExistsError
        or not os.access(parent, os.W_OK)
        or (path.parent.is_dir() and not _can_create_in(path.parent))  # e.g. /proc as root
    ):
        raise ValueError(
            f"profile: calibration = {str(path)!r} cannot be written (a folder, or no writable "
            "folder to create it in)"
        )
    for key, spec in (("model", cfg.get("model")), ("runtime.model", rt.get("model"))):
        if spec is not None:  # an unknown model or config key failed after the measuring,
            check_model_builds(spec, key)  # the calibration file already replaced (fuzzing)
    return path


def check_model_builds(spec: Any, key: str) -> None:
    """Build the model of ``spec`` on the meta device (shapes only, about a second) or raise
    ``ValueError`` naming ``key``."""
    from runtime.model import load_model

    if OmegaConf.is_config(spec):
        spec = OmegaConf.to_container(spec, resolve=True)
    try:
        load_model(spec, device="meta")
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"profile: {key} = {spec!r} cannot be built: {exc}") from None


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (tried with a temporary file)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".devplace-probe-"):
            return True
    except OSError:
        return False


@hydra.main(version_base=None, config_path="../conf", config_name="profile")
def _hydra_main(cfg: DictConfig) -> None:
    out = Path(cfg.output_dir or hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    from runners import common

    with common.reported_errors(None, "profile"):
        path = check_config(cfg)
        out.mkdir(parents=True, exist_ok=True)
        run(cfg, out, path)


def run(cfg: DictConfig, out: Path, path: Path) -> None:
    """Measure this machine and write the calibration to ``path`` (and ``out``)."""
    from runtime.profile import (
        calibrate_runtime,
        measure_concurrent_speed,
        measure_device,
        measure_ops,
        measure_p2p,
        measure_transfer_overhead,
        write_calibration,
    )

    device = measure_device(threads=int(cfg.threads), n=int(cfg.matmul_n), copy_mb=int(cfg.copy_mb))
    if cfg.model is not None:
        ops = measure_ops(OmegaConf.to_container(cfg.model, resolve=True), threads=int(cfg.threads))
        (out / "op_times_us.json").write_text(json.dumps(ops, indent=1))
        # per-op overhead as the framework sees it: the median of the model's cheapest ops
        small = np.sort(np.fromiter(ops.values(), float))[: max(1, len(ops) // 2)]
        device["launch_overhead"] = float(np.median(small)) * 1e-6
    link = measure_p2p(repeats=int(cfg.p2p_repeats))
    counts = [int(k) for k in cfg.concurrency or []]
    conc = measure_concurrent_speed(counts) if counts else None
    memory = float(cfg.memory_gib) * 2**30
    cal = write_calibration(device, link, path, memory=memory, concurrency=conc)
    rt = cfg.get("runtime") or {}
    if rt.get("model") is not None:  # the runtime's own multi-process compute factor
        # the per-transfer cost measured on its own (the fit then needs only the factor)
        o = measure_transfer_overhead()["send"] if rt.get("fix_overhead", True) else None
        fits = calibrate_runtime(
            OmegaConf.to_container(rt.model, resolve=True),
            [int(n) for n in rt.devices],
            microbatches=int(rt.microbatches),
            rounds=int(rt.rounds),
            steps=int(rt.steps),
            calibration=cal,
            overhead=o,
        )
        cal = write_calibration(device, link, path, memory=memory, concurrency=conc, runtime=fits)
    hy = cfg.get("hybrid") or {}
    if hy.get("model") is not None:  # hybrid plans of one model (CpuHybridModel)
        from runtime.hybrid_profile import calibrate_hybrid_fitted

        hcal = calibrate_hybrid_fitted(
            OmegaConf.to_container(hy.model, resolve=True),
            tps=[int(t) for t in hy.tps],
            micro_sizes=[int(b) for b in hy.micro_sizes],
            recomputes=[str(r) for r in hy.recomputes],
            worlds=[int(w) for w in hy.worlds],
            probe_worlds=[int(k) for k in hy.probe_worlds],
            repeats=int(hy.repeats),
            probe_steps=int(hy.probe_steps),
            probe_launches=int(hy.probe_launches),
            echo=lambda msg: print(f"hybrid: {msg}", flush=True),
        )
        runtime_fits = cal.get("runtime")
        cal = write_calibration(
            device, link, path, memory=memory, concurrency=conc, runtime=runtime_fits, hybrid=hcal
        )
        fit = hcal["probe_fit"]
        print(
            f"hybrid calibration of {hcal['model']['name']}: per-microbatch overhead "
            f"{fit['microbatch'] * 1e3:.2f} ms, per-process speed "
            + ", ".join(f"{k} processes x{v:.2f}" for k, v in sorted(fit["speed"].items()))
            + "; probes predicted/measured "
            + ", ".join(
                f"{key} {p['predicted'] * 1e3:.1f}/{p['measured'] * 1e3:.1f} ms"
                for key, p in sorted(fit["probes"].items())
            )
        )
    (out / "calibration.json").write_text(json.dumps(cal, indent=1))
    d, ln = cal["device"], cal["link"]
    print(
        f"cpu process: {d['peak_flops'] / 1e9:.1f} GFLOP/s, {d['mem_bw'] / 1e9:.1f} GB/s, "
        f"op overhead {d['launch_overhead'] * 1e6:.1f} us; gloo p2p: latency "
        f"{ln['latency'] * 1e6:.0f} us, {ln['bandwidth'] / 1e9:.2f} GB/s; concurrent speed {conc} -> {path}"
    )
    for n, fit in (cal.get("runtime") or {}).items():
        print(
            f"runtime with {n} processes: compute x{fit['factor']:.3f}, "
            f"{fit['transfer_overhead'] * 1e6:.0f} us per transfer endpoint "
            f"(fit MAPE {fit['fit_mape']:.1f} % over {fit['samples']} rank samples)"
        )
    # nothing reads the file implicitly: a cluster uses it only when named (cpu_N@PATH)
    print(
        f"use it by naming it: env.cluster=cpu_{suggested_processes(cfg)}@{path.resolve()} "
        f"(any cpu_N@PATH; plain cpu_N keeps the documented defaults)"
    )


def suggested_processes(cfg: Any) -> int:
    """The ``N`` of ``cpu_N@PATH`` that the closing line suggests: the smallest process count
    the calibration fitted for the plans it serves (the hybrid probes' worlds, e.g. 4 for
    ``gpt2_cpu4_hybrid``; else the runtime fit's devices), else 2. (It said cpu_2 after a
    hybrid calibration whose probes ran 4 and 8 processes.)"""
    hy, rt = cfg.get("hybrid") or {}, cfg.get("runtime") or {}
    if hy.get("model") is not None and hy.get("probe_worlds"):
        return min(int(k) for k in hy.probe_worlds)
    if rt.get("model") is not None and rt.get("devices"):
        return min(int(k) for k in rt.devices)
    return 2


def main() -> None:
    """``python -m runners.profile``: a misspelt key is one error line naming the valid keys
    (it was hydra's "not in struct" message and its hint)."""
    from runners import schema

    schema.run_checked(schema.ProfileConfig, _hydra_main)


if __name__ == "__main__":
    main()
