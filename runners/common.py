"""Shared runner plumbing: configs to plain specs, problem building, baselines, artefacts, files."""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import is_number, umask_mode
from runners.schema import EnvConfig

#: The ``env`` config as a plain dataclass (library code never sees a DictConfig).
EnvSpec = EnvConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

OracleFactory = Callable[[CompGraph, Cluster], Any]


# ----------------------------------------------------------------- config -> spec
def to_plain(node: Any) -> Any:
    """A DictConfig/ListConfig (or anything) as plain dicts/lists, interpolations resolved."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, structured_config_mode=None)
    return node


def env_spec(cfg: Any) -> EnvSpec:
    """``EnvSpec`` from an ``env`` config node (DictConfig or mapping)."""
    d = dict(to_plain(cfg))
    d["baselines"] = list(d.get("baselines") or ())
    known = set(EnvSpec.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"env config has unknown keys {unknown}; valid keys: {sorted(known)}")
    if d.get("graph_file") and d.get("model"):  # the file used to win without a word
        raise ValueError(
            f"env {d.get('name')!r}: both env.model ({d['model']!r}) and env.graph_file "
            f"({d['graph_file']}) are set. The graph file replaces the model, and plans of a "
            "graph file name no model, so runners.execute cannot run them: add env.model=null "
            "to plan the file, or drop env.graph_file"
        )
    if d.get("generator_options") and d.get("generator", "fixed") == "fixed":
        raise ValueError(  # they were ignored: the fixed problem is the env's model / file
            f"env {d.get('name')!r}: env.generator_options {d['generator_options']} set, but "
            "env.generator is 'fixed' (one problem: the env's model or graph file), which "
            "takes no options: set env.generator (e.g. synthetic) or drop the options"
        )
    if d.get("schedule") == "interleaved" and d.get("env_id") != HYBRID_ENV_ID:
        raise ValueError(  # the simulator refused it later, naming no config key (fuzzing)
            f"env {d.get('name')!r}: env.schedule 'interleaved' is a hybrid layout's schedule "
            "(virtual pipeline stages); an op-placement env runs 'gpipe', '1f1b' or 'in_order'"
        )
    return EnvSpec(**d)


def available(group: str) -> list[str]:
    """The option names of a config group (the YAML files under ``conf/GROUP/``)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def require_env(cfg: Any, app: str, run_dir: Path | None = None) -> None:
    """Exit with a message listing the envs when the config has none (``+env=`` missing);
    the run folder hydra made (``run_dir``) gets ``error.txt`` and the log line, as for any
    other failure (it held only ``.hydra/``)."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "env"):
        _record_failure(run_dir, app, "no env chosen: pick one with +env=NAME")
        names = ", ".join(available("env"))
        sys.stderr.write(
            f"error: no env chosen. Pick one with +env=NAME, e.g.\n"
            f"  python -m runners.{app} +env=gpt2_8gpu\n"
            f"available envs: {names}\n"
        )
        raise SystemExit(2)


# --------------------------------------------------------------------- problems
@dataclass
class Problem:
    """The placement problem a run reports on: a graph, a cluster and how to score plans."""

    spec: EnvSpec
    graph: CompGraph
    cluster: Cluster
    oracle_factory: OracleFactory

    def oracle(self) -> Any:
        """A fresh oracle (its own call counter) for this problem."""
        return self.oracle_factory(self.graph, self.cluster)

    def plan(self, placement: Any, **meta: Any) -> Plan:
        """A ``Plan`` of ``placement`` for this problem, with the env's pipeline settings and
        what ``runners.execute`` needs to run it: the model spec, the cluster, the env."""
        return Plan.for_graph(
            np.asarray(placement, dtype=np.int64),
            self.graph,
            self.cluster,
            microbatches=self.spec.microbatches,
            schedule=self.spec.schedule,
            meta={**plan_provenance(self.spec, self.cluster), **meta},
        )


def problem_identity(problem: Problem) -> dict[str, Any]:
    """What makes two runs' figures comparable, written as ``result.json``'s ``problem``:
    the graph's and the cluster's content hashes (the memory fraction applied) and how plans
    are scored. ``runners.evaluate`` refuses to average runs of one env name whose problems
    differ (runs that differed only in schedule or memory fraction were averaged: their lower
    bounds are equal)."""
    s = problem.spec
    out = {
        "graph": problem.graph.content_hash(),
        "cluster": problem.cluster.content_hash(),
        "env_id": str(s.env_id),
        "microbatches": int(s.microbatches),
        "schedule": str(s.schedule),
        "objective": str(s.objective),
        "oracle": str(s.oracle),
        "oracle_options": json.loads(json.dumps(dict(s.oracle_options), default=str)),
    }
    if s.env_id == HYBRID_ENV_ID:
        # each layout has its own microbatches and schedule: two runs differing only in the
        # unused env.microbatches were refused as different problems; and which step model
        # scores the layouts (a hybrid calibration of cpu_N is not in the cluster's hash:
        # runs scored 0.51 and 10.61 ms were averaged as two seeds; fuzzing, 2 Dec 2026)
        out["microbatches"] = out["schedule"] = None
        hcal = problem.cluster.meta.get("hybrid_calibration")
        out["hybrid_model"] = "HybridModel"
        if hcal:
            from graphs.cpu_cluster import calibration_digest

            out["hybrid_model"] = f"CpuHybridModel {calibration_digest(hcal)}"
    return out


def is_factory(model: str | None) -> bool:
    """Whether an env's ``model`` names a factory by import path (``pkg.mod:fn``), not a zoo model."""
    return bool(model) and ":" in str(model)


