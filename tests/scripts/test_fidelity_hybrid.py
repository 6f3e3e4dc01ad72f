"""scripts/bench_fidelity.py --hybrid: argument parsing, the plan set (>= 16 distinct valid
plans on 4-8 processes covering d, t, p, ZeRO 0 / 3 and recomputation), the summary figures."""

from __future__ import annotations

import numpy as np
import pytest

from tests.scripts import load_script

fh = load_script("fidelity_hybrid")


def test_arguments():
    a = fh.parse_args(["--hybrid", "--rounds", "3", "--steps", "4", "--nice", "-10"])
    assert (a.rounds, a.steps, a.nice, a.warmup, a.limit) == (3, 4, -10, 2, None)
    with pytest.raises(SystemExit):
        fh.parse_args(["--rounds", "0"])


def test_at_least_16_distinct_valid_plans_on_4_to_8_processes():
    from runtime.model import graph_for_model
    from runtime.spec import make_run_spec

    graph = graph_for_model(fh.MODEL)
    plans = fh.make_plans(graph)  # Plan.hybrid raises on an invalid layout
    names = {c.name for c, _ in plans}
    assert len(plans) >= 16 and len(names) == len(plans)
    assert len({p.layout for _, p in plans}) == len(plans)
    assert {c.world for c, _ in plans} <= {4, 5, 6, 7, 8} and {4, 8} <= {c.world for c, _ in plans}
    for c, plan in plans:
        assert (plan.layout.dp, plan.layout.tp, plan.layout.pp) == (c.dp, c.tp, c.pp)
        assert plan.layout.num_microbatches * c.dp * c.microbatch_size == fh.GLOBAL_BATCH
        make_run_spec(plan, graph, fh._cluster(c.world), fh.MODEL)  # the runtime can run it
        assert plan.layout.num_microbatches >= c.pp  # torch.distributed.pipelining needs it
    cases = [c for c, _ in plans]
    for attr in ("dp", "tp", "pp"):
        assert len({getattr(c, attr) for c in cases}) >= 3
    assert {c.zero for c in cases if c.dp > 1} == {0, 3}
    assert {c.recompute for c in cases} == {"none", "full"}
    assert fh.parse_args(["--limit", "4"]).limit == 4


def test_summary_figures_on_a_hand_made_run(monkeypatch):
    cases = fh.CASES[:3]
    raw = {
        "calibration": {},
        "cases": {c.name: c.__dict__ for c in cases},
        "measured": {},
        "rounds": [{"speed": {}, "collectives": {}}, {"speed": {}, "collectives": {}}],
    }
    meas = [0.1, 0.2, 0.4]
    for c, t in zip(cases, meas):
        m = {"step_time": t, "run_peak": [100.0] * 4, "step_memory": [100 * t] * 4}
        raw["measured"][c.name] = [m, m]
    preds = {cases[0]: 0.1, cases[1]: 0.3, cases[2]: 0.3}
    mems = {cases[0]: 100.0, cases[1]: 110.0, cases[2]: 130.0}

    def fake_predict(graph, case, cal):
        return {
            "step_time": preds[case], "peak": [mems[case]] * 4, "step_memory": [mems[case] / 10] * 4,
            "share_time": 0.0, "critical_path": 0.0, "cores": 2.0,
        }  # fmt: skip

    monkeypatch.setattr(fh, "predict", fake_predict)
    s = fh.summarize(None, raw)
    assert s["mape"] == pytest.approx((0 + 50 + 25) / 3)
    assert s["spearman"] == pytest.approx(np.corrcoef([1, 2, 3], [1, 2.5, 2.5])[0, 1])
    assert s["mem_mean_err"] == pytest.approx((0 + 10 + 30) / 3)
    assert (s["mem_within"], s["mem_ranks"]) == (8, 12)
    text = fh.markdown(raw, s, "cmd")
    assert text.startswith(fh.START) and text.rstrip().endswith(fh.END)


def test_runtime_probes_are_valid_and_not_benchmark_plans():
    """The runtime-overhead probes (runtime.hybrid_profile.PROBES) calibrate the model; none of
    them may be one of the plans the benchmark evaluates."""
    from runtime.hybrid_profile import PROBES
    from runtime.model import graph_for_model
    from runtime.spec import make_run_spec

    graph = graph_for_model(fh.MODEL)
    bench = {(c.dp, c.tp, c.pp, c.microbatch_size, c.zero if c.dp > 1 else 0) for c in fh.CASES}
    for k, probes in PROBES.items():
        for _, (dp, tp, pp, b, z) in probes:
            assert dp * tp * pp == k and (dp, tp, pp, b, z) not in bench
            case = fh.HybridCase(dp, tp, pp, b, z)
            plan = case.plan(graph, fh._cluster(k))
            make_run_spec(plan, graph, fh._cluster(k), fh.MODEL)
            assert plan.layout.num_microbatches >= pp  # torch.distributed.pipelining needs it


