"""``python -m runners.train +env=NAME``: baselines first, then the agent's search, then the files.

Writes into the hydra run directory: ``config.yaml`` (resolved), ``baselines.json``,
``result.json``, ``best_plan.json`` with its Gantt PNG and Chrome trace, ``policy.pt``
(PPO agents on the op-placement envs; on ``Hybrid-v0`` PPO writes no policy file),
``checkpoint.pkl`` (every ``train.checkpoint_every`` updates), and the
logger's files. ``resume=RUN_DIR`` continues a killed run from its last checkpoint.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from agents import search
from graphs.schema import is_number
from runners import checkpoint, common, earlier_run, schema
from runners.tracking import NullTracker, make_tracker

schema.register()


class CrashForTest(RuntimeError):
    """Raised by the ``train.crash_after_updates`` hook (a stand-in for a killed run)."""


# ------------------------------------------------------------------ search state
@dataclass
class SearchOutcome:
    """What the agent found on the run's problem."""

    placement: np.ndarray | None
    step_time: float | None
    oracle_calls: int
    history: list[tuple[int, int, float]] = field(default_factory=list)  # (timesteps, calls, best)
    timesteps: int = 0
    policy_path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    plan: Any = None  # the baseline's Plan (kept for hybrid plans: their layout is the answer)


#: The envs whose episodes can start from a per-node placement (``init=`` an array): the
#: ones ``agent.warm_start`` applies to. OneShot-v0 takes no ``init`` and Stage-v0 a name
#: only: warm-starting them failed after every baseline, blamed on ``env.env_kwargs {}``
#: (found by fuzzing, 29 Nov 2026); they now train cold.
WARM_START_ENVS = ("placement_env/Sweep-v0", "placement_env/Reassign-v0")