def model_spec(spec: EnvSpec) -> dict[str, Any] | None:
    """The env's model as a runtime model spec (what ``plan.meta["model"]`` holds), or ``None``.

    ``{"factory": "pkg.mod:fn", "config": {...}, "max_groups": K}`` for a model named by
    import path, ``{"name": zoo_name, "config": {...}, "max_groups": K}`` for a zoo model
    (``max_groups`` left out when ``None``); ``None`` when the env names no model (a
    ``graph_file`` alone). ``runtime.model.load_model`` builds the model from it and
    ``runtime.model.graph_for_model`` its training graph, the one :func:`load_graph` gives.
    """
    if spec.graph_file or not spec.model:  # load_graph reads the file, not the model
        return None
    key = "factory" if is_factory(spec.model) else "name"
    out: dict[str, Any] = {key: str(spec.model), "config": dict(spec.model_config)}
    if spec.max_groups:
        out["max_groups"] = int(spec.max_groups)
    return out


def policy_digest(policy: str | Path) -> dict[str, str]:
    """``{"policy_file": resolved path, "policy_sha256": digest of its bytes}`` of a policy
    name or file (a shipped name such as ``"generalist"`` resolved to the file in the
    package), for ``result.json``: the name alone did not say which weights planned or
    started a run, and a later release ships other weights under the same name (3 Dec 2026)."""
    import hashlib

    from agents.export import resolve_policy

    path = resolve_policy(policy).resolve()
    return {
        "policy_file": str(path),
        "policy_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def plan_provenance(spec: EnvSpec, cluster: Cluster | None = None) -> dict[str, Any]:
    """The ``meta`` every plan file written by a runner carries: env, model, cluster, graph
    file; with ``cluster`` read from a calibration file (``cpu_N@PATH``), the
    ``calibration_sha256`` of its figures, so that ``runners.execute`` can tell a file
    profiled again since the plan was made from an edited plan."""
    out: dict[str, Any] = {"env": spec.name, "cluster": absolute_cluster_name(spec.cluster)}
    digest = cluster.meta.get("calibration_sha256") if cluster is not None else None
    if digest and isinstance(spec.cluster, str) and "@" in spec.cluster:
        out["calibration_sha256"] = str(digest)
    if spec.memory_fraction < 1:  # the cluster the plan's hash was taken of (execute applies it)
        out["memory_fraction"] = float(spec.memory_fraction)
    model = model_spec(spec)
    if model is not None:
        out["model"] = model
    if spec.graph_file:
        out["graph_file"] = str(Path(spec.graph_file).expanduser().resolve())
    return out


def absolute_cluster_name(name: Any) -> Any:
    """``cpu_N@PATH`` with ``PATH`` made absolute (and other names as they are), so that a
    plan file names a calibration that ``runners.execute`` finds from any folder: a relative
    path was stored as typed, and failed with "no such file" run from elsewhere."""
    if not isinstance(name, str) or "@" not in name:
        return name
    base, path = name.split("@", 1)
    if not path:
        return name
    return f"{base}@{Path(path).expanduser().resolve()}"


def load_graph(spec: EnvSpec) -> CompGraph:
    """The env's graph: ``graph_file`` (devplace JSON), else the ``model``.

    ``model`` is a zoo name (built and disk-cached by ``graphs.zoo``) or a factory by
    import path, ``package.module:function`` (called with ``model_config`` as keywords,
    extracted with ``torch.export``); both coarsened to ``max_groups``.
    """
    if spec.graph_file:
        from graphs import io as gio

        graph = gio.load(spec.graph_file)
        if spec.max_groups and graph.num_groups > spec.max_groups:
            from graphs import clusters
            from graphs.coarsening import coarsen, fill_times

            # partly measured times: the unmeasured nodes' roofline on the env's cluster first
            graph = coarsen(fill_times(graph, clusters.load(spec.cluster)), spec.max_groups)
        return graph
    model = model_spec(spec)
    if model is None:
        raise ValueError(
            f"env {spec.name!r}: set either 'model' (a zoo name or 'package.module:function') "
            "or 'graph_file'"
        )
    from runtime.model import graph_for_model

    if "factory" not in model:
        return graph_for_model(model)
    try:
        return graph_for_model(model)
    except (ValueError, TypeError) as exc:
        hint = ""
        if "cannot be imported" in str(exc):
            hint = " (the module must be importable: installed, or on PYTHONPATH or in the current folder)"
        raise ValueError(
            f"env {spec.name!r}: model {spec.model!r} with model_config "
            f"{dict(spec.model_config)} could not be built and extracted: {exc}{hint}"
        ) from exc


def oracle_factory(spec: EnvSpec) -> OracleFactory:
    """``(graph, cluster) -> Oracle`` for the env's ``oracle`` (``simulator`` or ``profiled``)."""
    opts = dict(spec.oracle_options)
    if spec.oracle == "simulator":
        from placement_env.envs.base import SimulatorFactory

        if opts:
            raise ValueError(
                f"env {spec.name!r}: oracle_options {sorted(opts)} are for the profiled oracle; "
                "the simulator takes microbatches, schedule and objective only"
            )
        return SimulatorFactory(spec.microbatches, spec.schedule, spec.objective)
    if spec.oracle == "profiled":
        import dataclasses
        import inspect

        from placement_env.oracles.profiled import ProfiledOracle
        from runtime.spec import RunSpec

        own = set(inspect.signature(ProfiledOracle.__init__).parameters) - {
            "self", "graph", "cluster", "model", "microbatches", "schedule", "cache",
            "execute_options",
        }  # fmt: skip
        # the runtime sets these from the plan and the env (a value here collided with it)
        from_plan = {
            "mode", "world_size", "devices", "model", "device_of", "stage_of", "stage_rank",
            "tp_degree", "tp_modules", "microbatches", "schedule", "plan_hash", "hybrid",
        }  # fmt: skip
        fields = {f.name for f in dataclasses.fields(RunSpec)} - from_plan
        valid = sorted(own | fields)
        unknown = sorted(k for k in opts if k not in valid)
        if unknown:  # a TypeError from inside RunSpec (found by fuzzing)
            raise ValueError(
                f"env {spec.name!r}: env.oracle_options {unknown} are not options of the "
                f"profiled oracle; valid: {valid}"
            )
        from graphs.schema import is_whole

        for k, v in opts.items():  # taken silently before: 2.5 steps ran 2, "maybe" was true
            if k in ("steps", "warmup", "threads", "seed") and not is_whole(v, floats=False):
                raise ValueError(
                    f"env {spec.name!r}: env.oracle_options.{k} = {v!r}; expected an integer"
                )
            if k in ("predict_oom", "capture_grads") and not isinstance(v, bool):
                raise ValueError(
                    f"env {spec.name!r}: env.oracle_options.{k} = {v!r}; expected true or false"
                )
            if k == "cache_dir" and v is not None and not (isinstance(v, str) and v):
                raise ValueError(
                    f"env {spec.name!r}: env.oracle_options.cache_dir = {v!r}; expected a "
                    "folder path or null"
                )
        probe = {k: v for k, v in opts.items() if k in fields}
        try:  # a bad value used to fail at the first plan scored, named as RunSpec's field
            RunSpec(mode="oplevel", world_size=1, devices=[0], model={}, **probe).validate()
        except (ValueError, TypeError) as exc:
            raise ValueError(f"env {spec.name!r}: env.oracle_options {probe}: {exc}") from None
        return ProfiledFactory(
            spec.model or "", dict(spec.model_config), opts, spec.microbatches, spec.schedule
        )
    raise ValueError(
        f"env {spec.name!r}: unknown oracle {spec.oracle!r}; expected 'simulator' or 'profiled'"
    )


@dataclass(frozen=True)
class ProfiledFactory:
    """``(graph, cluster) -> ProfiledOracle`` for ``model`` (picklable, for checkpoints).

    ``model`` is a zoo name or a factory's import path (``pkg.mod:fn``), as in the env.

    Plain placements run with the env's ``microbatches`` and ``schedule``. Every oracle
    it makes shares one result cache (``cache``), so a plan is executed once per run:
    a baseline's plan re-scored for the report, or met again by the agent, is not re-run.
    """

    model: str
    model_config: Mapping[str, Any]
    options: Mapping[str, Any]
    microbatches: int = 1
    schedule: str = "1f1b"
    cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, graph: CompGraph, cluster: Cluster) -> Any:
        from placement_env.oracles.profiled import ProfiledOracle

        key = "factory" if is_factory(self.model) else "name"
        model = {key: self.model, "config": dict(self.model_config)}
        return ProfiledOracle(
            graph,
            cluster,
            model=model,
            microbatches=self.microbatches,
            schedule=self.schedule,
            cache=self.cache,
            **dict(self.options),
        )


