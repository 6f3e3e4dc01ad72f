"""``python -m runners.execute plan=PATH``: run a plan, one process per device, and record its
measured step time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from graphs import clusters
from graphs.plan import Plan
from graphs.schema import show
from runners import common, schema


def resolve(
    plan: Plan, graph_path: str | None, cluster_name: str | None, *, source: str | None = None
) -> tuple[Any, Any]:
    """The graph and cluster a plan runs on (from files/presets, or from the plan's meta);
    errors start with ``source`` (the plan file) when it is given."""
    at = f"{source}: " if source else ""
    model = plan.meta.get("model")
    if not model:
        made_for = plan.meta.get("graph_file")
        raise ValueError(
            f"{at}the plan names no model to run (plan.meta has no 'model')"
            + (
                f": it was made for the graph file {made_for}, which holds costs, not a PyTorch "
                "model. Plans of zoo models (model: NAME) or of your own (model: pkg.mod:fn) run"
                if made_for
                else "; plans written by runners.train/plan/evaluate carry it"
            )
        )
    common.check_model_meta(model, source or "the plan")
    try:
        _check_buildable(model, hybrid=plan.layout is not None)
    except ValueError as exc:
        raise ValueError(f"{at}{exc}") from None
    if graph_path:
        from graphs import io

        graph = io.load(graph_path)
    else:
        from runtime.model import graph_for_model

        graph = graph_for_model(model)
    # default: a cpu_N cluster just large enough (a tensor-parallel group spans tp devices;
    # a hybrid layout uses pp x dp x tp devices)
    tp = max(plan.tp_degree.values(), default=1)
    n = plan.layout.world_size if plan.layout is not None else int(plan.placement.max()) + tp
    name = cluster_name or plan.meta.get("cluster") or f"cpu_{n}"
    try:
        cluster = clusters.load(str(name))
    except (ValueError, FileNotFoundError) as exc:
        where = "cluster=" if cluster_name else "the plan's meta.cluster: "
        raise ValueError(f"{at}{where}{exc}") from None
    # a plan made with env.memory_fraction=F was hashed on the cluster with that share of
    # memory: without it, "made for cluster 'cpu_4', not 'cpu_4'" (found by fuzzing)
    frac = plan.meta.get("memory_fraction")
    if frac is not None:
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
            raise ValueError(f"{at}meta.memory_fraction is {frac!r}; expected a number in (0, 1]")
        cluster = cluster.with_memory_fraction(float(frac))
    return graph, cluster


def _check_graph_matches_model(graph: Any, model: Any, graph_path: str | None, at: str) -> None:
    """With ``graph=FILE``: the file must be the training graph of the plan's ``meta.model``
    (the same forward operators, by name), since the runtime builds that model and places its
    operators by the graph's names. A GPT-2 placement with a BERT ``meta.model`` ran a BERT,
    and one with ``n_layer`` 4 for 2 placed the extra layers by a fallback (exit 0; found by
    fuzzing, 29 Nov 2026). Parametric models (hybrid plans) are not checked here."""
    if not graph_path:
        return
    from graphs.zoo.parametric import is_parametric

    if isinstance(model, dict) and "name" in model:
        if is_parametric(str(model["name"]), dict(model.get("config") or {})):
            return
    from runtime.model import graph_for_model
    from runtime.spec import forward_names  # the names the runtime places ops by

    def fwd_names(g: Any) -> set[str]:
        return {m for _, names in forward_names(g) for m in names}

    mine, theirs = fwd_names(graph), fwd_names(graph_for_model(model))
    if mine != theirs:
        extra, missing = sorted(mine - theirs), sorted(theirs - mine)
        raise ValueError(
            f"{at}graph={graph_path} is not the training graph of the plan's meta.model "
            f"{model}: "
            + (
                f"{len(missing)} of the model's operators are not in it (e.g. {missing[:3]})"
                if missing
                else ""
            )
            + ("; " if missing and extra else "")
            + (f"{len(extra)} of its nodes are not the model's (e.g. {extra[:3]})" if extra else "")
        )


def _check_buildable(model: Any, *, hybrid: bool = True) -> None:
    """Refuse, naming it, a parametric model of ``graphs.zoo.build`` (``gpt`` by dimension,
    ``llama`` with dimension keywords) that no PyTorch module of the zoo computes
    (:func:`graphs.zoo.parametric.module_spec`: a ``gpt`` whose ``ffn`` is not 4 x hidden, a
    tied ``llama``), or in a plan that is not a hybrid layout (``hybrid=False``: its
    operator-level graph of ``embed`` / ``h.<l>.attn`` / ... nodes names none of the module's
    operators). The others run on the zoo's GPT-2 / LLaMA module of their dimensions."""
    from graphs.zoo.parametric import is_parametric, module_spec

    if not isinstance(model, dict) or "factory" in model:
        return
    name, config = model.get("name"), dict(model.get("config") or {})
    if is_parametric(str(name), config):
        module_spec(str(name), config)
        if not hybrid:
            raise ValueError(
                f"the plan places the operators of the parametric {name!r} of graphs.zoo.build, "
                "whose graph has one node per layer half, not the module's operators: "
                "runners.execute runs hybrid plans (dp x tp x pp layouts) of it, or operator "
                f"placements of the extracted zoo models (e.g. model: gpt2 with its config)"
            )


@hydra.main(version_base=None, config_path="../conf/execute", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    out = common.run_dir_from_hydra(cfg.output_dir)
    with common.reported_errors(out, "execute"):
        run(cfg, out, echo=common.RunLog(out, "execute"))


def main() -> None:
    """Entry point: check the command-line keys and values against the schema (a misspelt
    key, ``rehearse=no``, ``steps=2.5`` are refused by name), then run hydra."""
    schema.run_checked(schema.ExecuteConfig, _hydra_main)


def _calibration_changed(source: Any, plan: Plan, made: str, cluster: Any) -> str:
    """Why a plan made on ``cpu_N@PATH`` does not match the cluster ``PATH`` gives now: the
    file was profiled again (or edited) since, which the plan's ``meta.calibration_sha256``
    tells from an edited plan. Both used to read "an edited plan file?" (fuzzing, 2 Dec
    2026: ``runners.profile out=SAME`` after planning)."""
    path = made.split("@", 1)[1]
    was, now = plan.meta.get("calibration_sha256"), cluster.meta.get("calibration_sha256")
    again = (
        f"plan again on it (runners.train / runners.plan with env.cluster={made}), or put "
        "back the file the plan was made with"
    )
    if was and was != now:
        return (
            f"plan={source} was made on the calibration in {path} (figures sha256 {was}), "
            f"which has changed since (now {now}: profiled again or edited); {again}"
        )
    if was:  # the same figures: the plan's cluster_hash or meta.cluster was edited
        return (
            f"plan={source}: the calibration in {path} is the one the plan was made on "
            f"(figures sha256 {was}), but not the cluster of its cluster_hash "
            f"{plan.cluster_hash} (an edited plan file?); plan again"
        )
    return (
        f"plan={source}: the calibration in {path} (its meta.cluster) now gives another "
        f"cluster than the plan's cluster_hash {plan.cluster_hash}: the file was profiled "
        f"again or edited since the plan was made (or the plan file was); {again}"
    )


def run(cfg: DictConfig, out: Path, *, echo: Any = print) -> Any:
    """Execute ``cfg.plan``; the measured result goes to ``out/result.json``."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "plan"):
        raise ValueError(
            "plan=PATH is required: a plan JSON from runners.* (e.g. "
            "outputs/train/DATE/TIME/best_plan.json)"
        )
    schema.check_values(schema.ExecuteConfig, cfg)
    if Path(cfg.plan).is_dir():
        found = sorted(p.name for p in Path(cfg.plan).glob("*plan.json"))
        raise ValueError(
            f"plan={cfg.plan} is a folder; give the plan file in it"
            + (f" ({', '.join(found)})" if found else " (a plan JSON from runners.*)")
        )
    if not Path(cfg.plan).is_file():
        from runners.earlier_run import hint

        raise FileNotFoundError(
            f"plan={cfg.plan}: no such file"
            + (hint(Path(cfg.plan).expanduser()) or " (a plan JSON from runners.*)")
        )
    plan = Plan.load(cfg.plan)
    graph, cluster = resolve(plan, cfg.graph, cfg.cluster, source=str(cfg.plan))
    if len(plan.placement) != graph.num_nodes:  # "placement has shape (24,), expected (34,)"
        model = plan.meta.get("model") or {}
        groups = model.get("max_groups") if isinstance(model, dict) else None
        raise ValueError(
            f"plan={cfg.plan} places {len(plan.placement)} nodes, but "
            + (f"graph={cfg.graph}" if cfg.graph else "the graph of its meta.model")
            + f" has {graph.num_nodes}: another model or coarsening (the plan's meta.model "
            f"has max_groups={groups})"
        )
    if plan.cluster_hash and plan.cluster_hash != cluster.content_hash():
        made = plan.meta.get("cluster")
        if not (cfg.cluster or made):  # cpu_N was guessed from the devices the plan uses
            raise ValueError(  # (fuzzing: it said "its meta.cluster", which the plan lacks)
                f"plan={cfg.plan} names no cluster (no meta.cluster) and was not made for "
                f"{cluster.name!r}, the cpu_N its devices suggest (cluster hash "
                f"{plan.cluster_hash}); give the cluster it was made for: cluster=NAME"
            )
        if not cfg.cluster and isinstance(made, str) and "@" in made:
            raise ValueError(_calibration_changed(cfg.plan, plan, made, cluster))
        if not cfg.cluster:  # the cluster loaded is the one meta names: they disagree
            frac = plan.meta.get("memory_fraction")
            raise ValueError(  # it said "made for cluster 'cpu_2', not 'cpu_2'" (fuzzing)
                f"plan={cfg.plan}: its meta.cluster {made!r}"
                + (f" with meta.memory_fraction {frac!r}" if frac is not None else "")
                + f" is not the cluster its cluster_hash {plan.cluster_hash} was taken of "
                "(an edited plan file?); plan again, or give the cluster it was made for: "
                "cluster=NAME"
            )
        raise ValueError(  # it said "made for cluster 96844..." naming neither (fuzzing)
            f"plan={cfg.plan} was made for cluster {made or plan.cluster_hash!r}, not "
            f"{cluster.name!r} ({'cluster=' + str(cfg.cluster) if cfg.cluster else 'its meta.cluster'}"
            "); a placement only runs on the cluster it was made for: drop cluster= or plan "
            "again on that cluster"
        )
    if plan.graph_hash and plan.graph_hash != graph.content_hash() and not cfg.graph:
        model = plan.meta.get("model") or {}
        raise ValueError(  # it said "Plan was made for graph a8de..., not for 'gpt2'" (fuzzing)
            f"plan={cfg.plan} was made for graph {plan.graph_hash}, but the graph its "
            f"meta.model builds ({show(model)[:160]}) is {graph.content_hash()}: meta.model "
            "was edited, or the model's code changed since the plan was made; plan again"
        )
    _check_graph_matches_model(graph, plan.meta.get("model"), cfg.graph, f"{cfg.plan}: ")
    optimizer = cfg.optimizer or default_optimizer(plan, cluster)
    from runtime.execute import execute  # torch: only once the plan and its settings are checked

    result = execute(
        plan,
        graph,
        cluster,
        steps=int(cfg.steps),
        warmup=int(cfg.warmup),
        seed=int(cfg.seed),
        backend=cfg.backend,
        threads=int(cfg.threads),
        optimizer=str(optimizer),
        timeout_s=float(cfg.timeout_s),
        out_dir=out,
        rehearse=bool(cfg.rehearse),
        echo=echo,
        launcher=str(cfg.launcher),
    )
    if result.mode == "oplevel" and plan.schedule != "in_order":
        echo(
            f"note: an operator placement runs in the op-level runtime's own order "
            f"(schedule in_order in result.json), not the plan's schedule {plan.schedule!r}"
        )
    per_rank = ", ".join(
        f"rank{r}: compute {c * 1e3:.1f} / comm {m * 1e3:.1f} / idle {i * 1e3:.1f} ms"
        for r, (c, m, i) in enumerate(zip(result.compute, result.comm, result.idle))
    )
    echo(
        f"{result.mode} plan on {result.world_size} processes: step {result.step_time * 1e3:.2f} ms "
        f"(loss {result.loss:.4f}); {per_rank}; {out / 'result.json'}"
    )
    report_prediction(plan, graph, cluster, result, out, echo, optimizer=str(optimizer))
    return result


def predicts(plan: Plan, cluster: Any) -> bool:
    """Whether a calibrated model predicts this run: a hybrid plan on a ``cpu_N@PATH``
    cluster with a hybrid calibration."""
    return plan.layout is not None and bool(cluster.meta.get("hybrid_calibration"))


def default_optimizer(plan: Plan, cluster: Any) -> str:
    """``optimizer=null``: Adam where the calibrated hybrid model predicts the run (it
    counts Adam's state and step, as its calibration measured them), else SGD."""
    return "adam" if predicts(plan, cluster) else "sgd"


def report_prediction(
    plan: Plan,
    graph: Any,
    cluster: Any,
    result: Any,
    out: Path,
    echo: Any,
    *,
    optimizer: str = "adam",
) -> dict[str, Any] | None:
    """For a hybrid plan on a ``cpu_N@PATH`` cluster with a hybrid calibration: the
    calibrated model's prediction beside the measurement, added to ``out/result.json``
    under ``prediction`` (step time, peak memory per rank, and their errors =
    measured / predicted - 1) and echoed; None (nothing written) otherwise. The model
    counts Adam: a run with another ``optimizer``, or a layout whose shape the calibration
    lacks, gets a line saying why there is no prediction."""
    from placement_env.oracles.hybrid_cpu import UncalibratedLayoutError, predicted_run

    if not predicts(plan, cluster):
        return None
    if optimizer != "adam":
        echo(
            f"no prediction: the calibrated model of {cluster.name} counts Adam's state and "
            f"step, this run used {optimizer!r} (run with optimizer=adam, the default here)"
        )
        return None
    try:
        pred = predicted_run(plan, graph, cluster)
    except UncalibratedLayoutError as exc:
        echo(f"no prediction: {exc}")
        return None
    assert pred is not None  # predicts() holds: a layout and a hybrid calibration
    pred["optimizer"] = optimizer
    meas_peak = [float(x) for x in (result.run_peak or [])]
    pred["step_time_error"] = result.step_time / pred["step_time"] - 1.0
    if len(meas_peak) == len(pred["peak_memory"]):
        pred["peak_memory_error"] = [m / p - 1.0 for m, p in zip(meas_peak, pred["peak_memory"])]
    path = out / "result.json"
    data = json.loads(path.read_text()) if path.is_file() else result.to_dict()
    data["prediction"] = pred
    path.write_text(json.dumps(data, indent=1))
    mem = pred.get("peak_memory_error")
    echo(
        f"predicted by the calibrated model of {cluster.name}: step {pred['step_time'] * 1e3:.2f} ms "
        f"(measured {pred['step_time_error'] * 100:+.1f} %)"
        + (
            f"; peak memory per rank measured {min(mem) * 100:+.1f} to {max(mem) * 100:+.1f} %"
            if mem
            else ""
        )
    )
    return pred


if __name__ == "__main__":
    main()