def _make_runner_callback(
    *,
    run_dir: Path,
    total: int,
    seconds: float | None,
    checkpoint_every: int,
    crash_after: int | None,
    progress: bool,
    tracker: NullTracker,
    references: Mapping[str, float],
    best: Any,
    log_every: int,
    save_extra: Callable[[], dict[str, Any]],
    label: str = "best",
) -> Any:
    """The SB3 callback that drives the run: progress bar (``label``: what its best step time
    is of), logging, budget, checkpoints."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RunnerCallback(BaseCallback):
        """Progress bar with the best step time, metrics, wall-clock budget, checkpoints."""

        live_attrs = ("_pbar", "_tracker", "_best", "_t0", "_save_extra")

        def __init__(self) -> None:
            super().__init__()
            self.updates = 0  # PPO updates completed
            self.elapsed_before = 0.0  # wall seconds of earlier (killed) sessions
            self.step_times: list[float] = []  # oracle step times seen in this rollout
            self._pbar: Any = None
            self._tracker = tracker
            self._best = best
            self._t0 = time.perf_counter()
            self._save_extra = save_extra

        # wall seconds of the whole run, across resumes
        def elapsed(self) -> float:
            return self.elapsed_before + time.perf_counter() - self._t0

        def _on_training_start(self) -> None:
            self._t0 = time.perf_counter()
            if progress:
                from tqdm.auto import tqdm

                self._pbar = tqdm(
                    total=total,
                    initial=self.model.num_timesteps,
                    unit="step",
                    desc="train",
                    mininterval=0.5,
                    dynamic_ncols=True,
                )

        def _on_rollout_start(self) -> None:
            # Between two PPO updates: the only place a checkpoint is exact.
            if self.updates and checkpoint_every and self.updates % checkpoint_every == 0:
                if getattr(self, "_saved_at", -1) != self.updates:
                    self._saved_at = self.updates
                    self.elapsed_before, self._t0 = self.elapsed(), time.perf_counter()
                    checkpoint.save(
                        run_dir,
                        self.model,
                        callbacks=[self, self._best],
                        extra=self._save_extra(),
                    )
                    settle(run_dir)  # the folder is this run's now: the earlier one's go
            if crash_after is not None and self.updates >= crash_after:
                raise CrashForTest(f"train.crash_after_updates={crash_after} reached")

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", ()):
                st = info.get("step_time")
                if st is not None and not info.get("oom", False) and math.isfinite(st):
                    self.step_times.append(float(st))
            if self._pbar is not None:
                self._pbar.update(self.model.n_envs)
                b = _best_step_time(self._best)
                if b is not None:
                    self._pbar.set_postfix_str(f"{label} {b * 1e3:.2f} ms", refresh=False)
            return seconds is None or self.elapsed() < seconds

        def _on_rollout_end(self) -> None:
            self.updates += 1
            if self.updates % max(1, log_every) == 0:
                m: dict[str, float] = {f"reference/{k}": v for k, v in references.items()}
                if self.step_times:
                    m["placement/step_time"] = float(np.mean(self.step_times))
                    m["placement/step_time_min"] = float(np.min(self.step_times))
                b = _best_step_time(self._best)
                if b is not None:  # a generator run's best is of its sampled training graphs
                    m[self._best.log_key] = b
                m["placement/oracle_calls"] = float(_oracle_calls(self._best, self.model))
                m["charts/wall_seconds"] = self.elapsed()
                self._tracker.log(m, self.model.num_timesteps)
            self.step_times = []

        def _on_training_end(self) -> None:
            if self._pbar is not None:
                self._pbar.close()
                self._pbar = None

    return RunnerCallback()


def _best_step_time(tracker: Any) -> float | None:
    v = getattr(tracker, "best_step_time", None)
    return None if v is None or not math.isfinite(v) else float(v)


def _oracle_calls(tracker: Any, model: Any) -> int:
    v = getattr(tracker, "oracle_calls", None)
    if v is not None:
        return int(v)
    try:
        return int(sum(model.get_env().get_attr("total_oracle_calls")))
    except Exception:  # noqa: BLE001 - a best-effort count for logging only
        return 0


# ---------------------------------------------------------------------- PPO
def _make_env(env_id: str, generator: Any, oracle_factory: Any, env_kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    from placement_env import creator_error  # (importing it registers the ids)

    try:
        return gym.make(env_id, generator=generator, oracle_factory=oracle_factory, **env_kwargs)
    except (TypeError, ValueError) as exc:  # a bad env.env_kwargs value, e.g. oom_penalty=abc
        shown = {k: v for k, v in env_kwargs.items() if k != "init"}
        raise ValueError(
            f"env.env_kwargs: {env_id} refused the options {shown}: {creator_error(exc)}"
        ) from None


def check_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    """Refuse an ``env.env_kwargs`` key the env class does not take, naming the valid ones
    (gymnasium raised a ``TypeError`` with a traceback from inside the vectorised env)."""
    import gymnasium as gym

    from placement_env import env_keywords

    ids = sorted(k for k in gym.registry if k.startswith("placement_env/"))
    if env_id not in ids:  # gymnasium's NameNotFound came with a traceback (found by fuzzing)
        raise ValueError(f"env.env_id {env_id!r} is not a devplace env; valid: {ids}")
    takes = env_keywords(env_id)
    if takes is None:
        return
    injected = ("self", "generator", "oracle_factory")  # the runner passes these itself
    valid = sorted(k for k in takes if k not in injected)
    bad = sorted(str(k) for k in env_kwargs if k not in valid)
    if bad:
        raise ValueError(f"env.env_kwargs: {env_id} takes no option(s) {bad}; valid: {valid}")


def check_config(cfg: DictConfig) -> common.EnvSpec:
    """The checks of a train config that need no problem built (seconds at most): the env's
    keys and options, its generator, the agent's options; the env spec. ``runners.evaluate``
    runs them on every cell before the first cell trains."""
    spec = common.env_spec(cfg.env)
    check_env_kwargs(spec.env_id, spec.env_kwargs)
    check_generator(spec)
    agent_cfg = common.to_plain(cfg.agent)
    if agent_cfg["kind"] == "ppo" and (agent_cfg.get("options") or agent_cfg.get("budget")):
        raise ValueError(  # both were ignored without a word (found by fuzzing)
            f"agent {agent_cfg.get('name')!r} (PPO) takes no agent.options "
            f"({agent_cfg.get('options') or {}}) or agent.budget ({agent_cfg.get('budget')}): "
            "its budget is train.timesteps / train.seconds and its settings agent.ppo.*"
        )
    if agent_cfg["kind"] in ("ppo", "finetune"):
        check_ppo_extra((agent_cfg.get("ppo") or {}).get("extra"))
    hybrid = spec.env_id == common.HYBRID_ENV_ID
    # an op planner on a hybrid env, or a hybrid planner on an op env, used to run and be
    # scored by the other model; these and a bad fine-tuning option are refused before the
    # init policy's network is loaded (seconds: it was the slowest of these checks)
    check_hybrid_planners(spec.name, agent_cfg, spec.baselines, hybrid)
    check_finetune_agent(spec.name, agent_cfg, common.to_plain(cfg.get("train") or {}), hybrid)
    if agent_cfg["kind"] in ("ppo", "finetune") and not hybrid:
        check_init_policy_network(agent_cfg)
    if agent_cfg["kind"] == "baseline":  # refuse a misspelled option before any work
        common.check_baseline_options(
            agent_cfg.get("baseline") or agent_cfg["name"], agent_cfg.get("options")
        )
    return spec


def check_generator(spec: common.EnvSpec) -> None:
    """Build ``env.generator`` once before any baseline runs: a bad option (an unknown
    cluster in ``env.generator_options.clusters``) used to fail at PPO's first episode,
    minutes later, blamed on ``env.env_kwargs`` (found by fuzzing)."""
    if spec.generator == "fixed":
        return
    from placement_env import generators

    if "kind" in spec.generator_options:  # replaced by env.generator without a word (fuzzing)
        raise ValueError(
            f"env.generator_options.kind = {spec.generator_options['kind']!r}: the generator is "
            f"env.generator ({spec.generator!r}); a synthetic graph's kind is graph_kind"
        )
    try:
        gen = generators.make_generator({**dict(spec.generator_options), "kind": spec.generator})
        gen.bounds()  # every graph of a zoo / files generator loaded (its padding)
        gen.sample(np.random.default_rng(0))  # a sampler's own limits (min_ops=1)
    except (ValueError, TypeError, OSError, KeyError) as exc:
        raise ValueError(
            f"env.generator={spec.generator!r} / env.generator_options: {exc}"
        ) from None


def env_factory(
    problem: common.Problem,
    *,
    init_placement: np.ndarray | None = None,
    env_defaults: Mapping[str, Any] | None = None,
) -> Callable[[], Any]:
    """A picklable ``() -> gym.Env`` for ``problem.spec`` (generator and oracle injected).

    ``init_placement`` (a per-node placement of the problem's graph) warm-starts every
    episode from that plan; only for a fixed problem. ``env_defaults`` are env keywords
    used where ``spec.env_kwargs`` does not set them.
    """
    from placement_env import generators

    spec = problem.spec  # its env_kwargs keys: checked by train() before any work
    kwargs = {**dict(env_defaults or {}), **dict(spec.env_kwargs)}
    if spec.generator == "fixed":
        gen = generators.fixed(problem.graph, problem.cluster)
        if init_placement is not None:
            kwargs["init"] = np.asarray(init_placement, dtype=np.int64)
    else:
        # the env's ``generator`` names the kind; its options may not override it
        gen = generators.make_generator({**dict(spec.generator_options), "kind": spec.generator})
    return functools.partial(_make_env, spec.env_id, gen, problem.oracle_factory, kwargs)


def init_policy_plan(
    problem: common.Problem, agent_cfg: Mapping[str, Any], *, seed: int
) -> Candidates:
    """The zero-shot plan of ``agent.init_policy`` on ``problem`` as a warm-start candidate,
    ``plans = {"zero_shot:NAME": (step time or None, placement)}`` (the policy's own ``plan``:
    its default samples, seeded by ``seed``), with the oracle calls it took (its samples and
    the check below), which the search's own count leaves out; no plans without an init
    policy. An infeasible plan is a candidate with no step time (never chosen)."""
    init = agent_cfg.get("init_policy")
    if not init:
        return Candidates({})
    import agents
    from agents.baselines import InfeasiblePlanError

    spec = problem.spec
    oracle = problem.oracle_factory(problem.graph, problem.cluster)
    policy = agents.load_policy(str(init))
    key = f"zero_shot:{init}"
    try:  # as runners.plan plans: the policy's default samples (1024 for the generalist;
        # ExportedPolicy.plan's own default is 1, which gave a much slower start)
        plan = policy.plan(
            problem.graph, problem.cluster, microbatches=spec.microbatches,
            schedule=spec.schedule, samples=policy.default_samples(), oracle=oracle, seed=seed,
        )  # fmt: skip
    except InfeasiblePlanError:
        return Candidates({key: (None, None)}, _calls_of(oracle))
    res = oracle.evaluate(plan.placement)
    t = None if res.oom or not math.isfinite(res.step_time) else float(res.step_time)
    return Candidates({key: (t, np.asarray(plan.placement, dtype=np.int64))}, _calls_of(oracle))


class Candidates(NamedTuple):
    """Warm-start candidates besides the baselines' (:func:`init_policy_plan`): ``plans``
    maps a name to ``(step time or None, placement)``; ``zero_shot_calls`` is the oracle
    calls a zero-shot plan among them took (reported as ``meta.zero_shot_calls``, as
    ``chain_finetune`` does)."""

    plans: dict[str, tuple[float | None, np.ndarray | None]]
    zero_shot_calls: int | None = None


#: The warm_start.json field of :attr:`Candidates.zero_shot_calls` (kept for resumes).
ZERO_SHOT_CALLS = "zero_shot_calls"


def _calls_of(oracle: Any) -> int | None:
    calls = getattr(oracle, "calls", None)
    return None if calls is None else int(calls)


class WarmStart(NamedTuple):
    """A run's warm-start plan: the candidate's name, its placement and the oracle calls of
    the zero-shot plan of ``agent.init_policy`` (None without one, or in a warm_start.json
    written before they were recorded)."""

    name: str
    placement: np.ndarray
    zero_shot_calls: int | None = None


def _warm_start(
    run_dir: Path,
    baselines: Mapping[str, common.BaselineOutcome],
    resuming: bool,
    extra: Callable[[], Candidates] | None = None,
    *,
    shape: tuple[int, int] | None = None,
) -> WarmStart | None:
    """The warm-start plan of this run -- the fastest feasible plan of the env's baselines and
    of ``extra()`` (:func:`init_policy_plan`; called only when the plan is not already
    recorded) -- recorded in ``warm_start.json`` so a resume keeps it, read strictly
    (``shape``: the problem's (nodes, devices), which the placement must fit)."""
    path = run_dir / "warm_start.json"
    if resuming and path.exists():
        from graphs.schema import Fields, read_json

        f = Fields(path)
        saved = f.obj(
            read_json(path), "", required=("name",), optional=("placement", ZERO_SHOT_CALLS)
        )
        name = saved["name"]
        if name is None:
            return None
        f.string(name, "name")
        zcalls = saved.get(ZERO_SHOT_CALLS)
        if zcalls is not None:
            zcalls = f.integer(zcalls, ZERO_SHOT_CALLS, lo=0)
        hi = None if shape is None else shape[1] - 1
        placement = f.array(
            saved.get("placement") or [], "placement",
            lambda d, at: f.integer(d, at, lo=0, hi=hi), what="device indices",
        )  # fmt: skip
        if shape is not None and placement and len(placement) != shape[0]:
            raise f.fail(
                "placement", f"has {len(placement)} entries; the graph has {shape[0]} nodes"
            )
        # files written before the placement was recorded give an empty one (start unknown)
        return WarmStart(name, np.asarray(placement, dtype=np.int64), zcalls)
    candidates: dict[str, tuple[float | None, np.ndarray | None]] = {
        n: (o.step_time if not o.oom else None, getattr(o.plan, "placement", None))
        for n, o in baselines.items()
    }
    more = extra() if extra is not None else Candidates({})
    zcalls = more.zero_shot_calls
    candidates.update(more.plans)
    ws = search.warm_start_plan(candidates)
    saved: dict[str, Any] = {
        "name": None if ws is None else ws[0],
        "placement": None if ws is None else ws[1].tolist(),
    }
    if zcalls is not None:
        saved[ZERO_SHOT_CALLS] = zcalls
    common.write_json(path, saved)
    return None if ws is None else WarmStart(ws[0], ws[1], zcalls)


#: Valid values of ``agent.ppo.extra`` keys that SB3 takes without checking them.
_PPO_EXTRA_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "clip_range": ("a number > 0", lambda v: is_number(v) and v > 0),
    "clip_range_vf": ("a number > 0 or null", lambda v: v is None or (is_number(v) and v > 0)),
    "gae_lambda": ("a number in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "vf_coef": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "max_grad_norm": ("a number > 0", lambda v: is_number(v) and v > 0),
    "target_kl": ("a number > 0 or null", lambda v: v is None or (is_number(v) and v > 0)),
    "normalize_advantage": ("true or false", lambda v: isinstance(v, bool)),
}


def check_ppo_extra(extra: Mapping[str, Any] | None) -> None:
    """Refuse an ``agent.ppo.extra`` key that MaskablePPO does not take (a TypeError from SB3
    before) or a value SB3 would train with silently (``clip_range=-1``, ``gae_lambda=5``)."""
    if not extra:
        return
    import inspect

    from sb3_contrib import MaskablePPO  # torch with it: seconds, only when there is a key

    params = inspect.signature(MaskablePPO.__init__).parameters
    injected = {"self", "policy", "env", "seed", "policy_kwargs", "_init_setup_model"}
    valid = sorted(k for k in params if k not in injected)
    for k, v in extra.items():
        if k not in valid:
            raise ValueError(f"agent.ppo.extra.{k}: MaskablePPO takes no {k!r}; valid: {valid}")
        rule = _PPO_EXTRA_RULES.get(k)
        if rule is not None and not rule[1](v):
            raise ValueError(f"agent.ppo.extra.{k} is {v!r}; expected {rule[0]}")


def ppo_kwargs(agent_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``make_ppo`` keyword arguments from the agent's ``ppo`` block (``None`` = default)."""
    ppo = dict(agent_cfg.get("ppo") or {})
    extra = dict(ppo.pop("extra", None) or {})
    return {**{k: v for k, v in ppo.items() if v is not None}, **extra}


def warm_search_options(
    problem: common.Problem, agent_cfg: Mapping[str, Any], warm: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(env defaults, make_ppo kwargs)`` of a PPO run: :func:`agents.search.warm_search_options`
    for the env's id and keywords, on unless ``agent.warm_search`` is false."""
    return search.warm_search_options(
        problem.spec.env_id,
        problem.spec.env_kwargs,
        ppo_kwargs(agent_cfg),
        warm=warm,
        enabled=bool(agent_cfg.get("warm_search", True)),
    )


def _ppo_run_state(
    budget: Mapping[str, Any],
    run_dir: Path,
    tracker: NullTracker,
    references: Mapping[str, float],
    log_every: int,
    resume_state: Mapping[str, Any] | None,
    total: int,
    label: str = "best",
) -> tuple[Any, Any, Any]:
    """``(best-plan tracker, runner callback, restored model or None)`` of a PPO run: the
    progress bar, logging, budget and checkpoints of ``train.*``, resumed from
    ``resume_state`` when given."""
    from agents.callbacks import BestPlanTracker

    key = "best_step_time" if label == "best" else "best_step_time_training_graphs"
    best = BestPlanTracker(log_key=f"placement/{key}")
    cb = _make_runner_callback(
        run_dir=run_dir,
        total=total,
        seconds=budget.get("seconds"),
        checkpoint_every=int(budget.get("checkpoint_every") or 0),
        crash_after=budget.get("crash_after_updates"),
        progress=bool(budget.get("progress", True)),
        tracker=tracker,
        references=references,
        best=best,
        log_every=log_every,
        save_extra=dict,
        label=label,
    )
    model = None if resume_state is None else checkpoint.restore(resume_state, [cb, best])
    return best, cb, model


def search_ppo(
    problem: common.Problem,
    agent_cfg: Mapping[str, Any],
    budget: Mapping[str, Any],
    *,
    seed: int,
    run_dir: Path,
    tracker: NullTracker,
    references: Mapping[str, float],
    log_every: int,
    resume_state: Mapping[str, Any] | None,
    warm_start: WarmStart | None = None,
) -> SearchOutcome:
    """Train PPO on the env with :func:`agents.search.ppo_search`, with this run's progress
    bar, logging, budget and checkpoints; export ``policy.pt``.

    With ``warm_start=(name, placement)`` every episode starts from that plan, and the
    reported best is the better of that plan and every plan PPO sampled
    (``meta["best_from"]``: ``"warm_start"``, ``"search"`` or ``"zero_shot"``;
    ``meta["warm_start_step_time"]``; with ``agent.init_policy``, ``meta["zero_shot_calls"]``:
    the oracle calls of its zero-shot plan, which ``oracle_calls`` does not count).
    """
    import agents

    policy = agent_cfg["policy"]
    if policy == "auto":
        policy = problem.spec.policy
    total = int(budget["timesteps"])
    fixed = problem.spec.generator == "fixed"
    best, cb, model = _ppo_run_state(
        budget, run_dir, tracker, references, log_every, resume_state, total,
        label="best" if fixed else "best on a training graph",
    )  # fmt: skip
    init = None if warm_start is None else warm_start.placement
    env_defaults, kwargs = warm_search_options(problem, agent_cfg, warm_start is not None)
    found = search.ppo_search(
        env_factory(problem, init_placement=init, env_defaults=env_defaults),
        graph=problem.graph,
        cluster=problem.cluster,
        oracle_factory=problem.oracle_factory,
        timesteps=total,
        policy=policy,
        seed=seed,
        on_problem=fixed,
        start=init if fixed else None,
        ppo_kwargs=kwargs,
        callbacks=[cb],
        model=model,
        tracker=best,
        microbatches=problem.spec.microbatches,
        schedule=problem.spec.schedule,
        init_policy=agent_cfg.get("init_policy") if model is None else None,
    )
    if agent_cfg.get("init_policy"):
        policy = found.model.policy.network
    policy_path = run_dir / "policy.pt"
    agents.export_policy(
        found.model,
        policy_path,
        # the steps trained (PPO rounds a budget up to whole rollouts): the budget was recorded
        meta={
            "env": problem.spec.name,
            "policy": policy,
            "seed": seed,
            "timesteps": int(found.timesteps),
        },
    )
    meta: dict[str, Any] = {"policy": policy, "updates": cb.updates, "best_from": found.best_from}
    # improvements with their wall time (seconds since this session's training started):
    # what "time to reach a target" is read from (scripts/finetune_generalist.py)
    meta["curve"] = [
        [
            int(h["timesteps"]),
            int(h["oracle_calls"]),
            float(h["wall_s"]),
            float(h["best_step_time"]),
        ]
        for h in best.history
        if h.get("event") == "improve"
    ]
    if agent_cfg.get("init_policy"):
        meta["init_policy"] = str(agent_cfg["init_policy"])
    if found.best_from == "zero_shot":
        meta["zero_shot"] = True
    if warm_start is not None:
        meta["warm_start"] = warm_start.name
        meta["warm_start_step_time"] = found.start_step_time
        if agent_cfg.get("init_policy"):
            meta["zero_shot_calls"] = warm_start.zero_shot_calls
    return SearchOutcome(
        found.placement,
        found.step_time,
        found.oracle_calls,
        found.history,
        found.timesteps,
        policy_path,
        meta,
    )


#: The files a run writes into its folder (``error.txt`` and ``train.log`` aside: the one is
#: removed when a run starts, the other appended to).
RUN_FILES = (
    "result.json",
    "baselines.json",
    "best_plan.json",
    "best_plan_gantt.png",
    "best_plan_trace.json",
    "best_plan_timeline.txt",
    "best_plan_measured.json",
    "policy.pt",
    "warm_start.json",
    "run_info.json",
    checkpoint.CHECKPOINT,
    checkpoint.WALL_CLOCK,
)

#: The loggers' folders a run writes into its run folder (``logger=tensorboard``: ``tb/``,
#: ``logger=wandb``: ``wandb/``); a new run in a used folder replaces them with the files.
RUN_DIRS = ("tb", "wandb")


def _input_files(plain: Any) -> set[Path]:
    """Every existing file a config names (``agent.init_policy``, ``env.graph_file``, ...)."""
    out: set[Path] = set()
    stack = [plain]
    while stack:
        v = stack.pop()
        if isinstance(v, Mapping):
            stack += list(v.values())
        elif isinstance(v, (list, tuple)):
            stack += list(v)
        elif isinstance(v, str) and v and len(v) < 4096:
            try:
                p = Path(v.split("@", 1)[-1]).expanduser()
                if p.is_file():
                    out.add(p.resolve())
            except (OSError, ValueError):
                pass
    return out


def absolute_input_paths(cfg: DictConfig) -> list[str]:
    """Write the input files a new run's config names -- ``env.graph_file``,
    ``agent.init_policy``, the calibration of ``env.cluster=cpu_N@PATH`` -- as absolute
    paths (those that name an existing file; the rest stay as typed, so a refusal names what
    was typed); the keys changed. ``config.yaml`` kept them as typed, so ``resume=`` from
    another folder read ``g/chain.json`` there: "cannot read file" (2 Dec 2026)."""
    changed = []

    def absolute(v: Any) -> str | None:
        if not isinstance(v, str) or not v.strip():
            return None
        p = Path(v).expanduser()
        return str(p.resolve()) if p.is_file() and str(p.resolve()) != v else None

    for section, key in (("env", "graph_file"), ("agent", "init_policy")):
        new = absolute(cfg[section].get(key))
        if new is not None:
            cfg[section][key] = new
            changed.append(f"{section}.{key}")
    cluster = cfg.env.get("cluster")
    if isinstance(cluster, str) and "@" in cluster and absolute(cluster.split("@", 1)[1]):
        cfg.env.cluster = common.absolute_cluster_name(cluster)
        changed.append("env.cluster")
    return changed


#: The folder of a run folder where a new run keeps the earlier run's files (its
#: ``config.yaml`` and :data:`RUN_FILES`) until it has a checkpoint or a result of its own.
EARLIER_RUN = earlier_run.EARLIER_RUN


@contextmanager
def earlier_run_set_aside(run_dir: Path, keep: set[Path] = frozenset()) -> Iterator[list[str]]:
    """Move the ``config.yaml``, :data:`RUN_FILES` and :data:`RUN_DIRS` (the loggers'
    folders) an earlier run left in ``run_dir`` into
    ``run_dir/.earlier_run`` (except the files in ``keep``: what the new run reads, such as
    ``agent.init_policy=DIR/policy.pt``, which was removed and then not found); yield their
    names. When the new run finishes, or has its first checkpoint or ``result.json`` (the
    folder is then the new run's: ``resume=`` continues it; :func:`settle`), they are
    removed; when it fails or is stopped before, the new run's files are removed and the
    earlier run's put back, so a refused command leaves the folder as it found it
    (:mod:`runners.earlier_run`).

    A new run (not ``resume=``) in a used folder kept them: its resume then took the earlier
    run's ``baselines.json`` as its own (a speed-up of 93x over another model's baseline), a
    baseline agent left the earlier PPO run's ``policy.pt`` beside its plan, and a run killed
    before its first checkpoint resumed from the earlier run's (fuzzing, 2 Dec 2026). Removed
    at once (before), they were lost to a command refused after its config's checks
    (``agent=ideal_dp +agent.options.time_limit=-1``: a planner checks its options when it
    starts), and a refused command left its own ``config.yaml`` beside the earlier run's
    result."""
    names = ("config.yaml", *RUN_FILES)
    kept = {n for n in names if (run_dir / n).is_file() and (run_dir / n).resolve() in keep}
    moved = earlier_run.set_aside(run_dir, names, RUN_DIRS, kept)
    try:
        yield moved
    except BaseException:
        # .earlier_run/ is there only while the new run has not made the folder its own
        if (run_dir / EARLIER_RUN).is_dir():
            earlier_run.put_back(run_dir, names, RUN_DIRS)
            earlier_run.GIVEN_BACK.add(os.path.realpath(run_dir))
        raise
    earlier_run.discard(run_dir)


def settle(run_dir: Path) -> None:
    """The new run has a checkpoint or a ``result.json``: the folder is its own, and the
    earlier run's files set aside go."""
    earlier_run.discard(run_dir)


def put_back_after_kill(run_dir: Path, *, resume: bool = False) -> list[str]:
    """A command stopped by SIGKILL (or a power cut) cannot put the earlier run back, and left
    it in ``run_dir/.earlier_run/``: the next command in the folder does, byte for byte, and
    removes what the stopped command wrote in its place (its ``.hydra/`` too, if this command
    fails). ``.earlier_run/`` is there only while a new run has not made the folder its own
    (:func:`settle`). The names put back (none: nothing to do).

    Until 3 Dec 2026 the next new run removed ``.earlier_run/`` unread, so a ``kill -9`` of a
    command before its first checkpoint lost the earlier run's result, and a folder whose
    killed command had not yet written its ``config.yaml`` kept ``.earlier_run/`` for ever."""
    return earlier_run.put_back(run_dir, ("config.yaml", *RUN_FILES), RUN_DIRS, hydra_now=resume)


def _plan_with_baseline(
    problem: common.Problem,
    agent_cfg: Mapping[str, Any],
    objective: str,
    seed: int,
    echo: Callable[[str], None],
) -> SearchOutcome:
    """:func:`search_baseline` with what the run prints about it."""
    bname = agent_cfg.get("baseline") or agent_cfg["name"]
    limit = common.planner_time_limit(bname, agent_cfg.get("options"))
    if limit is not None:  # a minute of silence otherwise (ilp, ideal_dp, ...)
        echo(f"{bname}: planning (time limit {limit:g} s) ...")
    outcome = search_baseline(problem, agent_cfg, seed=seed)
    if outcome.step_time is None and outcome.meta.get("error"):
        # the reason was only in result.json's meta.error; the summary said "n/a (OOM)"
        echo(f"{bname}: no plan: {common.first_line(outcome.meta['error'], bname)}")
    report = outcome.meta.get("planner")
    line = report and common.planner_report(
        bname, report, objective=objective, step_time=outcome.step_time
    )
    if line:
        echo(line)
    return outcome


def search_baseline(
    problem: common.Problem, agent_cfg: Mapping[str, Any], *, seed: int
) -> SearchOutcome:
    """The agent is a baseline: run it with the agent's budget and options."""
    name = agent_cfg.get("baseline") or agent_cfg["name"]
    o = common.run_baseline(
        problem, name, agent_cfg.get("budget"), seed=seed, options=agent_cfg.get("options")
    )
    placement = None if o.plan is None or o.step_time is None else np.asarray(o.plan.placement)
    hist = [] if o.step_time is None else [(0, o.oracle_calls, o.step_time)]
    meta: dict[str, Any] = {"baseline": name, "error": o.error}
    if o.plan is not None:
        # what the planner reports of its own plan: exactness and limits of ideal_dp, the MIP
        # gap and bound of ilp, anneal's curve, ... (result.json and best_plan.json; the files'
        # writers make it JSON)
        meta["planner"] = dict(o.plan.meta)
    return SearchOutcome(
        placement,
        o.step_time,
        o.oracle_calls,
        hist,
        0,
        None,
        meta,
        plan=o.plan if o.step_time is not None else None,
    )


#: ``agent.options`` that :func:`search_finetune` passes to ``chain_finetune``
#: (``agents.finetune.OPTIONS`` less its budget; not imported here: that module loads torch).
FINETUNE_OPTIONS = (
    "first_samples", "samples", "elite", "updates", "lr", "penalty", "link_exponent",
    "patience", "local", "window", "temperature", "sequential", "moves", "focus", "screen",
)  # fmt: skip


def search_finetune(
    problem: common.Problem,
    agent_cfg: Mapping[str, Any],
    budget: Mapping[str, Any],
    *,
    seed: int,
    run_dir: Path,
    tracker: NullTracker,
) -> SearchOutcome:
    """Fine-tune a per-unit policy (``agent.init_policy``, default the shipped generalist) on
    the run's problem with :func:`agents.finetune.chain_finetune`: ``agent.budget`` oracle
    calls (the zero-shot plan's included), ``train.seconds``, ``agent.options`` its
    keywords; export the fine-tuned network to ``policy.pt``."""
    import agents
    from agents.finetune import chain_finetune

    opts = dict(agent_cfg.get("options") or {})  # checked by check_finetune_agent, in train()
    init = agent_cfg.get("init_policy") or "generalist"
    policy = agents.load_policy(init)
    if policy.mode != "per_node":
        raise ValueError(
            f"agent {agent_cfg['name']!r}: agent.init_policy={init!r} is a {policy.mode!r} "
            "policy; chain fine-tuning needs a per-unit one (the generalist, or a policy "
            "trained on OneShot-v0)"
        )
    calls = int(agent_cfg.get("budget") or 4096)
    pbar = None
    if budget.get("progress", True):
        from tqdm.auto import tqdm

        pbar = tqdm(total=calls, unit="call", desc="fine-tune", mininterval=0.5, dynamic_ncols=True)
    history: list[tuple[int, int, float]] = []

    def on_round(r: Mapping[str, Any]) -> None:
        if np.isfinite(r["best"]):
            history.append((int(r["round"]), int(r["calls"]), float(r["best"])))
            tracker.log(
                {"placement/best_step_time": float(r["best"]),
                 "placement/oracle_calls": float(r["calls"]),
                 "charts/wall_seconds": float(r["seconds"])},
                int(r["round"]),
            )  # fmt: skip
        if pbar is not None:
            pbar.update(int(r["calls"]) - pbar.n)
            if np.isfinite(r["best"]):
                pbar.set_postfix_str(f"best {r['best'] * 1e3:.2f} ms", refresh=False)

    try:
        ft = chain_finetune(
            policy,
            problem.graph,
            problem.cluster,
            oracle=problem.oracle(),
            microbatches=problem.spec.microbatches,
            schedule=problem.spec.schedule,
            calls=calls,
            seconds=budget.get("seconds"),
            seed=seed,
            on_round=on_round,
            **opts,
        )
    finally:
        if pbar is not None:
            pbar.close()
    ft.policy.meta.update(env=problem.spec.name, init_policy=str(init), seed=seed)
    policy_path = ft.policy.save(run_dir / "policy.pt")
    meta: dict[str, Any] = {
        "init_policy": str(init),
        "rounds": ft.rounds,
        "stop": ft.stop,
        "zero_shot_step_time": ft.zero_shot_step_time,
        "zero_shot_calls": ft.zero_shot_calls,
        "curve": [[int(r), int(c), float(w), float(b)] for r, c, w, b in ft.curve],
        "options": opts,
    }
    return SearchOutcome(
        ft.placement,
        None if ft.placement is None else ft.step_time,
        ft.oracle_calls,
        history,
        ft.rounds,
        policy_path,
        meta,
    )


def search_hybrid_ppo(
    problem: common.Problem,
    agent_cfg: Mapping[str, Any],
    budget: Mapping[str, Any],
    *,
    seed: int,
    run_dir: Path,
    tracker: NullTracker,
    references: Mapping[str, float],
    log_every: int,
    resume_state: Mapping[str, Any] | None,
) -> SearchOutcome:
    """Train ``MaskablePPO`` on the problem's ``Hybrid-v0`` episodes with
    :func:`agents.search.hybrid_ppo_search`, with this run's progress bar, logging, budget
    and checkpoints. The answer is the best feasible layout visited (``outcome.plan``).

    The policy is SB3's ``MultiInputPolicy``, so ``agent.policy`` must be ``auto`` and
    ``agent.init_policy`` unset; no ``policy.pt`` is exported (``runners.plan`` reads graph
    policies only) and baselines give no warm start (episodes start as the env's ``init``).
    """
    from graphs.layout import HybridLayout
    from graphs.plan import Plan

    name = problem.spec.name
    if agent_cfg.get("policy", "auto") != "auto":
        raise ValueError(
            f"env {name!r} (Hybrid-v0): agent.policy={agent_cfg['policy']!r} is not taken here "
            "(the graph policies are for op-placement envs); PPO on hybrid layouts uses SB3's "
            "MultiInputPolicy: set agent.policy=auto"
        )
    if agent_cfg.get("init_policy"):
        raise ValueError(
            f"env {name!r} (Hybrid-v0): agent.init_policy is for the graph policies of the "
            "op-placement envs; unset it"
        )
    if problem.spec.generator != "fixed":
        raise ValueError(
            f"env {name!r} (Hybrid-v0): generator={problem.spec.generator!r}; hybrid PPO trains "
            "on its one problem: expected generator=fixed"
        )
    total = int(budget["timesteps"])
    best, cb, model = _ppo_run_state(
        budget, run_dir, tracker, references, log_every, resume_state, total
    )
    kwargs = ppo_kwargs(agent_cfg)
    if "n_envs" not in kwargs:
        kwargs["n_envs"] = 1
    found = search.hybrid_ppo_search(
        env_factory(problem),
        timesteps=total,
        seed=seed,
        ppo_kwargs=kwargs,
        callbacks=[cb],
        model=model,
        tracker=best,
    )
    meta: dict[str, Any] = {
        "policy": "MultiInputPolicy",
        "updates": cb.updates,
        "best_from": found.best_from,
        "curve": [list(p) for p in found.curve],  # (timesteps, oracle calls, wall s, best)
    }
    plan = None
    if found.layout is not None:
        plan = Plan.from_layout(
            problem.graph,
            problem.cluster,
            HybridLayout.from_dict(found.layout),
            meta={"step_time": found.step_time, "oracle_calls": found.oracle_calls},
        )
    return SearchOutcome(
        found.placement,
        found.step_time,
        found.oracle_calls,
        found.history,
        found.timesteps,
        None,
        meta,
        plan=plan,
    )


def check_init_policy_network(agent_cfg: Mapping[str, Any]) -> None:
    """An ``agent.init_policy`` of another network than an explicit ``agent.policy`` is
    refused: PPO trains the init policy's network, so ``agent=gdp
    agent.init_policy=<a placeto policy.pt>`` trained Placeto under the name gdp (found by
    fuzzing). ``agent.policy=auto`` (``agent=ppo``) takes the file's network."""
    init, wanted = agent_cfg.get("init_policy"), agent_cfg.get("policy", "auto")
    if not init:
        return
    import agents

    # loaded here in any case: a missing or broken file was refused after the baselines ran
    try:
        network = agents.load_policy(str(init)).network
    except ValueError as exc:
        path = Path(str(init)).expanduser()
        said = earlier_run.hint(path) if not path.exists() else ""
        if not said:
            raise
        raise ValueError(f"agent.init_policy={init}: no such file{said}") from exc
    if wanted in (None, "auto"):
        return
    if network != wanted:
        raise ValueError(
            f"agent {agent_cfg.get('name')!r}: agent.policy is {wanted!r}, but "
            f"agent.init_policy={str(init)!r} is a {network!r} network, which PPO would train "
            f"instead; use agent={network} (or agent=ppo) to fine-tune it, or a {wanted!r} policy"
        )


def check_finetune_agent(
    env: str, agent_cfg: Mapping[str, Any], train_cfg: Mapping[str, Any], hybrid: bool
) -> None:
    """Refuse, before any baseline runs, what :func:`search_finetune` would refuse only
    after them: agent kind ``finetune`` on a hybrid env, an unknown ``agent.options`` name,
    or a bad value of one (:func:`agents.finetune.check_options`, with ``agent.budget`` and
    ``train.seconds``). A no-op for other agent kinds."""
    if agent_cfg.get("kind") != "finetune":
        return
    if hybrid:
        raise ValueError(
            f"env {env!r} (Hybrid-v0): agent kind 'finetune' fine-tunes a graph "
            "policy; hybrid layouts have no per-unit policy to fine-tune"
        )
    from agents.finetune import check_options

    opts = dict(agent_cfg.get("options") or {})
    bad = sorted(set(opts) - set(FINETUNE_OPTIONS))
    if bad:
        raise ValueError(
            f"agent {agent_cfg['name']!r}: unknown option(s) {bad} for chain fine-tuning; "
            f"expected some of {list(FINETUNE_OPTIONS)}"
        )
    try:
        check_options(
            calls=int(agent_cfg.get("budget") or 4096), seconds=train_cfg.get("seconds"), **opts
        )
    except ValueError as exc:
        raise ValueError(f"agent {agent_cfg['name']!r}: {exc}") from None


def check_hybrid_planners(
    env: str, agent_cfg: Mapping[str, Any], baselines: Sequence[str], hybrid: bool = True
) -> None:
    """Refuse op-placement planners on a hybrid env, as ``env.baselines`` or as the agent:
    their plans place operators and are scored by the op simulator, so their step times
    and the speed-ups against them compare different models. With ``hybrid=False`` (an
    op-placement env) refuse the hybrid planners instead: the env would score their layout's
    placement of operators (each stage's first device), not the layout they planned."""
    from agents.baselines import HYBRID_PLANNERS

    if not hybrid:
        agent = agent_cfg.get("baseline") or agent_cfg["name"]
        if agent_cfg["kind"] == "baseline" and agent in HYBRID_PLANNERS:
            what = f"agent {agent!r} plans"
        else:
            layouts = [b for b in baselines if b in HYBRID_PLANNERS]
            if not layouts:
                return
            what = f"env.baselines {layouts} plan"
        raise ValueError(
            f"env {env!r} places operators on devices, but {what} data x tensor x "
            f"pipeline layouts, which only a Hybrid-v0 env scores ({list(HYBRID_PLANNERS)}: "
            "e.g. +env=gpt2_8gpu_hybrid, or env.env_id=placement_env/Hybrid-v0 with "
            f"env.baselines={list(HYBRID_PLANNERS)[:2]} (or []) for a transformer); here they "
            "would be scored as an op placement of each stage's first device"
        )
    ops = [b for b in baselines if b not in HYBRID_PLANNERS]
    if ops:
        raise ValueError(
            f"env {env!r} poses hybrid-parallel problems: env.baselines {ops} place operators "
            f"and are scored by another model; use {list(HYBRID_PLANNERS)} (or env.baselines=[])"
        )
    if agent_cfg["kind"] == "baseline":
        name = agent_cfg.get("baseline") or agent_cfg["name"]
        if name not in HYBRID_PLANNERS:
            raise ValueError(
                f"env {env!r} poses hybrid-parallel problems: agent {name!r} places operators; "
                f"use agent=ppo or one of {list(HYBRID_PLANNERS)}"
            )


def check_planner_batch(
    env: str, agent_cfg: Mapping[str, Any], graph: Any, env_kwargs: Mapping[str, Any] | None = None
) -> None:
    """A hybrid planner's ``global_batch`` option must be the model's batch: the plan it
    writes carries the model (``meta.model``), and ``runners.execute`` refuses a layout whose
    global batch is not the model's (a run with ``agent.options.global_batch=7`` on a model
    of batch 8 wrote such a plan and exited 0)."""
    from agents.baselines.megatron_grid import default_global_batch

    batch = default_global_batch(graph)
    env_gb = (env_kwargs or {}).get("global_batch")
    if env_gb is not None and env_gb != batch:  # PPO planned batch 2 against baselines of 8
        raise ValueError(
            f"env {env!r}: env.env_kwargs.global_batch={env_gb!r} is not the model's batch "
            f"({batch} samples per step): the env's layouts would be of another batch than "
            "the baselines' and than the model the plan names. Set the batch in the model "
            "instead (env.model_config's batch) and leave env.env_kwargs.global_batch out"
        )
    gb = (agent_cfg.get("options") or {}).get("global_batch")
    if agent_cfg["kind"] != "baseline" or gb is None:
        return
    if gb != batch:
        raise ValueError(
            f"env {env!r}: agent.options.global_batch={gb!r} is not the model's batch "
            f"({batch} samples per step); the plan would not run as the model it names. Set "
            "the batch in the model instead (env.model_config's batch) and leave "
            "agent.options.global_batch out"
        )


def _write_hybrid_plan(
    problem: common.Problem, outcome: SearchOutcome, agent: str, seed: int, run_dir: Path
) -> dict[str, Any]:
    """Write ``best_plan.json`` of a hybrid plan (its layout is the answer) and return the
    result fields of a hybrid run: layout, step time, TFLOP/s per GPU, MFU, memory per GPU."""
    from graphs.plan import Plan

    if outcome.plan is None or outcome.plan.layout is None:
        raise ValueError(
            f"env {problem.spec.name!r} poses hybrid-parallel problems: agent {agent!r} must "
            "return a plan with a layout (agent=ppo, megatron_grid, alpa, hybrid_anneal or pipedream)"
        )
    plan = Plan.from_layout(
        problem.graph,
        problem.cluster,
        outcome.plan.layout,
        meta={
            **common.plan_provenance(problem.spec, problem.cluster),
            **dict(outcome.plan.meta),
            "algorithm": agent,
            "seed": seed,
        },
    )
    plan.save(run_dir / "best_plan.json")
    res = problem.oracle().evaluate(plan)
    outcome.step_time = float(res.step_time)
    return {
        "oom": bool(res.oom),
        "layout": plan.layout.to_dict(),
        "step_time": float(res.step_time),
        "tflops_per_gpu": float(res.model_flops_per_device) / 1e12,
        "hardware_tflops_per_gpu": float(res.hardware_flops_per_device) / 1e12,
        "mfu": float(res.mfu),
        "memory_per_gpu": float(res.peak_memory.max()),
        "memory_per_stage": res.breakdown["memory_per_rank"],
        # what a plan may use per GPU: the capacity times env.memory_fraction
        "memory_capacity_per_gpu": float(problem.cluster.memory.min()),
        "num_gpus": problem.cluster.num_devices,
    }


# ------------------------------------------------------------------------ run
#: What a command line may set beside ``resume=DIR`` (the rest comes from DIR/config.yaml).
RESUME_KEYS = ("resume", "train.progress", "train.crash_after_updates", "output_dir")


def ignored_on_resume(overrides: Sequence[str], saved: DictConfig) -> list[str]:
    """The command-line ``overrides`` that ``resume=DIR`` would ignore: those that set a key
    other than :data:`RESUME_KEYS` (or ``hydra.*``) to a value other than the saved run's
    (a config group, e.g. ``+env=NAME``, by the saved group's ``name``/``kind``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.key_or_group
        if key in RESUME_KEYS or key.startswith("hydra") or ov.is_delete():
            continue
        try:
            value = ov.value()
        except Exception:  # noqa: BLE001 - an interpolation: cannot be the saved value
            out.append(ov.input_line)
            continue
        if key in schema.GROUPS:
            node = saved.get(key)
            have = None if node is None else node.get("kind" if key == "logger" else "name")
        else:
            have = OmegaConf.select(saved, key, default="<missing>")
            have = common.to_plain(have)
        if have != value:
            out.append(ov.input_line)
    return out


def train(
    cfg: DictConfig,
    run_dir: Path,
    *,
    echo: Callable[[str], None] = print,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one training job described by ``cfg`` into ``run_dir``; return ``result.json``'s dict.

    ``overrides``: the command line's, checked with ``resume=DIR`` (:func:`ignored_on_resume`).

    ``resume=DIR`` holds ``DIR``'s lock (:mod:`runners.folder_lock`) for the whole run,
    whatever folder hydra logs into: with ``-m`` or ``hydra.run.dir=OTHER`` the lock went to
    the other folder, and a resume of a run still going trained beside it (fuzzing, 2 Dec
    2026)."""
    if cfg.get("resume"):
        folder = Path(cfg.resume)
        if schema.is_train_run_folder(folder):  # no lock file in another program's folder
            from runners import folder_lock

            with folder_lock.held(folder, "train"):
                _say_put_back(folder, put_back_after_kill(folder, resume=True), echo)
                if (folder / "config.yaml").is_file():
                    return _train(cfg, run_dir, echo=echo, overrides=overrides)
        return _train(cfg, run_dir, echo=echo, overrides=overrides)  # refused there
    _say_put_back(run_dir, put_back_after_kill(run_dir), echo)
    if (run_dir / "config.yaml").is_file():  # an earlier run's
        try:  # the files it names are kept in place; a bad config is refused by _train
            absolute_input_paths(cfg)
            keep = _input_files(common.to_plain(cfg))
        except Exception:  # noqa: BLE001 - refused below, with the earlier run put back
            keep = set()
        with earlier_run_set_aside(run_dir, keep=keep) as moved:
            return _train(cfg, run_dir, echo=echo, overrides=overrides, earlier=moved)
    return _train(cfg, run_dir, echo=echo, overrides=overrides)


def saved_config(run_dir: Path) -> DictConfig:
    """The ``config.yaml`` a ``runners.train`` run saved in ``run_dir``, checked against the
    schema (:func:`runners.schema.saved_train_config`)."""
    return schema.saved_train_config(run_dir)  # type: ignore[return-value]


def _say_put_back(run_dir: Path, names: Sequence[str], echo: Callable[[str], None]) -> None:
    if names:
        echo(
            f"{run_dir}: a command stopped before its first checkpoint (killed?) had set the "
            f"earlier run's files aside in {EARLIER_RUN}/: put back ({', '.join(names)})"
        )


def _train(
    cfg: DictConfig,
    run_dir: Path,
    *,
    echo: Callable[[str], None],
    overrides: Sequence[str],
    earlier: Sequence[str] = (),
) -> dict[str, Any]:
    t_start = time.perf_counter()
    resume_state = None
    resuming = bool(cfg.get("resume"))
    if resuming:
        run_dir = Path(cfg.resume)
        saved = run_dir / "config.yaml"
        if not saved.exists():
            raise ValueError(f"resume={run_dir}: no config.yaml there; is it a runners.train run?")
        crash, progress = cfg.train.crash_after_updates, cfg.train.progress
        cfg = saved_config(run_dir)
        ignored = ignored_on_resume(overrides, cfg)
        if ignored:
            raise ValueError(
                f"resume={run_dir} continues the run as saved in {saved}; these overrides would "
                f"be ignored: {ignored}. Beside resume= only {list(RESUME_KEYS[1:3])} apply; "
                "to change the run, start a new one (output_dir=...)"
            )
        cfg.train.crash_after_updates, cfg.train.progress = crash, progress
        done = run_dir / "result.json"
        if done.is_file():  # written last: the run finished (it used to train again)
            from graphs.schema import read_json

            result = read_json(done)
            try:
                line = summary_line(result, run_dir)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(
                    f"resume={run_dir}: {done} is not a finished run's result ({exc!r}); "
                    "remove it to train the run on from its checkpoint"
                ) from None
            echo(f"resume={run_dir}: the run finished already; nothing to do ({done})")
            echo(line)
            return result
        if checkpoint.exists(run_dir):
            resume_state = checkpoint.load(run_dir)
        echo(f"resuming {run_dir}" + ("" if resume_state else " (no checkpoint: from the start)"))
    schema.check_values(schema.TrainConfig, cfg)  # budgets > 0, known schedule, ...
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resuming:  # so that resume= finds them from any folder
        absolute_input_paths(cfg)
    plain = common.to_plain(cfg)
    if resume_state is None:
        common.write_bytes_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg).encode())
    spec = check_config(cfg)  # before any baseline runs (minutes), and before torch is imported
    seed = int(cfg.seed)
    if cfg.get("torch_threads"):
        import torch

        torch.set_num_threads(int(cfg.torch_threads))
    common.seed_everything(seed)
    agent_cfg = plain["agent"]

    # ---- problem
    problem = common.build_problem(spec)
    hybrid = spec.env_id == common.HYBRID_ENV_ID
    if agent_cfg["kind"] == "ppo" and plain["train"].get("checkpoint_every"):
        checkpoint.check_key()  # not at the first checkpoint, after the baselines
    # a hybrid layout carries its own microbatching and schedule: the env's are not used
    pipeline = (
        "microbatches and schedule per layout (env.microbatches, env.schedule unused)"
        if hybrid
        else f"{spec.microbatches} microbatches, {spec.schedule}"
    )
    echo(
        f"env {spec.name}: {problem.graph.meta.get('name', spec.model)} "
        f"({problem.graph.num_nodes} nodes, {problem.graph.num_groups} groups) on "
        f"{problem.cluster.name} ({problem.cluster.num_devices} devices), "
        f"{pipeline}, oracle {spec.oracle}{_hybrid_model_note(problem) if hybrid else ''}"
    )
    if hybrid:  # model FLOPs at peak: no op-level tables of a thousand-GPU cluster
        check_planner_batch(spec.name, agent_cfg, problem.graph, spec.env_kwargs)
        from placement_env.oracles.hybrid import hybrid_lower_bound

        lower_bound = hybrid_lower_bound(problem.graph, problem.cluster)
    else:
        lower_bound = common.lower_bound(problem)  # the simulator's: nothing is executed

    replaced = [n for n in earlier if n != "config.yaml"]
    if replaced:  # once the config has passed its checks (a typo says only what it is)
        echo(
            f"{run_dir} held an earlier run: replacing its {', '.join(replaced)} "
            f"(put back if this command fails before its first checkpoint)"
        )

    # ---- logger
    info_path = run_dir / "run_info.json"
    info = {}
    if resuming and info_path.exists():
        from graphs.schema import Fields, read_json

        info = dict(
            Fields(info_path).obj(
                read_json(info_path), "", optional=("wandb_id", "problem", "init_policy_sha256")
            )
        )
        for key in ("wandb_id", "init_policy_sha256"):
            if key in info:
                Fields(info_path).string(info[key], key)
    identity = common.problem_identity(problem)
    if resuming and info.get("problem") not in (None, identity):
        # env.graph_file is read again by path: a file changed since trained on in the
        # checkpoint's envs and was scored on the new one (fuzzing, 2 Dec 2026)
        was = info["problem"] if isinstance(info["problem"], dict) else {}
        diff = [k for k in sorted(set(was) | set(identity)) if was.get(k) != identity.get(k)]
        raise ValueError(
            f"resume={run_dir}: the run's problem changed since it started ({', '.join(diff)}: "
            f"{', '.join(f'{was.get(k)!r} -> {identity.get(k)!r}' for k in diff)}); a file "
            "it reads by path (env.graph_file, a cluster or calibration file) was replaced? "
            "Put the original back, or start a new run"
        )
    info["problem"] = identity
    init_policy = agent_cfg.get("init_policy") or (
        "generalist" if agent_cfg["kind"] == "finetune" else None
    )
    if (
        init_policy and agent_cfg["kind"] in ("ppo", "finetune") and not resuming
    ):  # which weights the run starts from (3 Dec 2026)
        info["init_policy_sha256"] = common.policy_digest(init_policy)["policy_sha256"]
    log_opts = dict(plain["logger"])
    if cfg.logger.kind == "wandb":
        import secrets

        info.setdefault("wandb_id", secrets.token_hex(4))
        log_opts["run_id"] = info["wandb_id"]
    common.write_json(info_path, info)
    tracker = make_tracker(
        cfg.logger.kind,
        run_dir,
        plain,
        name=f"{spec.name}-{agent_cfg['name']}-s{seed}",
        options=log_opts,
    )

    # a new run starts its own clock, in any folder (it used to add the old run's)
    if not resuming:
        (run_dir / checkpoint.WALL_CLOCK).unlink(missing_ok=True)
    clock = checkpoint.SessionClock(run_dir).start(already=time.perf_counter() - t_start)
    try:
        # ---- a baseline agent plans first: a bad value of one of its options (ideal_dp's
        # time_limit=-1, ...) used to be refused only after the env's baselines had run
        if agent_cfg["kind"] == "baseline":
            outcome = _plan_with_baseline(problem, agent_cfg, spec.objective, seed, echo)

        # ---- baselines: the reference
        bpath = run_dir / "baselines.json"
        if resuming and bpath.exists():
            baselines = common.read_baselines(bpath)
        elif cfg.run_baselines and spec.baselines:
            baselines = common.run_baselines(
                problem, spec.baselines, spec.baseline_budget, seed=seed, echo=echo
            )
            common.write_json(bpath, {n: o.to_dict() for n, o in baselines.items()})
        else:
            baselines = {}
        references = {n: o.step_time for n, o in baselines.items() if o.step_time is not None}

        # ---- the agent's search
        if agent_cfg["kind"] == "baseline":
            pass  # planned before the baselines
        elif agent_cfg["kind"] == "ppo" and hybrid:
            outcome = search_hybrid_ppo(
                problem,
                agent_cfg,
                plain["train"],
                seed=seed,
                run_dir=run_dir,
                tracker=tracker,
                references=references,
                log_every=int(cfg.logger.log_every),
                resume_state=resume_state,
            )
        elif agent_cfg["kind"] == "finetune":  # its options checked before the baselines
            outcome = search_finetune(
                problem, agent_cfg, plain["train"], seed=seed, run_dir=run_dir, tracker=tracker
            )
        elif agent_cfg["kind"] == "ppo":
            outcome = search_ppo(
                problem,
                agent_cfg,
                plain["train"],
                seed=seed,
                run_dir=run_dir,
                tracker=tracker,
                references=references,
                log_every=int(cfg.logger.log_every),
                resume_state=resume_state,
                warm_start=_warm_start(
                    run_dir,
                    baselines,
                    resuming,
                    functools.partial(init_policy_plan, problem, agent_cfg, seed=seed),
                    shape=(problem.graph.num_nodes, problem.cluster.num_devices),
                )  # fmt: skip
                if agent_cfg.get("warm_start", True)
                and spec.generator == "fixed"
                and spec.env_id in WARM_START_ENVS
                else None,
            )
        else:
            raise ValueError(
                f"agent {agent_cfg['name']!r}: unknown kind {agent_cfg['kind']!r}; "
                "expected 'ppo', 'finetune' or 'baseline'"
            )

        asked = int(cfg.train.timesteps)
        if agent_cfg["kind"] == "ppo" and outcome.timesteps > asked:
            # SB3 trains whole rollouts: train.timesteps=64 trained 256 without a word
            echo(
                f"trained {outcome.timesteps} timesteps: train.timesteps={asked} rounded up to "
                "whole PPO rollouts (agent.ppo.n_steps x agent.ppo.n_envs steps each)"
            )

        # ---- files
        oom = outcome.placement is None
        sim_lb = lower_bound
        hybrid_fields: dict[str, Any] = {}
        if not oom and hybrid:
            hybrid_fields = _write_hybrid_plan(problem, outcome, agent_cfg["name"], seed, run_dir)
            oom = hybrid_fields.pop("oom")
        elif not oom:
            plan = problem.plan(
                outcome.placement,
                algorithm=agent_cfg["name"],
                step_time=outcome.step_time,
                oracle_calls=outcome.oracle_calls,
                env=spec.name,
                seed=seed,
                **({"planner": outcome.meta["planner"]} if "planner" in outcome.meta else {}),
            )
            res = common.write_plan_artifacts(problem, plan, run_dir)
            oom, sim_lb = bool(res.oom), float(res.lower_bound)
            outcome.step_time = float(res.step_time)
        best = outcome.step_time
        result = {
            "env": spec.name,
            "agent": agent_cfg["name"],
            "seed": seed,
            "best_step_time": best,
            "lower_bound": sim_lb,
            "oom": oom,
            "baselines": {n: o.step_time for n, o in baselines.items()},
            "speedup_vs": common.speedups(best, baselines),
            "oracle_calls": outcome.oracle_calls,
            "timesteps": outcome.timesteps,
            "wall_seconds": clock.total(),  # every session of the run, killed ones included
            "history": outcome.history,
            "meta": {
                **outcome.meta,
                **{k: info[k] for k in ("init_policy_sha256",) if k in info},
            },
            "problem": common.problem_identity(problem),
            **hybrid_fields,
        }
        common.write_json(run_dir / "result.json", result)
        settle(run_dir)
        _log_final(tracker, result, run_dir, outcome)
    finally:
        clock.stop()
        tracker.finish()
    echo(summary_line(result, run_dir))
    return result


def _log_final(
    tracker: NullTracker, result: Mapping[str, Any], run_dir: Path, outcome: SearchOutcome
) -> None:
    rows = [[result["agent"], result["best_step_time"], 1.0]]
    rows += [[n, st, result["speedup_vs"].get(n)] for n, st in result["baselines"].items()]
    tracker.log_table("results", ["agent", "step_time_s", "speedup_of_agent"], rows)
    gantt = run_dir / "best_plan_gantt.png"
    if gantt.exists():
        tracker.log_image("plots/gantt", gantt, result["timesteps"])
    if outcome.policy_path is not None and outcome.policy_path.exists():
        tracker.log_artifact(outcome.policy_path, f"policy-{result['env']}", "model")
    tracker.summary(
        {
            k: result[k]
            for k in ("best_step_time", "lower_bound", "oom", "oracle_calls", "wall_seconds")
        }
    )


def _hybrid_model_note(problem: common.Problem) -> str:
    """Which step model scores a hybrid env's layouts (`` (layouts scored by ...)``): the
    calibrated CPU model on a hybrid-calibrated ``cpu_N``; on an uncalibrated one the
    GPU-style model with the CPUs' nominal figures, and how to calibrate."""
    oracle = problem.oracle()
    model = oracle.hybrid_model() if hasattr(oracle, "hybrid_model") else None
    if model is None:
        return ""
    name = type(model).__name__
    if name == "CpuHybridModel":
        return f" (layouts scored by {name}, from the cluster's hybrid calibration)"
    if problem.cluster.devices and all(d.kind == "cpu" for d in problem.cluster.devices):
        if "calibration_sha256" in problem.cluster.meta:  # measured devices, no hybrid section
            return (
                f" (layouts scored by {name} with this machine's measured device figures; the "
                "calibration has no hybrid section: for the calibrated CpuHybridModel run "
                "python -m runners.profile calibration=PATH hybrid.model=...)"
            )
        return (
            f" (layouts scored by {name} with the CPUs' nominal figures, not this machine's: "
            "for the calibrated CpuHybridModel run python -m runners.profile "
            "calibration=PATH hybrid.model=... and use the cluster NAME@PATH)"
        )
    return f" (layouts scored by {name})"


def summary_line(result: Mapping[str, Any], run_dir: Path) -> str:
    """The one-line summary printed last."""
    sp = result["speedup_vs"]
    vs = " ".join(f"{n} x{v:.2f}" for n, v in sp.items()) or "no baselines"
    return (
        f"{result['env']} {result['agent']} seed={result['seed']}: best {common.ms(result['best_step_time'])}"
        f"{' (OOM)' if result['oom'] else ''} | lower bound {common.ms(result['lower_bound'])} | "
        f"speed-up vs {vs} | {result['oracle_calls']} oracle calls | "
        f"{result['wall_seconds']:.0f} s | {run_dir}"
    )


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = common.run_dir_from_hydra(cfg.get("output_dir"))
    common.require_env(cfg, "train", run_dir) if not cfg.get("resume") else None
    resume = cfg.get("resume")
    # resume= of a folder that is no run (no config.yaml, or another program's: 3 Dec 2026):
    # say so, but leave no error.txt / train.log in it
    is_run = not resume or schema.is_train_run_folder(Path(str(resume)))
    with common.reported_errors(run_dir if is_run else None, "train"):
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
        train(cfg, run_dir, echo=common.RunLog(run_dir, "train"), overrides=overrides)


def main() -> None:
    """Entry point: check the command-line keys against the schema, then run hydra."""
    schema.run_checked(schema.TrainConfig, _hydra_main)


if __name__ == "__main__":
    main()