def lower_bound(problem: Problem) -> float:
    """The problem's lower bound from a simulator on its graph and cluster (nothing is executed).

    The env's microbatches, schedule and objective; for a calibrated ``cpu_N@PATH``
    cluster this is the calibrated simulator's bound, also for the profiled oracle.
    """
    from placement_env.oracles.simulator import Simulator

    s = problem.spec
    sim = Simulator(
        problem.graph,
        problem.cluster,
        microbatches=s.microbatches,
        schedule=s.schedule,
        objective=s.objective,
    )
    return float(sim.lower_bound())


#: The env id of hybrid (data / tensor / pipeline parallel) plans.
HYBRID_ENV_ID = "placement_env/Hybrid-v0"


def build_problem(spec: EnvSpec) -> Problem:
    """Load the graph and cluster of ``spec`` and pair them with its oracle factory."""
    from graphs import clusters

    graph = load_graph(spec)
    cluster = clusters.load(spec.cluster).with_memory_fraction(spec.memory_fraction)
    if spec.env_id != HYBRID_ENV_ID:  # hybrid plans shard the state (ZeRO): not this bound
        from graphs.plan import check_microbatches
        from placement_env.oracles.simulator import memory_floor

        try:  # scored as fractional microbatches, then refused by runners.execute (fuzzing)
            check_microbatches(
                graph, spec.microbatches, "env.microbatches",
                " (set env.microbatches to a divisor, or the batch in env.model_config)",
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"env {spec.name!r}: {exc}") from None

        why = memory_floor(graph, cluster, spec.microbatches, spec.objective)
        if why is not None:
            share = (
                f", let plans use more than env.memory_fraction={spec.memory_fraction:g} of "
                "each device's memory"
                if spec.memory_fraction < 1
                else ""
            )
            raise ValueError(
                f"env {spec.name!r}: no placement can fit: {why}. Make the model smaller "
                "(env.model_config, e.g. its n_layer), give it a larger cluster (env.cluster)"
                f"{share}, or plan it in the hybrid plan space, whose ZeRO stages shard that "
                "state (env_id placement_env/Hybrid-v0, e.g. +env=gpt2_8gpu_hybrid)"
            )
    return Problem(spec, graph, cluster, oracle_factory(spec))