def _synthetic_calibration():
    """A hand-made hybrid calibration of the benchmark's model (6 segments: embeddings, 4
    blocks, head), every (tp, microbatch) the benchmark and its probes use."""
    coll = {
        "wall": {"latency": 1e-3, "per_byte": 1e-9},
        "cpu": {"latency": 5e-4, "per_byte": 5e-10},
    }
    colls = {n: coll for n in ("all_reduce", "all_gather", "reduce_scatter", "p2p")}
    segs = {}
    for t in (1, 2, 4):
        by = {}
        for b in (1, 2, 4, 8):
            for rc in ("none", "full"):
                by[f"{b}/{rc}"] = {
                    "fwd": [b * 1e-4] + [b * 2e-3 / t] * 4 + [b * 5e-4],
                    "bwd": [b * 1e-4] + [b * 4e-3 / t * (1.3 if rc == "full" else 1)] * 4
                    + [b * 1e-3],
                    "kept": [1e3] + [b * 1e6 / t] * 4 + [b * 1e5],
                    "params": [150_000] + [790_000 // t] * 4 + [132_000],
                }  # fmt: skip
        segs[str(t)] = {"segments": by}
    return {
        "segments": segs,
        "collectives": {"2": colls, "4": colls, "8": colls},
        "speed": {"1": 1.0},
        "optimizer": {"adam_cpu_per_param": 2e-9},
        "memory": {"worker_base": 360 * 2**20, "step_residue": 0.0},
        "runtime": {"1": {"microbatch": 0.003}},
    }


def test_probe_speed_recovers_the_speed_that_produced_the_probe_times():
    """--speed probes: probe step times made by the model at speed 0.3 (k = 4) and 0.15
    (k = 8) give back those speeds; --speed median takes the median of the rounds' samples."""
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel
    from runtime.hybrid_profile import PROBES
    from runtime.model import graph_for_model

    graph = graph_for_model(fh.MODEL)
    cal = _synthetic_calibration()
    truth = {"4": 0.3, "8": 0.15}
    probes = {}
    for k in (4, 8):
        model = CpuHybridModel(graph, cpu_cluster(k), dict(cal, speed={"1": 1.0, **truth}))
        for name, (dp, tp, pp, b, z) in PROBES[k]:
            plan = fh.HybridCase(dp, tp, pp, b, z).plan(graph, fh._cluster(k))
            probes[f"{k}/{name}"] = {"measured": model.evaluate(plan.layout).step_time}
    cal["runtime_probes"] = probes
    rounds = [
        {"speed": {"4": [0.2, 0.4], "8": [0.1]}, "collectives": cal["collectives"]},
        {"speed": {"4": [0.5], "8": [0.3, 0.2]}, "collectives": cal["collectives"]},
    ]
    raw = {"calibration": cal, "rounds": rounds}
    fitted = fh.probe_speed(graph, raw)
    assert fitted["calibration"]["probe_speed"]["4"] == pytest.approx(0.3, rel=1e-3)
    assert fitted["calibration"]["probe_speed"]["8"] == pytest.approx(0.15, rel=1e-3)
    assert fitted["rounds"][1]["speed"]["4"] == pytest.approx([0.3], rel=1e-3)
    med = fh.median_speed(graph, dict(raw, calibration={**cal, "runtime_probes": {}}))
    assert med["rounds"][0]["speed"] == {"4": [0.4], "8": [0.2]}


def test_joint_fit_recovers_the_overhead_and_speeds_that_produced_the_probe_times():
    """--speed joint (runtime.hybrid_profile.fit_to_probes): probe step times made by the
    model with a 4 ms per-microbatch overhead and speeds 0.3 (k = 4) / 0.15 (k = 8) give back
    all three, whatever overhead the calibration held before; no probes is refused."""
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel
    from runtime.hybrid_profile import PROBES, fit_to_probes
    from runtime.model import graph_for_model

    graph = graph_for_model(fh.MODEL)
    cal = _synthetic_calibration()
    truth = dict(cal, speed={"1": 1.0, "4": 0.3, "8": 0.15}, runtime={"1": {"microbatch": 0.004}})
    probes = {}
    for k in (1, 4, 8):
        model = CpuHybridModel(graph, cpu_cluster(k), truth)
        for name, (dp, tp, pp, b, z) in PROBES[k]:
            plan = fh.HybridCase(dp, tp, pp, b, z).plan(graph, fh._cluster(k))
            probes[f"{k}/{name}"] = {"measured": model.evaluate(plan.layout).step_time}
    cal["runtime_probes"] = probes
    cal["runtime"] = {"1": {"microbatch": 0.010}}  # a wrong residual: the fit replaces it
    fitted = fit_to_probes(graph, cal)
    fit = fitted["probe_fit"]
    assert fit["microbatch"] == pytest.approx(0.004, rel=1e-2)
    assert fit["speed"]["4"] == pytest.approx(0.3, rel=1e-2)
    assert fit["speed"]["8"] == pytest.approx(0.15, rel=1e-2)
    assert fitted["runtime"] == {"1": {"microbatch": fit["microbatch"]}}  # no k-process terms
    for p in fit["probes"].values():
        assert p["predicted"] == pytest.approx(p["measured"], rel=1e-2)
    rounds = [{"speed": {"4": [0.9], "8": [0.9]}, "collectives": cal["collectives"]}]
    out = fh.joint_speed(graph, {"calibration": cal, "rounds": rounds})
    assert out["speed_mode"] == "joint"
    assert out["rounds"][0]["speed"]["4"] == pytest.approx([0.3], rel=1e-2)
    with pytest.raises(ValueError, match="runtime_probes"):
        fit_to_probes(graph, {k: v for k, v in cal.items() if k != "runtime_probes"})
    with pytest.raises(ValueError, match="4/nccl.*known: 1/microbatch"):
        fit_to_probes(graph, dict(cal, runtime_probes={"4/nccl": {"measured": 0.1}}))


def test_submesh_plans_are_valid_run_by_the_runtime_and_written_in_their_own_section(tmp_path):
    """``--cases submesh``: plans whose stages have their own submeshes, each beside a
    uniform plan of the same first stage; the runtime makes each a run spec, and their
    markdown goes between their own markers, leaving the main section of the file as it is."""
    from runtime.model import graph_for_model
    from runtime.spec import make_run_spec

    assert fh.parse_args(["--cases", "submesh"]).cases == "submesh"
    graph = graph_for_model(fh.MODEL)
    plans = fh.make_plans(graph, fh.SUBMESH_CASES)
    het = [c for c, _ in plans if c.stage_meshes]
    assert len(het) >= 4 and len({c.name for c, _ in plans}) == len(plans)
    for c, plan in plans:
        assert plan.layout.stage_meshes == c.stage_meshes and plan.layout.world_size == c.world
        spec = make_run_spec(plan, graph, fh._cluster(c.world), fh.MODEL)
        assert spec.world_size == c.world
        if c.stage_meshes:  # a uniform plan with the same first stage is measured beside it
            assert any((u.dp, u.tp, u.microbatch_size) == (c.dp, c.tp, c.microbatch_size)
                       for u, _ in plans if not u.stage_meshes)  # fmt: skip
    assert fh.HybridCase(**{**het[0].__dict__, "stage_meshes": [[2, 1], [1, 2]]}) == het[0]
    # the calibration measures every stage's (tp, rows) and every runtime probe's
    from runtime.hybrid_profile import PROBES

    tps, sizes = fh.calibrated_shapes(fh.SUBMESH_CASES)
    for c in het:
        for dp, tp in c.stage_meshes:
            assert tp in tps and c.dp * c.microbatch_size // dp in sizes
    for k in (1, 4, 8):
        assert all(t in tps and b in sizes for _, (_, t, _, b, _) in PROBES[k])
    assert fh.calibrated_shapes(fh.CASES) == ([1, 2, 4], [1, 2, 4, 8])
    start, end = fh.markers("submesh")
    assert start != fh.START and end != fh.END
    out = tmp_path / "f.md"
    out.write_text(f"intro\n{fh.START}\nmain\n{fh.END}\n")
    fh.write_section(out, f"{start}\nfirst\n{end}")
    fh.write_section(out, f"{start}\nsecond\n{end}")
    text = out.read_text()
    assert "main" in text and "second" in text and "first" not in text
