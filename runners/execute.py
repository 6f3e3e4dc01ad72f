"""``python -m runners.execute plan=PATH``: run a plan with torchrun and record its measured step time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from graphs import clusters
from graphs.plan import Plan


def resolve(plan: Plan, graph_path: str | None, cluster_name: str | None) -> tuple[Any, Any]:
    """The graph and cluster a plan runs on (from files/presets, or from the plan's meta)."""
    if graph_path:
        from graphs import io

        graph = io.load(graph_path)
    else:
        from runtime.model import graph_for_model

        model = plan.meta.get("model")
        if not model:
            raise ValueError(
                "plan.meta has no 'model'; pass graph=PATH and set the model in the plan"
            )
        graph = graph_for_model(model)
    # default: a cpu_N cluster just large enough (a tensor-parallel group spans tp devices;
    # a hybrid layout uses pp x dp x tp devices)
    tp = max(plan.tp_degree.values(), default=1)
    n = plan.layout.world_size if plan.layout is not None else int(plan.placement.max()) + tp
    name = cluster_name or plan.meta.get("cluster") or f"cpu_{n}"
    return graph, clusters.load(str(name))


@hydra.main(version_base=None, config_path="../conf/execute", config_name="config")
def main(cfg: DictConfig) -> None:
    from runtime.execute import execute

    plan = Plan.load(cfg.plan)
    graph, cluster = resolve(plan, cfg.graph, cfg.cluster)
    out = Path(cfg.output_dir or hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    result = execute(
        plan,
        graph,
        cluster,
        steps=int(cfg.steps),
        warmup=int(cfg.warmup),
        seed=int(cfg.seed),
        backend=cfg.backend,
        threads=int(cfg.threads),
        optimizer=str(cfg.optimizer),
        timeout_s=float(cfg.timeout_s),
        out_dir=out,
    )
    per_rank = ", ".join(
        f"rank{r}: compute {c * 1e3:.1f} / comm {m * 1e3:.1f} / idle {i * 1e3:.1f} ms"
        for r, (c, m, i) in enumerate(zip(result.compute, result.comm, result.idle))
    )
    print(
        f"{result.mode} plan on {result.world_size} processes: step {result.step_time * 1e3:.2f} ms "
        f"(loss {result.loss:.4f}); {per_rank}; {out / 'result.json'}"
    )


if __name__ == "__main__":
    main()