# -------------------------------------------------------------------- baselines
@dataclass
class BaselineOutcome:
    """One baseline's answer on the problem (``step_time`` None when it found no plan)."""

    name: str
    step_time: float | None
    oracle_calls: int
    seconds: float
    oom: bool = False
    error: str | None = None
    plan: Plan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time": self.step_time,
            "oracle_calls": self.oracle_calls,
            "seconds": self.seconds,
            "oom": self.oom,
            "error": self.error,
        }


def check_model_meta(model: Any, source: str = "the plan", path: str = "meta.model") -> None:
    """``plan.meta.model`` as runners write it -- ``{"name": zoo name | "factory":
    "pkg.mod:fn", "config": {...}, "max_groups": K}`` -- or ``ValueError`` naming the field
    (an edited file failed with AttributeError / TypeError tracebacks)."""
    from graphs.schema import Fields

    f = Fields(source)
    m = f.obj(model, path, optional=("name", "factory", "config", "max_groups"))
    if ("name" in m) == ("factory" in m):
        raise f.fail(path, f"has keys {sorted(m)}; expected one of 'name' or 'factory'")
    key = "name" if "name" in m else "factory"
    f.string(m[key], f"{path}.{key}")
    if m.get("config") is not None:
        f.obj(m["config"], f"{path}.config", free=True)
    if m.get("max_groups") is not None:
        f.integer(m["max_groups"], f"{path}.max_groups", lo=1)


