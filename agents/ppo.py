"""PPO training glue: vectorised placement envs and a (Maskable)PPO with a graph policy."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.utils import is_masking_supported
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from agents import policies
from graphs.schema import is_whole

#: PPO settings for small CPU machines (2 cores): short rollouts, few epochs, small nets.
#: ``gamma = 1``: placement episodes are short and their rewards telescope to the
#: improvement of the final placement, which should not be discounted.
PPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 3e-4,
    "n_steps": 128,
    "batch_size": 64,
    "n_epochs": 4,
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "device": "cpu",
}
#: Network defaults (see :class:`agents.policies.base.PlacementNet` and subclasses).
NET_DEFAULTS: dict[str, Any] = {"hidden": 64}
VEC_ENVS: dict[str, type[VecEnv]] = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}

EnvLike = gym.Env | VecEnv | str | Callable[[], gym.Env]


def quiet_logger(model: Any) -> Any:
    """Give ``model`` SB3's logger without its temporary folder: an SB3 model with neither a
    logger of its own nor ``tensorboard_log`` makes an empty ``$TMPDIR/SB3-<date>`` folder on
    every ``learn()`` (``stable_baselines3.common.logger.configure``), and nothing is ever
    written there. Prints SB3's table to stdout when ``model.verbose >= 1``, as SB3 does; a
    model with ``tensorboard_log`` keeps SB3's own logger (it writes into that folder).
    Returns ``model``. Call it again after ``load()``, which drops a custom logger."""
    if getattr(model, "tensorboard_log", None) is None:
        from stable_baselines3.common.logger import HumanOutputFormat, Logger

        formats = [HumanOutputFormat(sys.stdout)] if int(model.verbose or 0) >= 1 else []
        model.set_logger(Logger(folder=None, output_formats=formats))
    return model


def make_vec_env(
    env: EnvLike,
    *,
    n_envs: int = 2,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    vec_env: str = "dummy",
) -> VecEnv:
    """A ``VecEnv`` of monitored envs for rollouts.

    Args:
        env: a ``VecEnv`` (returned as is), an env id such as
            ``"placement_env/Sweep-v0"`` (made ``n_envs`` times with ``env_kwargs``),
            a zero-argument env factory (called ``n_envs`` times) or one env
            instance (wrapped alone: ``n_envs`` is ignored, an instance cannot be copied).
        n_envs: parallel envs (default 2, this project's CPU budget).
        seed: envs are seeded ``seed, seed + 1, ...``.
        env_kwargs: keyword arguments of ``gym.make`` for an env id.
        vec_env: ``"dummy"`` (in process, the default: cheapest with a fast oracle)
            or ``"subproc"`` (one process per env, for slow oracles).
    """
    if not is_whole(n_envs, 1):  # "2" was a TypeError from a comparison (fuzzing)
        raise ValueError(f"n_envs must be an integer >= 1, got {n_envs!r}")
    if env_kwargs and isinstance(env, (VecEnv, gym.Env)):
        # they were ignored without a word (fuzzing, 2 Dec 2026)
        raise ValueError(
            f"env_kwargs apply to an env id only, not to an env instance or VecEnv "
            f"({type(env).__name__}); build the env with them"
        )
    if isinstance(env, VecEnv):
        return env
    if vec_env not in VEC_ENVS:
        raise ValueError(f"vec_env {vec_env!r} is unknown; expected one of {sorted(VEC_ENVS)}")
    if isinstance(env, gym.Env):
        instance = env
        fns: list[Callable[[], gym.Env]] = [lambda: Monitor(instance)]
        cls: type[VecEnv] = DummyVecEnv
    else:
        if isinstance(env, str):
            env_id, kw = env, dict(env_kwargs or {})

            def factory() -> gym.Env:
                return gym.make(env_id, **kw)
        elif callable(env):
            if env_kwargs:
                raise ValueError("env_kwargs apply to an env id only, not to an env factory")
            factory = env
        else:
            raise TypeError(
                f"env must be a gym.Env, a VecEnv, an env id or an env factory, got {type(env)}"
            )
        fns = [lambda: Monitor(factory()) for _ in range(n_envs)]
        cls = VEC_ENVS[vec_env]
        if cls is SubprocVecEnv:  # its workers and the runtime's ranks share one fork server
            from runtime.launch import preload_fork_server

            preload_fork_server()
    venv = cls(fns)
    venv.seed(seed)
    return venv


def make_ppo(
    env: EnvLike,
    policy: str = "placeto",
    *,
    seed: int = 0,
    n_envs: int = 2,
    env_kwargs: Mapping[str, Any] | None = None,
    vec_env: str = "dummy",
    net_kwargs: Mapping[str, Any] | None = None,
    **ppo_kwargs: Any,
) -> MaskablePPO | PPO:
    """PPO with a graph policy on a placement env: ``MaskablePPO`` when the env has
    ``action_masks()``, else ``PPO``.

    Args:
        env: see :func:`make_vec_env`.
        policy: a name of :func:`agents.policies.names` (``"placeto"`` or ``"gdp"``).
        seed: seeds the envs, torch and numpy.
        n_envs, env_kwargs, vec_env: see :func:`make_vec_env`.
        net_kwargs: network options (``hidden``, ``num_layers``, ...), over :data:`NET_DEFAULTS`.
        **ppo_kwargs: PPO arguments over :data:`PPO_DEFAULTS` (``n_steps``, ``batch_size``,
            ``learning_rate``, ``policy_kwargs``, ``tensorboard_log``, ``verbose``, ...).
            ``batch_size`` is capped at ``n_steps * n_envs``.
    """
    policy_cls = policies.get(policy)
    venv = make_vec_env(env, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs, vec_env=vec_env)
    kw = {**PPO_DEFAULTS, **ppo_kwargs}
    kw["batch_size"] = min(int(kw["batch_size"]), int(kw["n_steps"]) * venv.num_envs)
    policy_kwargs = dict(kw.pop("policy_kwargs", None) or {})
    policy_kwargs["net_kwargs"] = {
        **NET_DEFAULTS,
        **dict(policy_kwargs.get("net_kwargs") or {}),
        **dict(net_kwargs or {}),
    }
    algo: type[MaskablePPO] | type[PPO] = MaskablePPO if is_masking_supported(venv) else PPO
    return quiet_logger(algo(policy_cls, venv, seed=seed, policy_kwargs=policy_kwargs, **kw))


#: PPO settings of ``Hybrid-v0`` (64-step episodes of layout moves): as :data:`PPO_DEFAULTS`
#: but discounted (``gamma = 0.95``), as ``scripts/bench_hybrid_learning.py`` has run it.
HYBRID_PPO_DEFAULTS: dict[str, Any] = {**PPO_DEFAULTS, "gamma": 0.95}


def make_hybrid_ppo(
    env: EnvLike,
    *,
    seed: int = 0,
    n_envs: int = 1,
    env_kwargs: Mapping[str, Any] | None = None,
    vec_env: str = "dummy",
    **ppo_kwargs: Any,
) -> MaskablePPO:
    """``MaskablePPO`` with SB3's ``MultiInputPolicy`` (an MLP over the concatenated ``Dict``
    observation) on ``placement_env/Hybrid-v0``: its observation is a fixed-size layout
    summary, not a graph, so the graph policies of :func:`make_ppo` do not apply.

    Args:
        env, seed, env_kwargs, vec_env: see :func:`make_vec_env`.
        n_envs: parallel envs (default 1: each env builds the problem's layout space).
        **ppo_kwargs: ``MaskablePPO`` arguments over :data:`HYBRID_PPO_DEFAULTS`
            (``net_kwargs``, an option of the graph policies, is refused).
    """
    if "net_kwargs" in ppo_kwargs:
        raise ValueError(
            "make_hybrid_ppo: net_kwargs configure the graph policies; Hybrid-v0 uses SB3's "
            "MultiInputPolicy (size it with policy_kwargs={'net_arch': [...]})"
        )
    venv = make_vec_env(env, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs, vec_env=vec_env)
    if not is_masking_supported(venv):
        raise ValueError("make_hybrid_ppo: the env has no action_masks(); is it Hybrid-v0?")
    kw = {**HYBRID_PPO_DEFAULTS, **ppo_kwargs}
    kw["batch_size"] = min(int(kw["batch_size"]), int(kw["n_steps"]) * venv.num_envs)
    return quiet_logger(MaskablePPO("MultiInputPolicy", venv, seed=seed, **kw))
