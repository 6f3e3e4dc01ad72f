"""Hybrid plans planned and run on this machine, through the CLI: ``runners.profile
hybrid.model=...`` writes a hybrid calibration, ``runners.train +env=gpt2_cpu4_hybrid
env.cluster=cpu_N@PATH agent=megatron_grid`` plans with the calibrated ``CpuHybridModel``
(skipping the layouts the calibration does not cover), and ``runners.execute`` runs the plan
and reports the model's prediction beside the measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "{n_layer: 2, d_model: 32, n_head: 4, vocab: 64, seq: 16, n_ctx: 16, batch: 8}"


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.timeout(600)
def test_profile_plan_and_execute_a_hybrid_plan_with_its_prediction(tmp_path):
    cal = tmp_path / "cal.json"
    prof = _run(
        ["runners.profile", f"calibration={cal}", f"output_dir={tmp_path / 'prof'}", "model=null",
         "concurrency=null", "matmul_n=128", "copy_mb=8", "p2p_repeats=2",
         f"hybrid.model={{name: gpt2, config: {CONFIG}}}", "hybrid.tps=[1]",
         "hybrid.micro_sizes=[1]", "hybrid.recomputes=[none]", "hybrid.worlds=[2]",
         "hybrid.probe_worlds=[2]", "hybrid.repeats=1", "hybrid.probe_steps=2",
         "hybrid.probe_launches=1"],
        timeout=400,
    )  # fmt: skip
    assert "hybrid calibration of gpt2" in prof.stdout
    hcal = json.loads(cal.read_text())["hybrid"]
    assert set(hcal["segments"]) == {"1", "2"}  # tp 1 asked, tp 2 for the probes
    assert set(hcal["probe_fit"]["probes"]) == {"1/microbatch", "2/p2p", "2/tp", "2/ddp", "2/fsdp"}
    # one run of each probe (probe_launches=1) of 2 timed steps (probe_steps=2)
    assert all(len(p["runs"]) == 1 for p in hcal["runtime_probes"].values())

    train = tmp_path / "train"
    tr = _run(
        ["runners.train", "+env=gpt2_cpu4_hybrid", f"env.model_config={CONFIG}",
         f"env.cluster=cpu_2@{cal}", "agent=megatron_grid", "logger=none",
         f"output_dir={train}"],
        timeout=300,
    )  # fmt: skip
    assert "(layouts scored by CpuHybridModel, from the cluster's hybrid calibration)" in tr.stdout
    res = json.loads((train / "result.json").read_text())
    planner = res["meta"]["planner"]
    assert planner["uncalibrated_skipped"] > 0  # selective recomputation, microbatch 8, ...
    lay = res["layout"]
    calibrated = {f"{b}/none" for b in (1, 2, 4)}
    assert f"{lay['microbatch_size']}/{lay['recompute']}" in calibrated and lay["tp"] in (1, 2)

    run = tmp_path / "exec"
    ex = _run(
        ["runners.execute", f"plan={train / 'best_plan.json'}", f"output_dir={run}",
         "steps=2", "warmup=1"],
        timeout=300,
    )  # fmt: skip
    assert f"predicted by the calibrated model of cpu_2@{cal}" in ex.stdout
    out = json.loads((run / "result.json").read_text())
    pred = out["prediction"]
    assert pred["optimizer"] == "adam"  # the optimizer the calibrated model counts (default here)
    assert pred["step_time"] == pytest.approx(res["step_time"])  # what the planner scored
    assert pred["step_time_error"] == pytest.approx(out["step_time"] / pred["step_time"] - 1)
    assert len(pred["peak_memory"]) == len(pred["peak_memory_error"]) == out["world_size"] == 2
    assert all(p > 0 for p in pred["peak_memory"])