def read_baselines(path: str | Path) -> dict[str, BaselineOutcome]:
    """``baselines.json`` of a run (what ``BaselineOutcome.to_dict`` wrote), read strictly: a
    negative or non-finite step time, a wrong type or a missing field is a ``ValueError``
    naming the file and the field (a resumed run used to take them, e.g. a speed-up of
    x-0.34 from a negative step time)."""
    from graphs.schema import Fields, read_json

    f = Fields(path)
    data = f.obj(read_json(path), "", free=True)
    keys = ("step_time", "oracle_calls", "seconds", "oom", "error")
    out = {}
    for name, d in data.items():
        f.obj(d, name, required=keys)
        t = d["step_time"]
        out[name] = BaselineOutcome(
            name,
            None if t is None else f.number(t, f"{name}.step_time", lo=0, lo_open=True),
            f.integer(d["oracle_calls"], f"{name}.oracle_calls", lo=0),
            f.number(d["seconds"], f"{name}.seconds", lo=0),
            f.boolean(d["oom"], f"{name}.oom"),
            None if d["error"] is None else f.text(d["error"], f"{name}.error"),
        )
    return out


#: The positional arguments every baseline takes: ``(graph, cluster, oracle, budget)``.
BASELINE_ARGS = 4


def baseline_option_names(fn: Callable[..., Any]) -> list[str] | None:
    """The options (keywords beyond the positional arguments and ``seed``) baseline ``fn`` takes.

    ``None`` when any keyword goes (``**kwargs``) or ``fn`` has no signature to read.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    taken = [p.name for p in params.values() if p.kind in positional][:BASELINE_ARGS]
    return sorted(set(params) - set(taken) - {"seed"})


def check_baseline_options(name: str, options: Mapping[str, Any] | None) -> None:
    """``ValueError`` naming baseline ``name``, the options it does not take and the valid ones.

    The run's seed is not an option: it is passed to the baselines that take one.
    """
    from agents import baselines

    _refuse_unknown_options(name, baselines.get(name), options or {})


def _refuse_unknown_options(name: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    valid = baseline_option_names(fn)
    unknown = sorted(set(options) - set(valid)) if valid is not None else []
    if unknown:
        raise ValueError(
            f"baseline {name!r} has no option(s) {unknown}; valid options: {valid or 'none'}"
            + (" (the run's seed is set with seed=, not as an option)" if "seed" in unknown else "")
        )


def _call_with_options(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    options: Mapping[str, Any],
    *,
    name: str,
    seed: int,
) -> Any:
    """Call baseline ``fn`` (called ``name``) with ``args``, ``options``, and ``seed`` if it takes one.

    Unknown options are refused first, naming the valid ones.
    """
    _refuse_unknown_options(name, fn, options)
    kw = dict(options)
    if baseline_option_names(fn) is None or "seed" in inspect.signature(fn).parameters:
        kw["seed"] = seed
    return fn(*args, **kw)


def run_baseline(
    problem: Problem,
    name: str,
    budget: int | None,
    *,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> BaselineOutcome:
    """Run baseline ``name`` with a fresh oracle; infeasibility is recorded, not raised."""
    from agents import baselines

    fn = baselines.get(name)
    oracle = problem.oracle()
    t0 = time.perf_counter()
    try:
        plan = _call_with_options(
            fn,
            (problem.graph, problem.cluster, oracle, budget),
            options or {},
            name=name,
            seed=seed,
        )
    except baselines.InfeasiblePlanError as exc:
        oom = bool(getattr(exc, "oom", True))  # False: the plan cannot run (e.g. ranks failed)
        return BaselineOutcome(
            name, None, int(oracle.calls), time.perf_counter() - t0, oom=oom, error=str(exc)
        )
    seconds = time.perf_counter() - t0
    res = problem.oracle().evaluate(plan)
    # an infeasible plan (e.g. the profiled runtime's ranks failed) is the baseline failing
    ok = res.feasible and math.isfinite(res.step_time)
    return BaselineOutcome(
        name,
        float(res.step_time) if ok else None,
        int(plan.meta.get("oracle_calls", oracle.calls)),
        float(plan.meta.get("search_seconds", seconds)),
        oom=bool(res.oom),
        error=None if ok else (res.infeasible_reason or res.extra.get("oom")),
        plan=plan,
    )


def planner_time_limit(name: str, options: Mapping[str, Any] | None = None) -> float | None:
    """Seconds baseline ``name`` may search: ``options["time_limit"]`` or its signature's
    default (None when it has no time limit, or none is set)."""
    from agents import baselines

    if options and options.get("time_limit") is not None:
        v = options["time_limit"]
        # a bad value is the planner's to refuse, by its own name and rule
        return float(v) if is_number(v, 0, lo_open=True) else None
    try:
        p = inspect.signature(baselines.get(name)).parameters.get("time_limit")
    except (TypeError, ValueError):  # pragma: no cover - a planner without a signature
        return None
    d = None if p is None else p.default
    return float(d) if is_number(d) else None


def planner_report(
    name: str, meta: Mapping[str, Any], *, objective: str, step_time: float | None
) -> str | None:
    """One line on what an exact planner proved of its plan (``plan.meta``): ``ilp``'s
    incumbent, HiGHS bound and MIP gap; ``ideal_dp``'s / ``ideal_dp_makespan``'s exactness
    or the limit that stopped it; and, where the planner optimised another objective than
    the env's (``ilp`` and ``ideal_dp`` optimise max-load), what the env scores. None for
    planners that report no proof."""
    parts: list[str] = []
    own = meta.get("objective")
    if "mip_gap" in meta:
        gap = meta["mip_gap"]
        if not is_number(gap):
            proof = "no gap"
        elif gap <= 1e-9:
            proof = "proven optimal"
        else:
            proof = f"MIP gap {100 * float(gap):.1f} %"
        parts.append(
            f"{own or 'max_load'} {ms(meta.get('ilp_objective'))}, HiGHS bound "
            f"{ms(meta.get('ilp_bound'))}, {proof} ({meta.get('ilp_status', '?')}, "
            f"{float(meta.get('ilp_seconds', 0.0)):.0f} s)"
        )
    elif "optimal_among" in meta or "surrogate_objective" in meta:
        value = meta.get("dp_objective", meta.get("surrogate_objective"))
        what = (
            own or "max_load"
            if "dp_objective" in meta
            else f"pipeline estimate {meta.get('surrogate') or 'T'}"
        )
        parts.append(f"{what} {ms(value)}")
        if meta.get("exact"):
            parts.append(f"exact among {meta.get('optimal_among') or 'contiguous splits'}")
        else:
            status = meta.get("status", "?")
            bound = meta.get("dp_lower_bound", meta.get("surrogate_lower_bound"))
            reached = meta.get("ideals")
            total = meta.get("ideals_total")
            parts.append(
                f"not proven optimal (status {status}"
                + (f", lower bound {ms(bound)}" if bound is not None else "")
                + (f", {int(reached):,} ideals reached" if is_number(reached) else "")
                + (f" of {float(total):.3g}" if is_number(reached) and is_number(total) else "")
                + ")"
            )
    else:
        return None
    if own and own != objective and step_time is not None:
        parts.append(f"the env scores {objective}: {ms(step_time)}")
    return f"{name}: " + "; ".join(parts)


def run_baselines(
    problem: Problem,
    names: list[str] | tuple[str, ...],
    budget: int | None,
    *,
    seed: int = 0,
    echo: Callable[[str], None] | None = print,
) -> dict[str, BaselineOutcome]:
    """Run every baseline in ``names`` (the run's reference), in order."""
    out: dict[str, BaselineOutcome] = {}
    for name in names:
        o = run_baseline(problem, name, budget, seed=seed)
        out[name] = o
        if echo is not None:
            shown = f"{o.step_time * 1e3:9.2f} ms" if o.step_time is not None else "  no plan  "
            why = f": {first_line(o.error, name)}" if o.step_time is None and o.error else ""
            echo(f"baseline {name:<13} {shown}  ({o.oracle_calls} calls, {o.seconds:.1f} s){why}")
    return out


def first_line(text: str, who: str = "", limit: int = 300) -> str:
    """The first line of ``text`` without a leading ``"who: "``, cut to ``limit`` characters
    (a planner's reason on a terminal line)."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    if who and line.startswith(f"{who}: "):
        line = line[len(who) + 2 :]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def speedups(best: float | None, baselines: Mapping[str, BaselineOutcome]) -> dict[str, float]:
    """``{name: baseline step time / best}`` (> 1: the agent is faster) for baselines with a plan."""
    if best is None or not math.isfinite(best) or best <= 0:
        return {}
    return {n: o.step_time / best for n, o in baselines.items() if o.step_time is not None}


# -------------------------------------------------------------------- artefacts
def write_plan_artifacts(
    problem: Problem, plan: Plan, run_dir: Path, stem: str = "best_plan"
) -> Any:
    """Write ``STEM.json``, a Gantt PNG and a Chrome trace of ``plan``; return its SimResult.

    A result without a schedule (the profiled oracle measures per-rank totals, not a
    timeline) gets ``STEM_timeline.txt``, a one-line note saying so, instead of the Gantt
    and trace, and its measurement as ``STEM_measured.json``.
    """
    from placement_env.oracles import trace

    plan.save(run_dir / f"{stem}.json")
    result = problem.oracle().evaluate(plan, record=True)
    if result.events is None:
        measured = result.extra.get("measured")
        note = f"no timeline for {stem}.json: the {problem.spec.oracle} oracle records no schedule"
        if measured:
            note += f"; per-rank compute/comm/idle seconds are in {stem}_measured.json"
        write_bytes_atomic(run_dir / f"{stem}_timeline.txt", (note + "\n").encode())
        if measured:
            write_json(run_dir / f"{stem}_measured.json", measured)
        return result
    trace.plot_gantt(result, problem.graph, problem.cluster, run_dir / f"{stem}_gantt.png")
    trace.write_chrome_trace(result, problem.graph, problem.cluster, run_dir / f"{stem}_trace.json")
    return result


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (temp file + rename); NaN/inf become null."""
    write_bytes_atomic(Path(path), json.dumps(_finite(data), indent=1).encode())


def save_figure(fig: Any, path: str | Path, *, dpi: int = 100, title: str | None = None) -> Path:
    """Write a matplotlib figure as a PNG (``title`` as its small suptitle; folders
    created) and close it; the path written."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old or the new file, never half of one.

    The file gets the mode a plain ``open(path, "w")`` would give it (0666 less the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, np.ndarray):
        return _finite(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - SB3 draws minibatches from the global RNG
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


def run_dir_from_hydra(fallback: str | None) -> Path:
    """The hydra run (or multirun job) directory, or ``fallback`` outside hydra."""
    if fallback:
        p = Path(fallback)
    else:
        from hydra.core.hydra_config import HydraConfig

        p = Path(HydraConfig.get().runtime.output_dir)
    p.mkdir(parents=True, exist_ok=True)
    return p


#: Errors a user can fix from the message alone: reported in one line, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, KeyError)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM (:func:`exit_on_sigterm`), so that ``finally``
    blocks and context managers run: the launchers kill their ranks, temporary folders go."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def exit_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` in this (main) thread. Python's default ends
    the process at once, which left a run's ranks, fork server and temporary folders behind
    (found by fuzzing, 29 Nov 2026)."""
    import signal

    def _raise(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, _raise)


@contextmanager
def reported_errors(run_dir: Path | None, app: str) -> Iterator[None]:
    """Run a runner's body so that a failure is reported, not dumped.

    A user error (:data:`USER_ERRORS`, a failed rank of an executed plan) prints one
    ``error: ...`` line and exits with status 2; any other exception keeps its
    traceback. Either way the run folder is left with ``error.txt`` saying why (the
    message, then the traceback), and the message goes to the run's log file.

    The runner holds the folder's lock (:mod:`runners.folder_lock`) meanwhile: a second
    runner on the same folder exits with status 2 naming the first, and writes nothing there.
    """
    from runners import folder_lock

    stack = ExitStack()
    if run_dir is not None:  # one runner at a time writes a folder; the second is refused
        try:  # before it writes anything there (not even error.txt: the folder is the other's)
            stack.enter_context(folder_lock.held(run_dir, app))
        except ValueError as exc:  # folder_lock.FolderInUse, or a lock file that is a folder
            sys.stderr.write(f"error: {exc}\n")
            raise SystemExit(2) from None
    with stack:
        try:
            yield from _reported(run_dir, app)
        except BaseException:  # the earlier run's .hydra/ back, if the folder is still its
            if run_dir is not None:
                folder_lock.put_back_hydra(run_dir)
            raise
        if run_dir is not None:
            folder_lock.forget_hydra(run_dir)


def _reported(run_dir: Path | None, app: str) -> Iterator[None]:
    if run_dir is not None:  # a resumed run: the failure of the attempt before is its log's
        (run_dir / "error.txt").unlink(missing_ok=True)  # now (it stayed beside result.json)
    try:
        yield
    except (Terminated, KeyboardInterrupt) as exc:
        interrupted(exc, run_dir, app)
    except SystemError as exc:
        # a signal that arrives inside numba-compiled code (the simulator's kernels) comes
        # out as "SystemError: CPUDispatcher(...) returned a result with an exception set",
        # the signal's exception its cause: a traceback and exit 1 (fuzzing, 2 Dec 2026)
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (Terminated, KeyboardInterrupt)):
            interrupted(cause, run_dir, app)
        _record_failure(run_dir, app, f"{type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        if not _user_error(exc):
            _record_failure(run_dir, app, f"{type(exc).__name__}: {exc}")
            raise
        msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        _record_failure(run_dir, app, f"{type(exc).__name__}: {msg}")
        sys.stderr.write(f"error: {msg}\n")
        raise SystemExit(2) from None


def interrupted(exc: BaseException, run_dir: Path | None, app: str) -> NoReturn:
    """One line, ``error.txt`` and the signal's exit status for SIGTERM (kill, a SLURM
    cancel: :class:`Terminated`, so the launchers' cleanup stops the ranks, which a plain
    SIGTERM skipped) and Ctrl-C (it was a traceback, no error.txt, no log line: fuzzing)."""
    if isinstance(exc, Terminated):
        _record_failure(run_dir, app, f"terminated by signal {exc.signum}")
        sys.stderr.write(f"error: runners.{app} terminated by signal {exc.signum}\n")
        raise SystemExit(128 + exc.signum) from None
    _record_failure(run_dir, app, "interrupted (Ctrl-C)")
    hint = ""
    if app == "train" and run_dir is not None:
        from runners.earlier_run import GIVEN_BACK

        if os.path.realpath(run_dir) in GIVEN_BACK:  # resume= would continue the earlier run
            hint = f"; before its first checkpoint: the earlier run in {run_dir} is put back"
        else:
            hint = f"; python -m runners.train resume={run_dir} continues it"
    sys.stderr.write(f"error: runners.{app} interrupted (Ctrl-C){hint}\n")
    raise SystemExit(130) from None


def _user_error(exc: BaseException) -> bool:
    """A :data:`USER_ERRORS` or a failed rank. ``runtime.launch`` (which imports torch, seconds)
    is looked up, not imported: a rank can only have failed where it was loaded, and a bad
    setting is reported before torch is imported."""
    launch = sys.modules.get("runtime.launch")
    return isinstance(exc, USER_ERRORS) or (
        launch is not None and isinstance(exc, launch.RankFailure)
    )


def _record_failure(run_dir: Path | None, app: str, message: str) -> None:
    import traceback

    if run_dir is None or not run_dir.is_dir():
        return
    RunLog(run_dir, app)(f"error: {message}", echo=False)
    text = f"runners.{app} failed: {message}\n\n{traceback.format_exc()}"
    (run_dir / "error.txt").write_text(text)


@dataclass(frozen=True)
class RunLog:
    """A runner's ``echo``: each line is printed and appended, time-stamped, to
    ``RUN_DIR/APP.log`` (``train.log``, ``plan.log``, ...), so the run folder keeps what the
    terminal showed."""

    run_dir: Path
    app: str

    @property
    def path(self) -> Path:
        return self.run_dir / f"{self.app}.log"

    def __call__(self, line: str, *, echo: bool = True) -> None:
        if echo:
            print(line, flush=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}\n")


def ms(seconds: float | None) -> str:
    """``12.34 ms`` or ``n/a``."""
    return "n/a" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.2f} ms"
