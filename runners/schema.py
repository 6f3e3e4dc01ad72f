"""Dataclass schemas of the runners' hydra configs, registered in hydra's ConfigStore."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

#: The baselines an env runs as its reference when it does not list its own.
DEFAULT_BASELINES: tuple[str, ...] = (
    "single",
    "round_robin",
    "expert",
    "metis",
    "m_sct",
    "pipedream_dp",
    "anneal",
    "random",
)


@dataclass
class EnvConfig:
    """One placement problem (or family of problems) and the environment that poses it.

    The problem is ``model`` (a ``graphs.zoo`` name, or a factory by import path
    ``package.module:function`` called with ``model_config``; coarsened to ``max_groups``) or
    ``graph_file`` (a devplace graph JSON) on ``cluster`` (a ``graphs.clusters`` preset),
    scored by ``oracle``. ``generator`` chooses the training instances: ``fixed`` is that
    one problem; ``synthetic`` samples ``graphs.synthetic`` graphs (and the clusters in
    ``generator_options``) so one policy learns many problems, while the fixed problem
    stays the one reported. ``memory_fraction`` (default 1) is the share of each device's
    memory a plan may use (``Cluster.with_memory_fraction``): the simulator counts allocated
    bytes, and frameworks reserve more (``docs/hybrid.md``, "Memory headroom").
    """

    name: str = MISSING
    env_id: str = "placement_env/Sweep-v0"
    model: str | None = None
    model_config: dict[str, Any] = field(default_factory=dict)
    graph_file: str | None = None
    max_groups: int | None = 256
    cluster: str = "dgx1_v100_8"
    memory_fraction: float = 1.0
    microbatches: int = 8
    schedule: str = "1f1b"
    objective: str = "makespan"
    oracle: str = "simulator"
    oracle_options: dict[str, Any] = field(default_factory=dict)
    generator: str = "fixed"
    generator_options: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    policy: str = "placeto"
    baselines: list[str] = field(default_factory=lambda: list(DEFAULT_BASELINES))
    baseline_budget: int | None = 200


@dataclass
class PPOConfig:
    """Keyword arguments passed to ``agents.make_ppo`` (``None`` = its default)."""

    learning_rate: float | None = None
    n_steps: int | None = None
    batch_size: int | None = None
    n_epochs: int | None = None
    gamma: float | None = None
    ent_coef: float | None = None
    n_envs: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentConfig:
    """What searches for the plan: a PPO policy (``kind: ppo``), chain fine-tuning of a
    pretrained per-unit policy (``kind: finetune``, :func:`agents.finetune.chain_finetune`)
    or a baseline (``kind: baseline``).

    ``policy`` names an ``agents.policies`` network; ``auto`` takes the env's ``policy``.
    ``baseline`` names an ``agents.baselines`` algorithm; ``budget`` is its number of
    oracle calls (``None`` = the algorithm's default) and ``options`` its extra keywords.
    ``warm_start`` (PPO on a fixed problem): every episode starts from the best baseline's
    plan, so the policy refines the reference (Placeto-style) instead of starting from a
    random placement; ``result.json`` names the plan it started from.
    ``warm_search`` (with ``warm_start`` on ``Sweep-v0``): run the refinement as a local
    search with the policy as the proposal, as ``scripts/bench_quality.py`` does: a move
    that makes the plan worse is undone (``accept="improve"``), each episode restarts from
    the best plan so far (``restart="best"``) and the policy's keep logit starts at
    ``keep_prob=0.5``. Values already set in ``env.env_kwargs`` / ``agent.ppo.extra`` win.
    ``init_policy`` (PPO): a policy file or ``generalist`` (the shipped pretrained policy)
    whose network starts the training instead of random weights (fine-tuning); for
    ``kind: finetune`` the policy fine-tuned (default ``generalist``), ``budget`` its oracle
    calls (default 4096, the zero-shot plan's included) and ``options`` the keywords of
    ``chain_finetune`` (``samples``, ``elite``, ``updates``, ``lr``, ...).
    """

    name: str = MISSING
    kind: str = "ppo"
    policy: str = "auto"
    ppo: PPOConfig = field(default_factory=PPOConfig)
    baseline: str | None = None
    budget: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    warm_start: bool = True
    warm_search: bool = True
    init_policy: str | None = None


@dataclass
class LoggerConfig:
    """Where metrics go: ``wandb`` (offline unless ``mode``/``$WANDB_MODE`` say otherwise),
    ``tensorboard`` or ``none``."""

    kind: str = "none"
    project: str = "devplace"
    entity: str | None = None
    mode: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    log_every: int = 1


@dataclass
class TrainBudget:
    """How long the agent searches and how often it checkpoints.

    ``timesteps`` env steps at most, ``seconds`` of wall time at most (``None`` = no
    limit); ``checkpoint_every`` PPO updates between checkpoints (0 = never).
    ``crash_after_updates`` raises after that many updates: a test hook that simulates
    a killed run.
    """

    timesteps: int = 20_000
    seconds: float | None = 600.0
    checkpoint_every: int = 5
    progress: bool = True
    crash_after_updates: int | None = None


@dataclass
class TrainConfig:
    """``python -m runners.train``: one env, one agent, one seed.

    ``torch_threads``: torch intra-op threads (1 by default: on small CPU machines the
    policy's tiny matmuls lose more to thread contention than they gain; ``null`` keeps
    torch's default).
    """

    env: EnvConfig = MISSING
    agent: AgentConfig = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    train: TrainBudget = field(default_factory=TrainBudget)
    seed: int = 0
    torch_threads: int | None = 1
    resume: str | None = None
    run_baselines: bool = True
    output_dir: str | None = None


@dataclass
class EvaluateConfig:
    """``python -m runners.evaluate``: every env x agent x seed, to a table and a chart."""

    envs: list[str] = field(default_factory=lambda: ["rnnlm_k40_2", "nmt_k40_2"])
    agents: list[str] = field(default_factory=lambda: ["placeto", "expert", "metis", "single"])
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: list[str] = field(default_factory=list)
    train: TrainBudget = field(default_factory=lambda: TrainBudget(timesteps=2048, seconds=120.0))
    runs: list[str] | None = None  # compare these run/sweep folders instead (None: train)
    output_dir: str | None = None


@dataclass
class PlanConfig:
    """``python -m runners.plan``: zero-shot planning with an exported policy.

    ``logger``: where the result goes besides result.json (``none`` by default; ``wandb``
    offline or ``tensorboard`` for sweeps compared on a dashboard)."""

    policy: str = "generalist"
    env: EnvConfig = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    greedy: bool = True
    samples: int | None = None  # None: the policy's default (agents.export.DEFAULT_SAMPLES)
    temperature: float | None = None  # None: the policy's (agents.decoding.DEFAULT_TEMPERATURE)
    link_exponent: float | None = None  # None: the policy's (agents.decoding.DEFAULT_LINK_EXPONENT)
    seed: int = 0
    progress: bool = True  # a progress bar over the placements scored (stderr)
    output_dir: str | None = None


@dataclass
class ExecuteConfig:
    """``python -m runners.execute plan=PATH``: run a plan, one process per device
    (``conf/execute``)."""

    plan: str = MISSING
    graph: str | None = None
    cluster: str | None = None
    steps: int = 5
    warmup: int = 2
    seed: int = 0
    backend: str | None = None
    threads: int = 1
    optimizer: str | None = None
    timeout_s: float = 600.0
    rehearse: bool = False
    launcher: str = "local"
    output_dir: str | None = None


@dataclass
class ProfileRuntime:
    """``runtime:`` of ``conf/profile.yaml``."""

    model: Any = None
    devices: Any = None
    microbatches: Any = 4
    rounds: Any = 6
    steps: Any = 5
    fix_overhead: Any = True


@dataclass
class ProfileHybrid:
    """``hybrid:`` of ``conf/profile.yaml``."""

    model: Any = None
    tps: Any = None
    micro_sizes: Any = None
    recomputes: Any = None
    worlds: Any = None
    probe_worlds: Any = None
    probe_steps: Any = 5
    probe_launches: Any = 2
    repeats: Any = 3


@dataclass
class ProfileConfig:
    """``python -m runners.profile``: the keys of ``conf/profile.yaml`` (command-line keys are
    checked against it; the values by ``runners.profile.check_config``)."""

    model: Any = None
    threads: Any = 1
    matmul_n: Any = 512
    copy_mb: Any = 64
    p2p_repeats: Any = 10
    concurrency: Any = None
    memory_gib: Any = 4
    runtime: ProfileRuntime = field(default_factory=ProfileRuntime)
    hybrid: ProfileHybrid = field(default_factory=ProfileHybrid)
    calibration: Any = None
    output_dir: Any = None


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _path(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "a path"


#: Config groups whose choice is a file under conf/GROUP/ (not a key of the schema).
GROUPS: tuple[str, ...] = ("env", "agent", "logger", "experiment")


def register() -> None:
    """Store the schemas in hydra's ConfigStore (idempotent).

    Primary configs extend ``schema/train`` etc.; group files extend ``schema/env``,
    ``schema/agent`` and ``schema/logger`` with ``- /schema/env@_here_`` in their
    defaults list, so a misspelt key fails at composition.
    """
    cs = ConfigStore.instance()
    cs.store(group="schema", name="train", node=TrainConfig)
    cs.store(group="schema", name="evaluate", node=EvaluateConfig)
    cs.store(group="schema", name="plan", node=PlanConfig)
    cs.store(group="schema", name="env", node=EnvConfig)
    cs.store(group="schema", name="agent", node=AgentConfig)
    cs.store(group="schema", name="logger", node=LoggerConfig)


def _field_types(cls: type) -> dict[str, Any]:
    import typing

    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _free_form(tp: Any) -> bool:
    """True for ``dict[...]`` / ``Any`` fields, under which any key is allowed."""
    import typing

    origin = typing.get_origin(tp)
    return tp is Any or origin is dict or tp is dict


def _walk(schema: type, dotted: str) -> Iterator[tuple[int, type, str, dict[str, Any]]]:
    """The steps of the dotted key down ``schema``: ``(index, dataclass, part, its field
    types)`` for each part while the level is a dataclass, the last one the first part that
    is not a field (if any). The one walk of :func:`check_key`, :func:`_rule_of` and
    :func:`_under_free_form`."""
    import typing

    cls: Any = schema
    for i, part in enumerate(dotted.split(".")):
        if not dataclasses.is_dataclass(cls):
            return
        types = _field_types(cls)
        yield i, cls, part, types
        if part not in types:
            return
        args = [a for a in typing.get_args(types[part]) if a is not type(None)]
        cls = args[0] if args and dataclasses.is_dataclass(args[0]) else types[part]


def check_key(schema: type, dotted: str) -> None:
    """Raise ``ValueError`` unless ``dotted`` (``train.seconds``) is a key of ``schema``.

    The message names the valid keys at the level where the path went wrong.
    """
    parts = dotted.split(".")
    for i, cls, part, types in _walk(schema, dotted):
        if part not in types:
            where = ".".join(parts[:i]) or "the top level"
            raise ValueError(
                f"unknown config key {dotted!r}: {part!r} is not a key of {where} "
                f"({cls.__name__}); valid keys: {sorted(types)}"
            )
        if _free_form(types[part]):
            return


def check_overrides(schema: type, overrides: list[str]) -> None:
    """Validate the keys of command-line ``overrides`` against ``schema`` before hydra runs.

    Group choices (``+env=...``, ``agent=...``: :func:`check_group_choices`), ``hydra.*``
    keys and flags (``-m``) are left out.
    """
    fields = {f.name for f in dataclasses.fields(schema)}
    for ov in _parsed(overrides):
        key = ov.key_or_group
        if key in GROUPS and key != "experiment" and key not in fields and not ov.is_delete():
            # logger=none to runners.evaluate, agent=metis to runners.plan: hydra's several
            # lines ("Could not override 'logger'. No match in the defaults list"), status 1
            raise ValueError(
                f"{ov.input_line!r}: this runner ({schema.__name__}) has no {key!r} config "
                f"group; its keys: {sorted(fields)}"
            )
        if key in GROUPS or key.startswith("hydra") or ov.is_delete():
            continue
        if "/" in key or "@" in key:
            continue
        check_key(schema, key)


# ----------------------------------------------------------------- value checks
def _int(lo: int, hi: int | None = None, none: bool = False) -> Callable[[Any], str | None]:
    """A rule: an integer (not a boolean) in ``[lo, hi]`` (or null when ``none``)."""
    what = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    what += " or null" if none else ""

    def rule(v: Any) -> str | None:
        if v is None and none:
            return None
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
        return None if ok else what

    return rule


def _num(
    lo: float, *, open_: bool = True, hi: float | None = None, none: bool = False
) -> Callable[[Any], str | None]:
    """A rule: a finite number (not a boolean) above ``lo`` (at or above unless ``open_``)."""
    what = f"a finite number {'>' if open_ else '>='} {lo:g}" + (
        f" and <= {hi:g}" if hi is not None else ""
    )
    what += " or null" if none else ""

    def rule(v: Any) -> str | None:
        if v is None and none:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v > lo if open_ else v >= lo) and (hi is None or v <= hi)
        return None if ok else what

    return rule


def _one_of(*choices: str, none: bool = False) -> Callable[[Any], str | None]:
    """A rule: one of ``choices`` (or null when ``none``)."""
    what = f"one of {list(choices)}" + (" or null" if none else "")
    return lambda v: None if v in choices or (none and v is None) else what


def _ints(lo: int) -> Callable[[Any], str | None]:
    item = _int(lo)
    return lambda v: (
        None
        if isinstance(v, (list, tuple)) and v and all(item(x) is None for x in v)
        else f"a non-empty list of integers >= {lo}"
    )


_SEED = _int(0, 2**32 - 1)
#: The valid values of each config field the code does not take verbatim.
RULES: dict[tuple[type, str], Callable[[Any], str | None]] = {
    (EnvConfig, "max_groups"): _int(1, none=True),
    (EnvConfig, "memory_fraction"): _num(0, hi=1),
    (EnvConfig, "microbatches"): _int(1, 2**20),
    (EnvConfig, "schedule"): _one_of("gpipe", "1f1b", "interleaved", "in_order"),
    (EnvConfig, "objective"): _one_of("makespan", "max_load"),
    (EnvConfig, "oracle"): _one_of("simulator", "profiled"),
    (EnvConfig, "baseline_budget"): _int(1, none=True),
    (PPOConfig, "learning_rate"): _num(0, none=True),
    (PPOConfig, "n_steps"): _int(1, none=True),
    (PPOConfig, "batch_size"): _int(1, none=True),
    (PPOConfig, "n_epochs"): _int(1, none=True),
    (PPOConfig, "gamma"): _num(0, open_=False, hi=1, none=True),
    (PPOConfig, "ent_coef"): _num(0, open_=False, none=True),
    (PPOConfig, "n_envs"): _int(1, none=True),
    (AgentConfig, "kind"): _one_of("ppo", "finetune", "baseline"),
    (AgentConfig, "budget"): _int(1, none=True),
    (LoggerConfig, "kind"): _one_of("wandb", "tensorboard", "none"),
    (LoggerConfig, "log_every"): _int(1),
    (LoggerConfig, "mode"): _one_of("online", "offline", "disabled", none=True),
    (TrainBudget, "timesteps"): _int(1),
    (TrainBudget, "seconds"): _num(0, none=True),
    (TrainBudget, "checkpoint_every"): _int(0),
    (TrainBudget, "crash_after_updates"): _int(0, none=True),
    (TrainConfig, "seed"): _SEED,
    (TrainConfig, "torch_threads"): _int(1, 4096, none=True),
    (EvaluateConfig, "seeds"): _ints(0),
    (PlanConfig, "samples"): _int(1, 2**20, none=True),
    (PlanConfig, "temperature"): _num(0, none=True),
    (PlanConfig, "link_exponent"): _num(0, open_=False, none=True),
    (PlanConfig, "seed"): _SEED,
    (ExecuteConfig, "plan"): _path,
    (ExecuteConfig, "steps"): _int(1),
    (ExecuteConfig, "warmup"): _int(0),
    (ExecuteConfig, "seed"): _SEED,
    (ExecuteConfig, "backend"): _one_of("gloo", "nccl", none=True),
    (ExecuteConfig, "threads"): _int(1, 4096),
    (ExecuteConfig, "optimizer"): _one_of("sgd", "adam", none=True),
    (ExecuteConfig, "timeout_s"): _num(0),
    (ExecuteConfig, "rehearse"): _bool,
    (ExecuteConfig, "launcher"): _one_of("local", "torchrun"),
}


def _rule_of(schema: type, dotted: str) -> Callable[[Any], str | None] | None:
    """The rule of the field at ``dotted`` below ``schema`` (None if it has none)."""
    import typing

    last = len(dotted.split(".")) - 1
    for i, cls, part, types in _walk(schema, dotted):
        if part not in types:
            return None
        if i == last:
            rule = RULES.get((cls, part))
            if rule is None and types[part] in (bool, "bool"):  # hydra's own refusal of a
                # non-boolean printed several lines and no `error:` line (found by fuzzing)
                return _boolean
            if rule is None and _is_list(types[part]):  # runs=DIR, env.baselines=metis: the
                # same several lines of hydra's and exit status 1 (2 Dec 2026)
                return _a_list(optional=type(None) in typing.get_args(types[part]))
            return rule
    return None


def _is_list(tp: Any) -> bool:
    """True for ``list[...]`` fields (also ``list[...] | None``)."""
    import typing

    if typing.get_origin(tp) is list or tp is list:
        return True
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return len(args) == 1 and (typing.get_origin(args[0]) is list or args[0] is list)


def _a_list(optional: bool) -> Callable[[Any], str | None]:
    """A rule: a list (hydra's ``[a, b]``), or null when ``optional``; the items are
    checked by the schema (hydra) or by the field's own rule."""

    def rule(v: Any) -> str | None:
        if isinstance(v, (list, tuple)) or (v is None and optional):
            return None
        return f"a list in brackets, e.g. [{v}]" + (" (or null)" if optional else "")

    return rule


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def check_value(schema: type, dotted: str, value: Any, where: str = "config key") -> None:
    """Raise ``ValueError`` naming ``dotted`` and ``value`` when the value is out of range."""
    rule = _rule_of(schema, dotted)
    expected = None if rule is None else rule(value)
    if expected is not None:
        raise ValueError(f"{where} {dotted!r} is {value!r}; expected {expected}")


def check_values(schema: type, cfg: Any) -> None:
    """Check every value of a composed config (a ``DictConfig`` or mapping) against
    :data:`RULES`; ``ValueError`` naming the first bad key and its value."""
    from omegaconf import DictConfig, OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for k, v in node.items():
            key = f"{prefix}{k}"
            check_value(schema, key, v)
            walk(v, key + ".")

    walk(plain, "")


def _resume_dir_overrides(schema: type, argv: list[str]) -> list[str]:
    """For ``resume=DIR``: hydra logs into DIR instead of making a new, empty
    ``outputs/.../DATE/TIME`` folder (unless the command line sets ``hydra.run.dir``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if "resume" not in {f.name for f in dataclasses.fields(schema)}:
        return []
    candidates = [o for o in argv if "=" in o and not o.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(candidates)
    except OverrideParseException:
        return []
    keys = {ov.key_or_group: ov for ov in parsed}
    resume = keys.get("resume")
    if resume is None:
        return []
    value = resume.value()
    if isinstance(value, str) and value and "env" not in keys:
        # no env group on the command line: hydra failed on `env.*` overrides in several
        # lines ("Missing mandatory value: env") before train() could name them
        envs = [k for k in keys if k.startswith("env.")]
        if envs:
            raise ValueError(
                f"resume={value} continues the run as saved in its config.yaml; env keys "
                f"cannot be changed on resume: {sorted(envs)}; to change the run, start a new "
                "one (output_dir=...)"
            )
    if "hydra.run.dir" in keys or any(a in ("-m", "--multirun") for a in argv):
        return []
    if not isinstance(value, str) or not value:
        return []
    folder = value
    if "${" in value:  # resume=${oc.env:HOME}/runs/a was looked for as that text (3 Dec 2026)
        from omegaconf import OmegaConf

        try:
            folder = str(OmegaConf.create({"resume": value}).resume)
        except Exception as exc:  # noqa: BLE001 - omegaconf's resolution errors, named here
            why = " ".join(str(exc).split("\n")[0].split())
            raise ValueError(f"resume={value}: cannot resolve it ({why})") from None
    if not Path(folder).expanduser().is_dir():  # hydra would create the mistyped folder
        shown = value if folder == value else f"{value} ({folder})"
        raise ValueError(f"resume={shown}: no such run folder (a runners.train output_dir)")
    # quoted as hydra reads it back: doubling every backslash made resume=a\b log into a
    # sibling folder a\\b (fuzzing, 2 Dec 2026); interpolations stay, as in resume= itself
    quoted = hydra_quoted(value, literal=False)
    return [f"hydra.run.dir={quoted}", "hydra.output_subdir=null"]


def saved_train_config(run_dir: Path) -> Any:
    """The ``config.yaml`` a ``runners.train`` run saved in ``run_dir``, checked against
    :class:`TrainConfig`; a ``ValueError`` naming the file when it is not one (broken YAML, an
    empty file or a foreign key raised a traceback or named no file)."""
    from omegaconf import OmegaConf

    from runners.common import first_line  # runners.common imports this module

    saved = Path(run_dir) / "config.yaml"
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(saved))
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception as exc:  # noqa: BLE001 - yaml's and omegaconf's errors, named below
        raise ValueError(
            f"resume={run_dir}: {saved} is not the config of a runners.train run "
            f"({type(exc).__name__}: {first_line(exc)})"
        ) from None
    return cfg


def is_train_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a ``runners.train`` run's ``config.yaml``, in place or set
    aside in ``.earlier_run/`` by a command stopped before its first checkpoint (put back by
    the next ``runners.train`` command). ``resume=`` of any other folder leaves it as it is:
    no lock file, ``error.txt`` or ``train.log`` (3 Dec 2026)."""
    from runners.earlier_run import EARLIER_RUN

    for where in (Path(folder), Path(folder) / EARLIER_RUN):
        if (where / "config.yaml").is_file():
            try:
                saved_train_config(where)
            except ValueError:
                continue
            return True
    return False


def hydra_quoted(value: str, *, literal: bool = True, quote: str = "'") -> str:
    """``value`` as a hydra string in ``quote`` that hydra and OmegaConf read back as
    ``value``: the quote escaped, a run of backslashes doubled before it or the end (hydra
    halves those, and keeps every other backslash); with ``literal``, ``${`` escaped too, so
    that it is not an interpolation."""
    import re

    s = re.sub(rf"(\\*){quote}", lambda m: m.group(1) * 2 + "\\" + quote, value)
    s = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, s)
    if literal:
        s = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", s)
    return f"{quote}{s}{quote}"


def check_override_syntax(overrides: list[str]) -> None:
    """One line naming a command-line override hydra's grammar cannot parse (it was
    hydra's several lines and exit status 1): ``overrides=[env.x=1]`` needs quotes inside the
    list, ``key=[a`` a closing bracket."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in overrides:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as exc:
            why = " ".join(str(exc).split("\n")[0].split())
            hint = ""
            if "=" in value and value.startswith("["):
                hint = f"; a value holding '=' must be quoted, e.g. {key}=['...']"
            elif not value.startswith(("[", "{")):
                hint = f"; {_quote_hint(key, value)}"
            raise ValueError(f"cannot parse override '{arg}': {why}{hint}") from None


def check_sweep_needs_multirun(overrides: list[str]) -> None:
    """A comma-separated value without ``--multirun`` (``agent=expert,metis``, a path with a
    comma) was hydra's several lines ("Ambiguous value for argument"), exit status 1
    (2 Dec 2026): one line naming both ways out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(a in ("-m", "--multirun") for a in overrides):
        return
    parser = OverridesParser.create()
    for arg in overrides:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        (ov,) = parser.parse_overrides([arg])  # check_override_syntax parsed it already
        if ov.is_sweep_override() and "," in value:
            values = getattr(ov.value(), "list", None)
            n = f"{len(values)} values" if isinstance(values, list) else "several values"
            numbers = isinstance(values, list) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
            )
            one = ov.key_or_group.lstrip("+~") in GROUPS or numbers  # no one string is meant
            raise ValueError(
                f"'{arg}' is a sweep over {n} (the commas): add --multirun (-m) to run "
                + ("each" if one else f"each, or {_quote_hint(key, value)}")
            )


def _quote_hint(key: str, value: str) -> str:
    """How to give ``value`` as one string: quoted for hydra (:func:`hydra_quoted`), then
    for the shell (``shlex.quote``). Both quote kinds, a trailing backslash and ``${`` gave
    hints that failed when pasted (fuzzing, 2 Dec 2026)."""
    import shlex

    arg = key + "=" + hydra_quoted(value, quote='"')
    typed = f"'{arg}'" if "'" not in arg else shlex.quote(f"{key}={hydra_quoted(value)}")
    return (
        "to give it as one string (hydra reads = , ( ) [ ] { } ~ and quotes as syntax), "
        f"quote it for hydra inside the shell's quotes: {typed}"
    )


def _parsed(overrides: list[str]) -> list[Any]:
    """hydra's parse of the ``key=value`` command-line overrides; ``[]`` on a syntax error,
    which hydra then reports itself."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    candidates = [o for o in overrides if "=" in o and not o.startswith("-")]
    try:
        return list(OverridesParser.create().parse_overrides(candidates))
    except OverrideParseException:
        return []


def check_override_values(schema: type, overrides: list[str]) -> None:
    """Check the values of command-line ``overrides`` against :data:`RULES` (before hydra)."""
    parsed = _parsed(overrides)
    for ov in parsed:
        if ov.is_delete() or ov.is_sweep_override():
            continue
        try:
            value = ov.value()
        except Exception:  # noqa: BLE001 - interpolations etc.: hydra resolves and checks them
            continue
        check_value(schema, ov.key_or_group, value, where=f"override {ov.input_line!r}: key")


def check_group_choices(overrides: list[str]) -> None:
    """``agent=nosuch``, ``+env=nosuch``, ``logger=foo``: one line listing the choices (it was
    hydra's several-line message and exit status 1)."""
    conf = Path(__file__).resolve().parent.parent / "conf"
    parsed = _parsed(overrides)
    for ov in parsed:
        group = ov.key_or_group
        if group not in GROUPS or ov.is_delete():
            continue
        try:
            values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
        except Exception:  # noqa: BLE001 - range/interval sweeps: hydra reports them
            continue
        choices = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        bad = [v for v in values if not isinstance(v, str) or v not in choices]
        if bad:
            raise ValueError(
                f"{ov.input_line!r}: {bad[0]!r} is not one of the {group} choices {choices}"
            )


def check_experiment_fits(schema: type, overrides: list[str]) -> None:
    """``+experiment=NAME`` files are written for one runner (``eval_mirhoseini`` sets the
    suite of ``runners.evaluate``, ``generalist`` a ``runners.train`` run): given to another
    runner they ended in hydra's several-line message. One line naming the key instead."""
    import yaml

    conf = Path(__file__).resolve().parent.parent / "conf" / "experiment"
    fields = {f.name for f in dataclasses.fields(schema)}
    for ov in _parsed(overrides):
        if ov.key_or_group != "experiment" or ov.is_delete() or ov.is_sweep_override():
            continue
        path = conf / f"{ov.value()}.yaml"
        if not path.is_file():
            continue  # check_group_choices names it
        data = yaml.safe_load(path.read_text()) or {}
        groups = []
        for item in data.get("defaults") or []:
            if isinstance(item, dict):
                groups += [k.split()[-1].strip("/").split("@")[0] for k in item]
        keys = sorted({*(k for k in data if k != "defaults"), *groups} - fields)
        if keys:
            raise ValueError(
                f"{ov.input_line!r}: experiment {ov.value()!r} sets {keys}, which "
                f"{schema.__name__} has no keys for: it is written for another runner (its "
                f"first lines say which)"
            )


def check_multirun_output_dir(argv: list[str]) -> None:
    """With ``-m`` every job wrote into the one ``output_dir`` (the last job's files won).
    ``output_dir=X hydra.run.dir=Y`` wrote the run into ``X`` and hydra's files (and the
    folder's lock) into ``Y`` (fuzzing, 2 Dec 2026): refused unless they name one folder."""
    given = {
        key: a.split("=", 1)[1]
        for a in argv
        for key in ("output_dir", "hydra.run.dir")
        if a.lstrip("+").startswith(key + "=")
    }
    if len(given) == 2 and given["output_dir"] not in ("", "null"):
        same = Path(given["output_dir"]).expanduser().resolve()
        if same != Path(given["hydra.run.dir"]).expanduser().resolve():
            raise ValueError(
                f"output_dir={given['output_dir']} and hydra.run.dir={given['hydra.run.dir']} "
                "name two folders: the run would go to output_dir and hydra's files to the "
                "other; give one of them"
            )
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    if any(a.lstrip("+").startswith("output_dir=") for a in argv):
        raise ValueError(
            "output_dir= with -m (a sweep) would put every job into one folder, each "
            "overwriting the last; leave it out (the jobs go to hydra.sweep.dir/N, "
            "multirun/... by default) or set hydra.sweep.dir=DIR"
        )


#: The runners that write ``result.json`` into their run folder, by their schema.
RESULT_WRITERS = {"TrainConfig": "train", "PlanConfig": "plan", "ExecuteConfig": "execute"}
#: The files that tell whose run folder a folder is: a runners.evaluate cell (a train run
#: without train.log) and an evaluate folder were not recognised (fuzzing, 2 Dec 2026).
RUN_FOLDER_FILES = {
    "train": ("train.log", "run_info.json"),
    "plan": ("plan.log",),
    "execute": ("execute.log",),
    "evaluate": ("evaluate.log", "results.md"),
}


def check_output_dir(schema: type, argv: list[str]) -> None:
    """``output_dir=`` naming a file ended in hydra's ``FileExistsError`` traceback; naming
    another runner's run folder (a ``runners.plan`` run's, say) had its ``result.json``
    replaced by this runner's without a word (found by fuzzing, 29 Nov 2026)."""
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("output_dir=")]
    if not given or given[-1] in ("", "null"):
        return
    path = Path(given[-1]).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_dir={given[-1]} is a file; give a folder (made if missing)")
    _check_creatable(path, given[-1])
    from runners.earlier_run import EARLIER_RUN

    if schema.__name__ != "TrainConfig" and (path / EARLIER_RUN).exists():
        # runners.plan there wrote a result.json, and the next runners.train command then
        # took the folder for the killed run's and deleted the earlier run (fuzzing, 3 Dec 2026)
        from runners import folder_lock

        holder = folder_lock.holder(path)
        if holder is not None:  # a new run going on there, not a stopped one
            raise ValueError(f"output_dir={given[-1]} is in use by {holder}; give another folder")
        raise ValueError(
            f"output_dir={given[-1]} holds a runners.train run set aside in .earlier_run/ by "
            "a command stopped before its first checkpoint (kill -9?); the next runners.train "
            f"command there puts it back first (python -m runners.train resume={given[-1]} "
            "continues that run, or says it finished); give another folder"
        )
    app = RESULT_WRITERS.get(schema.__name__)
    results = [f for f in ("result.json", "results.md") if (path / f).is_file()]
    if app is None or not results:
        return
    held = {a: [f for f in files if (path / f).is_file()] for a, files in RUN_FOLDER_FILES.items()}
    other = [a for a in held if a != app and held[a]]
    if other and not held.get(app):
        raise ValueError(
            f"output_dir={given[-1]} is a runners.{other[0]} run folder "
            f"({', '.join(held[other[0]] + results)}): runners.{app} would replace its files; "
            "give another folder"
        )


def _check_creatable(path: Path, given: str) -> None:
    """``ValueError`` unless folder ``path`` exists writable or can be made: a path under a
    file, a read-only place, a dangling or looping symlink ended in hydra's traceback, exit
    status 1 (fuzzing, 2 Dec 2026)."""
    import os

    try:
        if path.is_symlink() and not path.exists():
            raise ValueError(f"output_dir={given} is a symlink to nothing ({os.readlink(path)})")
    except OSError as exc:  # a symlink loop
        raise ValueError(f"output_dir={given} cannot be used ({exc.strerror})") from None
    at = path if path.is_dir() else next((p for p in path.parents if p.exists()), None)
    if at is None:
        return
    if not at.is_dir():
        raise ValueError(f"output_dir={given} cannot be made: {at} is a file, not a folder")
    if not os.access(at, os.W_OK | os.X_OK):
        raise ValueError(
            f"output_dir={given} cannot be {'written' if at == path else 'made'}: {at} is not "
            "writable; give a folder you can write"
        )


def run_checked(schema: type, hydra_main: Any, argv: list[str] | None = None) -> None:
    """Check the command-line keys and values against ``schema`` (exit 2 naming the key, the
    value and what is valid), then run ``hydra_main``: the shared ``main()`` of every runner.
    With ``resume=DIR`` hydra's own files go to DIR rather than a new run folder."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        check_override_syntax(args)
        check_multirun_output_dir(args)
        check_output_dir(schema, args)
        check_group_choices(args)
        check_sweep_needs_multirun(args)
        check_experiment_fits(schema, args)
        check_overrides(schema, args)
        check_override_values(schema, args)
        extra = _resume_dir_overrides(schema, args)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None
    if extra and argv is None:
        sys.argv[:] = with_overrides_beside_resume(sys.argv, extra)
    if argv is None:
        sys.argv[1:] = free_form_overrides(schema, sys.argv[1:])
    if argv is None:  # a command-line run (not a test calling with argv)
        from runners.common import exit_on_sigterm

        exit_on_sigterm()
    from runners.common import Terminated, interrupted

    try:
        hydra_main()
    except (Terminated, KeyboardInterrupt) as exc:
        # before the runner's own handler: SIGTERM or Ctrl-C while hydra composes the config
        # was a Terminated / KeyboardInterrupt traceback, exit 1 (fuzzing, 3 Dec 2026)
        interrupted(exc, None, schema.__name__.removesuffix("Config").lower())


def _under_free_form(schema: type, dotted: str) -> bool:
    """True when ``dotted`` is a free-form field of ``schema`` (``env.model_config``,
    ``agent.options``, ``env.env_kwargs``: ``dict`` / ``Any``) or a key inside one."""
    import typing

    for _, _, part, types in _walk(schema, dotted):
        if part not in types:
            return False
        tp = types[part]
        if _free_form(tp) or any(_free_form(a) for a in typing.get_args(tp)):
            return True
    return False


def free_form_overrides(schema: type, argv: list[str]) -> list[str]:
    """``argv`` with each plain override of a key in a free-form field written ``++KEY=V``
    (add or override). Plain ``env.model_config.n_layer=1`` or ``agent.options.t0=0.5``
    failed in hydra's several lines ("Key 'n_layer' is not in struct ... use +") whenever the
    env or agent file did not already set that key, and worked when it did; the key is
    checked where it is used (the model's own keys, :func:`common.check_baseline_options`,
    ...), so a misspelt one is still named."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    out = []
    parser = OverridesParser.create()
    for arg in argv:
        if "=" in arg and not arg.startswith(("-", "+", "~")):
            try:
                (ov,) = parser.parse_overrides([arg])
            except (OverrideParseException, ValueError):
                ov = None
            key = None if ov is None else ov.key_or_group
            if key and key not in GROUPS and "/" not in key and "@" not in key:
                if _under_free_form(schema, key):
                    arg = "++" + arg
        out.append(arg)
    return out


def with_overrides_beside_resume(argv: list[str], extra: list[str]) -> list[str]:
    """``argv`` with ``extra`` overrides right after its ``resume=...`` argument: hydra's
    argument parser takes the overrides as one run of positional arguments, so appended
    after a flag (``... resume=DIR --cfg job``) they were refused as unrecognized."""
    at = next((i for i, a in enumerate(argv) if a.lstrip("+").startswith("resume=")), len(argv) - 1)
    return [*argv[: at + 1], *extra, *argv[at + 1 :]]
